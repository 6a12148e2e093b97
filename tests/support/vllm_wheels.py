"""A vLLM release's own source, read from its wheel (never imported as a package, never
committed): which releases the contract tests read, where the wheels are kept, a module's text,
a function's source, and pure top-level functions of it executed as they are (what a test builds
"as that release's code does")."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

#: One release of each minor version of the table (its newest patch at the time of writing).
ALL = ["0.25.0", "0.26.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0"]
#: The releases read by default (and in CI): the oldest and the newest.
DEFAULT = [ALL[0], ALL[-1]]


def releases() -> list[str]:
    """The releases the contract tests read: ``TUNECACHE_VLLM_RELEASES`` (comma-separated
    versions, or ``all``: :data:`ALL`), by default :data:`DEFAULT`."""
    asked = os.environ.get("TUNECACHE_VLLM_RELEASES", "").strip()
    if not asked:
        return DEFAULT
    return ALL if asked == "all" else [v.strip() for v in asked.split(",") if v.strip()]


def function_source(source: bytes, name: str) -> str:
    """The source text of the top-level function ``name`` of a module's ``source``."""
    tree = ast.parse(source)
    [node] = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    return ast.get_source_segment(source.decode(), node)


def wheels_dir() -> Path:
    """``TUNECACHE_VLLM_WHEELS``, else ``~/.cache/tunecache-tests/vllm-wheels`` (``~`` expanded)."""
    return Path(os.environ.get("TUNECACHE_VLLM_WHEELS") or "~/.cache/tunecache-tests/vllm-wheels").expanduser()


def wheel_files(wheels: Path, version: str) -> list[Path]:
    """The wheels of vLLM ``version`` in the directory ``wheels`` (none where it is missing), in
    name order: the last is the one read."""
    return sorted(wheels.glob(f"vllm-{version}-*.whl"))


def release_wheel(wheels: Path, version: str) -> zipfile.ZipFile:
    """vLLM ``version``'s wheel in the directory ``wheels``, downloaded there (made where it is
    missing; ``pip download --no-deps``, the Linux x86-64 builds) when it is not yet; the test
    skips, saying why, when the package index cannot give it."""
    found = wheel_files(wheels, version)
    if not found:
        wheels.mkdir(parents=True, exist_ok=True)
        platforms = [arg for n in (28, 31, 35) for arg in ("--platform", f"manylinux_2_{n}_x86_64")]
        result = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                                 "--python-version", "3.12", *platforms, f"vllm=={version}", "-d", str(wheels)],
                                capture_output=True, text=True, timeout=900)
        found = wheel_files(wheels, version)
        if not found:
            pytest.skip(f"no wheel of vllm {version}: {(result.stderr or result.stdout).strip()[-300:]}")
    return zipfile.ZipFile(found[-1])


def wheel_source(version: str, path: str) -> str | None:
    """The text of ``path`` (``vllm/...py``) in vLLM ``version``'s wheel; ``None``: no wheel here."""
    found = wheel_files(wheels_dir(), version)
    if not found:
        return None
    with zipfile.ZipFile(found[-1]) as wheel:
        return wheel.read(path).decode()


def pure_functions(source: str, names: list[str], constants: tuple[str, ...] = ()) -> dict[str, Any]:
    """The top-level functions ``names`` and assignments ``constants`` of ``source``, executed
    as written (only those nodes: they must need nothing else of the module)."""
    tree = ast.parse(source)
    wanted = [node for node in tree.body
              if (isinstance(node, ast.FunctionDef) and node.name in names)
              or (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in constants for t in node.targets))]
    namespace: dict[str, Any] = {}
    exec(compile(ast.Module(body=wanted, type_ignores=[]), "<vllm wheel>", "exec"), namespace)
    missing = [n for n in (*names, *constants) if n not in namespace]
    assert not missing, f"not in the wheel's module: {missing}"
    return namespace
