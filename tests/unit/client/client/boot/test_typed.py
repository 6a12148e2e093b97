"""The boot package says which of vLLM's objects each function takes: the Protocols of
:mod:`tunecache.engines.vllm.objects` (a worker, its runner, its config, ``EngineArgs``, the
compiled model), ``object`` for what a hook passes through untouched, and no more than five
``typing.Any``. Read from the sources with ``ast``."""

from __future__ import annotations

import ast

from tests.support.paths import ROOT

BOOT = ROOT / "client" / "tunecache" / "client" / "boot"


def _any_names(source: str) -> int:
    return sum(1 for node in ast.walk(ast.parse(source))
               if isinstance(node, ast.Name) and node.id == "Any"
               or isinstance(node, ast.Attribute) and node.attr == "Any")


def test_the_boot_package_has_at_most_five_any():
    counts = {path.name: _any_names(path.read_text()) for path in sorted(BOOT.glob("*.py"))}
    assert sum(counts.values()) <= 5, counts


def test_the_count_sees_any_in_annotations_and_in_typing_attributes():
    assert _any_names("from typing import Any\ndef f(x: Any, *a: typing.Any) -> dict[str, Any]: ...") == 3


def test_the_hooked_worker_methods_take_vllms_worker_by_its_protocol():
    tree = ast.parse((BOOT / "hooks.py").read_text())
    hooked = {node.name: ast.unparse(node.args.args[0].annotation) for node in ast.walk(tree)
              if isinstance(node, ast.FunctionDef) and node.args.args and node.args.args[0].arg in ("self", "worker", "runner")}
    assert hooked["determine_available_memory"] == hooked["compile_or_warm_up_model"] == "GpuWorker"
    assert hooked["flashinfer_autotune"] == "ModelRunner" and hooked["create_engine_config"] == "EngineArgs"
