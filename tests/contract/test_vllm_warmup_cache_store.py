"""tunecache's warmup-cache store (tunecache.client.preload_store) against vLLM 0.34's own code,
read from its wheel: the store has the interface vLLM's stores have, vLLM builds it as this
module expects, names tables as it parses them, and spawns the daemon it wraps as it assumes;
the releases without warmup-cache stores have none in their wheel either.

Wheels: as tests/contract/test_vllm_releases.py (``TUNECACHE_VLLM_WHEELS``); a release whose
wheel is not there skips, naming how to get it.
"""

from __future__ import annotations

import ast
import inspect

import pytest

from tests.support.vllm_wheels import ALL, pure_functions, releases, wheel_source
from tunecache.client import preload_store
from tunecache.client.preload_store import ArtifactName, TunecacheArtifactStore
from tunecache.engines import engine_for

WEIGHT_CACHE = "vllm/model_executor/model_loader/weight_cache"
release_of = engine_for("vllm").release_of


def _source(version: str, path: str) -> str:
    text = wheel_source(version, path)
    if text is None:
        pytest.skip(f"no vLLM {version} wheel here (pip download --no-deps vllm=={version} -d ~/.cache/tunecache-tests/vllm-wheels/)")
    return text


def _top(source: str, name: str) -> ast.AST:
    [node] = [n for n in ast.parse(source).body if getattr(n, "name", None) == name
              or (isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.target.id == name)]
    return node


def _nodes(node: ast.AST, kind: type) -> list:
    return [n for n in ast.walk(node) if isinstance(n, kind)]


def test_the_store_has_the_methods_of_vllms_artifact_store():
    source = _source("0.34.0", f"{WEIGHT_CACHE}/artifact_store.py")
    protocol = _top(source, "ArtifactStore")
    assert [b.id for b in protocol.bases] == ["Protocol"]
    attributes = {n.target.id: ast.unparse(n.annotation) for n in protocol.body if isinstance(n, ast.AnnAssign)}
    assert attributes == {"name": "str"} and isinstance(TunecacheArtifactStore.name, str)
    methods = {n.name: n for n in protocol.body if isinstance(n, ast.FunctionDef)}
    assert set(methods) == {"get", "put"}
    for name, node in methods.items():
        ours = inspect.signature(getattr(TunecacheArtifactStore, name))
        theirs = [(a.arg, ast.unparse(a.annotation) if a.annotation else None) for a in node.args.args]
        assert [(p.name, p.annotation if p.annotation is not inspect.Parameter.empty else None)
                for p in ours.parameters.values()] == theirs, name
        assert ours.return_annotation == ast.unparse(node.returns), name


def test_vllm_builds_a_store_with_no_argument_by_its_name():
    """``STORE_BACKENDS: dict[str, Callable[[], ArtifactStore]]``, and the daemon's cache builds
    each named store as ``STORE_BACKENDS[name]()``."""
    backends = _top(_source("0.34.0", f"{WEIGHT_CACHE}/artifact_store.py"), "STORE_BACKENDS")
    assert ast.unparse(backends.annotation) == "dict[str, Callable[[], ArtifactStore]]"
    inspect.signature(TunecacheArtifactStore).bind()  # vLLM passes nothing
    warmup = _source("0.34.0", f"{WEIGHT_CACHE}/warmup_cache.py")
    assert "self._store_sources.append(STORE_BACKENDS[name]())" in warmup


def test_tables_are_named_as_the_store_parses_them():
    """The key of a rank's table is ``artifact_key(FlashInferWarmupCache.kind, config_hash,
    flashinfer_autotune_filename(dp, rank))``, the config hash 64 hex digits."""
    warmup = _source("0.34.0", f"{WEIGHT_CACHE}/warmup_cache.py")
    cache = _top(warmup, "FlashInferWarmupCache")
    [kind] = [n.value.value for n in cache.body if isinstance(n, ast.Assign) and n.targets[0].id == "kind"]
    assert kind == preload_store.KIND
    assert 'artifact_key(self.kind, params["config_hash"], filename)' in warmup
    assert '_CONFIG_HASH_RE = re.compile(r"[0-9a-f]{64}")' in warmup
    key = pure_functions(_source("0.34.0", f"{WEIGHT_CACHE}/artifact_store.py"), ["artifact_key"], ("_KEY_PREFIX",))
    filename = pure_functions(_source("0.34.0", "vllm/model_executor/warmup/flashinfer_autotune_cache.py"),
                              ["flashinfer_autotune_filename"])
    for dp, rank in ((0, 0), (0, 7), (3, 12), (15, 127)):
        made = key["artifact_key"](kind, "ab" * 32, filename["flashinfer_autotune_filename"](dp, rank))
        assert ArtifactName.parse(made) == ArtifactName("ab" * 32, dp, rank)


def test_the_config_hash_reads_only_the_runners_config():
    """The store computes a daemon's config hash with ``flashinfer_autotune_cache_hash`` over a
    runner that has only ``vllm_config``."""
    source = _source("0.34.0", "vllm/model_executor/warmup/flashinfer_autotune_cache.py")
    function = _top(source, "flashinfer_autotune_cache_hash")
    used = {n.attr for n in _nodes(function, ast.Attribute) if isinstance(n.value, ast.Name) and n.value.id == "runner"}
    assert used == {"vllm_config"}


def test_preload_spawns_the_daemon_function_the_plugin_wraps():
    """``_run_daemon(global_rank, local_rank, vllm_config, ...)`` takes the stores' names;
    ``vllm preload`` imports it inside its command (so the plugin's wrap, made when the daemon's
    module is imported, is what it gets) and starts it in a ``spawn`` process (which loads no
    plugins, and unpickles the wrap by its own name)."""
    daemon = _top(_source("0.34.0", f"{WEIGHT_CACHE}/daemon.py"), "_run_daemon")
    assert [a.arg for a in daemon.args.args][:3] == ["global_rank", "local_rank", "vllm_config"]
    assert "warmup_cache_stores" in [a.arg for a in daemon.args.args]
    preload = _source("0.34.0", "vllm/entrypoints/cli/preload.py")
    assert "load_general_plugins" not in _source("0.34.0", f"{WEIGHT_CACHE}/daemon.py")
    [command] = [n for n in _nodes(ast.parse(preload), ast.FunctionDef) if n.name == "cmd"]
    imported = {(n.module, a.name) for n in _nodes(command, ast.ImportFrom) for a in n.names}
    assert ("vllm.model_executor.model_loader.weight_cache.daemon", "_run_daemon") in imported
    assert 'multiprocessing.get_context("spawn")' in ast.get_source_segment(preload, command)
    targets = [k.value.id for n in _nodes(command, ast.Call) for k in n.keywords
               if k.arg == "target" and isinstance(k.value, ast.Name)]
    assert targets == ["_run_daemon"]


@pytest.mark.parametrize("version", sorted(set(releases()) | {ALL[-2]}))
def test_the_table_registers_the_store_exactly_where_the_wheel_has_stores(version):
    """``warmup_cache_store`` in the releases table where the wheel has ``STORE_BACKENDS``
    (0.34), not where it has none (0.33 and older)."""
    text = wheel_source(version, "vllm/__init__.py")
    if text is None:
        pytest.skip(f"no vLLM {version} wheel here")
    try:
        stores = wheel_source(version, f"{WEIGHT_CACHE}/artifact_store.py")
    except KeyError:
        stores = None
    has_backends = stores is not None and "STORE_BACKENDS" in stores
    assert release_of(version).warmup_cache_store == has_backends
    assert (version == "0.34.0") == has_backends
