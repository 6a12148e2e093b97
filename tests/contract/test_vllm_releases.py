"""Each vLLM release tunecache knows (tunecache.engines.vllm.releases, through vLLM's adaptor), against that release's
own code: the wheel from the package index, its Python sources read as they are, nothing of
it imported (no CUDA, no torch of its own needed).

Checked per release: every hook target of the release
(:meth:`tunecache.engines.vllm.adaptor.VllmAdaptor.hook_targets`: ``EngineArgs.create_engine_config``,
the worker's ``load_model``, ``determine_available_memory`` and ``compile_or_warm_up_model``,
``kernel_warmup``, ``flashinfer_autotune``) is defined in its wheel; every function and method the
plugin or the tuner calls besides exists (vLLM's plugin loader, ``get_world_group``, ``vllm.envs.compile_factors``); the markers of the autotune layout
the table names are in ``kernel_warmup.flashinfer_autotune`` and ``flashinfer_autotune_cache``;
for a release whose compile cache installs by directory names (0.25-0.32), the sub-configs' ``compute_hash``,
``aot_compile_hash_factors``, ``_model_hash_key``, the compile index's file name, and vLLM's own
``hash_factors`` run from its source hashing as ``tunecache.engines.vllm.compile_cache.env_hash``
does; for one whose compile cache does not, that ``compute_hash`` is indeed gone.

Which releases: ``TUNECACHE_VLLM_RELEASES`` (comma-separated versions, or ``all``: one of each
minor release of the table); by default the oldest and the newest, which CI runs. Wheels are
kept in ``TUNECACHE_VLLM_WHEELS`` (default ``~/.cache/tunecache-tests/vllm-wheels``); a release
whose wheel cannot be downloaded skips, naming why.

    TUNECACHE_VLLM_RELEASES=all scripts/test.sh tests/contract
"""

from __future__ import annotations

import ast
import hashlib
import json

import pytest

from tunecache.engines import engine_for
from tunecache.engines.vllm.releases import RELEASES

from tests.support.vllm_wheels import ALL, DEFAULT, function_source, release_wheel, releases

release_of = engine_for("vllm").release_of


def test_every_minor_release_of_the_table_has_a_version_here():
    assert sorted(release_of(v).minor for v in ALL) == sorted(RELEASES)


