"""The engine-argument allow-list (tunecache.contract.engine_args) against each supported vLLM
release's own ``EngineArgs`` and ``CompilationConfig`` (read from its wheel by ast, nothing of
it imported; the releases the contract tests read, tests.support.vllm_wheels.releases():
``TUNECACHE_VLLM_RELEASES``, by default the oldest and the newest).

Every field of either is allowed (with its type, bounds and reason) or refused (with a reason)
in the contract's tables: a field the tables do not know fails here, so a new field of a new
release is refused (the runtime check refuses any name it does not allow) until someone writes
the decision down. Each allowed name exists in the release unless the table says it came later
(``since``); the choices of an allowed enum are the release's own.
"""

from __future__ import annotations

import ast

import pytest

from tests.support.vllm_wheels import release_wheel, releases
from tunecache.engines import engine_for

release_of = engine_for("vllm").release_of
from tunecache.contract.engine_args import ALLOWED, ALLOWED_COMPILATION, REFUSED, REFUSED_COMPILATION


def _class(source: bytes, name: str) -> ast.ClassDef:
    [node] = [n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == name]
    return node


def dataclass_fields(source: bytes, name: str) -> set[str]:
    """The annotated fields of class ``name`` (a dataclass: ``EngineArgs``, ``CompilationConfig``)."""
    return {item.target.id for item in _class(source, name).body
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)}


def enum_members(source: bytes, name: str) -> dict[str, object]:
    """``{member: value}`` of an enum class (a value that is no literal: ``...``)."""
    members = {}
    for item in _class(source, name).body:
        if isinstance(item, ast.Assign) and len(item.targets) == 1 and isinstance(item.targets[0], ast.Name):
            try:
                members[item.targets[0].id] = ast.literal_eval(item.value)
            except ValueError:
                members[item.targets[0].id] = ...
    return members


def literal_choices(source: bytes, name: str) -> set[str]:
    """The strings of a module-level ``NAME = Literal[...]``."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return {c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant) and isinstance(c.value, str)}
    raise AssertionError(f"no {name} = Literal[...]")


def _sources(wheels, version: str) -> dict[str, bytes]:
    wheel = release_wheel(wheels, version)
    return {path: wheel.read(path) for path in ("vllm/engine/arg_utils.py", "vllm/config/compilation.py",
                                                "vllm/config/cache.py", "vllm/config/vllm.py",
                                                "vllm/v1/attention/backends/registry.py")}


@pytest.mark.parametrize("version", releases())
def test_every_engine_argument_of_the_release_is_allowed_or_refused_with_a_reason(wheels, version):
    sources = _sources(wheels, version)
    minor = release_of(version).minor
    for fields, allowed, refused, what in (
            (dataclass_fields(sources["vllm/engine/arg_utils.py"], "EngineArgs"), ALLOWED, REFUSED, "EngineArgs"),
            (dataclass_fields(sources["vllm/config/compilation.py"], "CompilationConfig"), ALLOWED_COMPILATION,
             REFUSED_COMPILATION, "CompilationConfig")):
        undecided = sorted(fields - set(allowed) - set(refused))
        assert not undecided, (f"vllm {version}'s {what} has fields tunecache.contract.engine_args decides nothing "
                               f"about (refused until someone decides: allow one with its bounds and reason, or "
                               f"refuse it with a reason): {undecided}")
        missing = sorted(name for name, spec in allowed.items() if name not in fields and minor >= (spec.since or minor))
        assert not missing, f"vllm {version}'s {what} lacks these allowed arguments (say since which): {missing}"
        present = sorted(name for name, spec in allowed.items() if name in fields and minor < (spec.since or minor))
        assert not present, f"vllm {version}'s {what} has these, which the table says came later: {present}"
        assert all(spec.reason.strip() for spec in allowed.values()) and all(r.strip() for r in refused.values())


@pytest.mark.parametrize("version", releases())
def test_the_choices_of_an_allowed_argument_are_the_releases_own(wheels, version):
    sources = _sources(wheels, version)
    compilation, config = sources["vllm/config/compilation.py"], sources["vllm/config/vllm.py"]
    assert set(ALLOWED["kv_cache_dtype"].choices) <= literal_choices(sources["vllm/config/cache.py"], "CacheDType")
    for name in ("mamba_cache_dtype", "mamba_ssm_cache_dtype"):
        assert set(ALLOWED[name].choices) <= literal_choices(sources["vllm/config/cache.py"], "MambaDType")
    assert set(ALLOWED["performance_mode"].choices) <= literal_choices(config, "PerformanceMode")
    levels = enum_members(config, "OptimizationLevel").values()
    assert (ALLOWED["optimization_level"].low, ALLOWED["optimization_level"].high) == (min(levels), max(levels))
    assert set(ALLOWED_COMPILATION["cudagraph_mode"].choices) == set(enum_members(compilation, "CUDAGraphMode"))
    modes = enum_members(compilation, "CompilationMode")
    assert set(ALLOWED_COMPILATION["mode"].choices) == set(modes) | set(modes.values())
    # every attention backend a name can pick is a class of vLLM's own; CUSTOM (one registered
    # by other code) is the one refused
    registry = sources["vllm/v1/attention/backends/registry.py"]
    backends = enum_members(registry, "AttentionBackendEnum")
    others = {name: path for name, path in backends.items()
              if name not in ALLOWED["attention_backend"].refused_values and path != "" and not str(path).startswith("vllm.")}
    assert backends["CUSTOM"] is None and not others, others