def _defined(source: bytes) -> set[str]:
    """Top-level functions, classes, assignments and imports, and ``Class.method`` of a module."""
    names: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names.add(node.name)
            names.update(f"{node.name}.{sub.name}" for sub in node.body
                         if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)))
        elif isinstance(node, (ast.ImportFrom, ast.Import)):
            names.update(alias.asname or alias.name.split(".")[-1] for alias in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


#: What the plugin and the tuner call besides the hook targets, in every release (module path -> names).
HOOKED = {
    "vllm/engine/arg_utils.py": ["EngineArgs"],
    "vllm/model_executor/warmup/kernel_warmup.py": [],
    "vllm/model_executor/warmup/flashinfer_autotune_cache.py": ["flashinfer_autotune_cache_hash",
                                                                "resolve_flashinfer_autotune_file"],
    "vllm/plugins/__init__.py": ["load_general_plugins"],
    "vllm/distributed/parallel_state.py": ["get_world_group"],
    "vllm/envs.py": ["compile_factors"],
    "vllm/config/utils.py": ["hash_factors"],
}
#: What the compile cache and the engine variants need besides.
COMPILED = {
    "vllm/config/model.py": ["ModelConfig.compute_hash"],
    "vllm/config/cache.py": ["CacheConfig.compute_hash"],
    "vllm/compilation/caching.py": ["aot_compile_hash_factors"],
    "vllm/compilation/decorators.py": ["_model_hash_key"],
}
#: What marks each autotune layout in kernel_warmup.flashinfer_autotune's source.
LAYOUT_MARKS = {
    "single-process": "use_persistent_cache = False",
    "broadcast": "cached_results = world.broadcast_object",
    "per-rank": "_dp{dp_rank}_rank{",
    "root": "resolve_rank_flashinfer_autotune_file",
}


@pytest.mark.parametrize("version", releases())
def test_every_hook_target_of_the_release_is_in_its_wheel(wheels, version):
    """What the plugin wraps in this release, as vLLM's adaptor names it, is defined in the
    release's own code (a module's function, or a class's method)."""
    adaptor = engine_for("vllm")
    release = release_of(version)
    targets = adaptor.hook_targets(release)
    assert {t.role for t in targets} >= {"engine_config", "load_model", "first_forward", "warm_up", "kernel_warmup",
                                         "flashinfer_autotune"}
    wheel = release_wheel(wheels, version)
    missing = []
    for target in targets:
        package = target.source_path.removesuffix(".py") + "/__init__.py"
        path = target.source_path if target.source_path in wheel.namelist() else package
        if path not in wheel.namelist() or target.qualname not in _defined(wheel.read(path)):
            missing.append(f"{target.role}: {target.module}.{target.qualname}")
    assert not missing, f"vllm {version} lacks hook targets the plugin wraps: {missing}"


def test_a_hook_target_the_release_lacks_is_named(wheels):
    """The check above can fail: a target the oldest release does not define is named."""
    from tunecache.engines.base import HookTarget

    wheel = release_wheel(wheels, DEFAULT[0])
    source = wheel.read(HookTarget("x", "vllm.v1.worker.gpu_worker", "Worker.nothing").source_path)
    assert "Worker.load_model" in _defined(source) and "Worker.nothing" not in _defined(source)


@pytest.mark.parametrize("version", releases())
def test_the_release_has_what_tunecache_uses_as_the_table_says(wheels, version):
    release = release_of(version)
    assert release is not None, f"vllm {version} is not in tunecache.engines.vllm.releases"
    wheel = release_wheel(wheels, version)
    sources = {name: wheel.read(name) for name in {*HOOKED, *COMPILED, "vllm/compilation/backends.py"}
               if name in wheel.namelist()}
    missing = [f"{path}: {name}" for path, names in HOOKED.items() for name in names
               if path not in sources or name not in _defined(sources[path])]
    assert not missing, f"vllm {version} lacks what the plugin or the tuner calls: {missing}"

    warmup = function_source(sources["vllm/model_executor/warmup/kernel_warmup.py"], "flashinfer_autotune")
    found = [layout for layout, mark in LAYOUT_MARKS.items() if mark in warmup]
    assert found == [release.autotune_layout], (version, found)
    cache_module = _defined(wheel.read("vllm/model_executor/warmup/flashinfer_autotune_cache.py"))
    assert ("flashinfer_autotune_root" in cache_module) is (release.autotune_layout == "root")

    compiled = [f"{path}: {name}" for path, names in COMPILED.items() for name in names
                if path not in sources or name not in _defined(sources[path])]
    if release.compile_cache and not release.aot_artifact:
        assert not compiled, f"vllm {version} lacks what the compile cache needs: {compiled}"
        assert "vllm_compile_cache.py" in sources["vllm/compilation/backends.py"].decode()
    elif not release.compile_cache:
        assert "vllm/config/model.py: ModelConfig.compute_hash" in compiled, (version, compiled)
    # the AOT path's (0.33, 0.34) contract: tests/contract/test_vllm_aot.py

    # vLLM's own hash_factors, run from its source, hashes as tunecache's fallback does
    from tunecache.engines.vllm.compile_cache import env_hash

    namespace = {"hashlib": hashlib, "json": json}
    exec(function_source(sources["vllm/config/utils.py"], "hash_factors"), namespace)  # noqa: S102 - the release's own code
    factors = {"VLLM_USE_AOT_COMPILE": True, "VLLM_PP_LAYER_PARTITION": None, "VLLM_CONFIG_ROOT": "/x"}
    assert namespace["hash_factors"](factors) == env_hash(factors)


@pytest.mark.parametrize("version", releases())
def test_the_deep_gemm_warmups_m_set_is_the_tables(wheels, version):
    """The block Ms each release's DeepGEMM warmup compiles for
    (``deep_gemm_warmup.py::_generate_optimal_warmup_m_values``), which decide the releases a
    DeepGEMM cache covers (tunecache.engines.vllm.deep_gemm), are the table's."""
    source = release_wheel(wheels, version).read("vllm/model_executor/warmup/deep_gemm_warmup.py")
    function = ast.parse(function_source(source, "_generate_optimal_warmup_m_values"))
    [value] = [n.value for n in ast.walk(function) if isinstance(n, ast.Assign)
               and any(isinstance(t, ast.Name) and t.id == "block_ms" for t in n.targets)]
    block_ms = eval(compile(ast.Expression(value), "block_ms", "eval"), {"__builtins__": {}, "list": list, "range": range})  # noqa: S307 - a literal of the release's own code
    assert tuple(block_ms) == release_of(version).deep_gemm_block_ms, (version, block_ms)
