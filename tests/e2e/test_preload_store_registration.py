"""The plugin makes tunecache a warmup-cache store of ``vllm preload`` where the release has
them (0.34), in the daemons it spawns too; 0.33 and older: not registered.

A stand-in at the edge: a ``vllm`` package with exactly the names of vLLM 0.34's preload that
this touches (``weight_cache/artifact_store.py::STORE_BACKENDS``, ``weight_cache/daemon.py::_run_daemon``
with its parameters; tests/contract/test_vllm_warmup_cache_store.py checks them against the
wheel). The main process does what ``vllm preload`` does: loads the general plugins, imports
``_run_daemon`` inside its command and starts it in a ``spawn`` process, whose daemon builds
its stores as ``FlashInferWarmupCache.store_sources`` does (``STORE_BACKENDS[name]()``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

WEIGHT_CACHE = "vllm/model_executor/model_loader/weight_cache"

STAND_IN = {
    "vllm/__init__.py": "import os\n__version__ = os.environ['STAND_IN_VLLM_VERSION']\n",
    "vllm/model_executor/__init__.py": "",
    "vllm/model_executor/model_loader/__init__.py": "",
    f"{WEIGHT_CACHE}/__init__.py": "",
    f"{WEIGHT_CACHE}/artifact_store.py": "STORE_BACKENDS = {}\n",
    f"{WEIGHT_CACHE}/daemon.py": textwrap.dedent('''
        from vllm.model_executor.model_loader.weight_cache.artifact_store import STORE_BACKENDS

        def _run_daemon(global_rank, local_rank, vllm_config, distributed_init_method, socket_dir, ready_queue,
                        is_draft=False, dp_rank=0, pp_rank=0, seed_config=None, warmup_cache_stores=()):
            import sys
            stores = [STORE_BACKENDS[name]() for name in warmup_cache_stores]  # as store_sources
            preload_store = sys.modules.get("tunecache.client.preload_store")
            ready_queue.put({"stores": [[s.name, type(s).__module__, type(s).__qualname__] for s in stores],
                             "config": getattr(preload_store, "_daemon_config", None)})
    '''),
}

PRELOAD = textwrap.dedent('''
    import json, multiprocessing, sys
    from importlib.metadata import entry_points

    if __name__ == "__main__":
        # EngineArgs.add_cli_args -> load_general_plugins, while vllm preload builds its parser
        [plugin] = [e for e in entry_points(group="vllm.general_plugins") if e.name == "tunecache"]
        plugin.load()()
        seen = {"daemon_imported_by_plugin": "vllm.model_executor.model_loader.weight_cache.daemon" in sys.modules}
        # PreloadSubcommand.cmd: the import inside the command, then one spawned process per GPU
        from vllm.model_executor.model_loader.weight_cache.daemon import _run_daemon
        from vllm.model_executor.model_loader.weight_cache.artifact_store import STORE_BACKENDS
        seen["backends"] = sorted(STORE_BACKENDS)
        seen["run_daemon"] = f"{_run_daemon.__module__}.{_run_daemon.__qualname__}"
        if sys.argv[1:]:
            ctx = multiprocessing.get_context("spawn")
            ready = ctx.Queue()
            config = {"model": "meta-llama/Llama-3.1-8B", "max_num_batched_tokens": 8192}
            daemon = ctx.Process(target=_run_daemon, args=(0, 0, config, "tcp://127.0.0.1:1", None, ready),
                                 kwargs={"warmup_cache_stores": sys.argv[1:]})
            daemon.start()
            seen["daemon"] = ready.get(timeout=60)
            daemon.join(timeout=30)
            seen["exitcode"] = daemon.exitcode
        print(json.dumps(seen))
''')


def _preload(tmp_path: Path, version: str, *stores: str) -> dict:
    root = tmp_path / "stand-in"
    for name, text in STAND_IN.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    script = tmp_path / "preload.py"
    script.write_text(PRELOAD)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
           "STAND_IN_VLLM_VERSION": version, "TUNECACHE_URL": "http://127.0.0.1:1", "TUNECACHE_REPORT": "0"}
    done = subprocess.run([sys.executable, str(script), *stores], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_on_034_the_spawned_daemon_builds_tunecaches_store_with_its_config(tmp_path):
    seen = _preload(tmp_path, "0.34.0", "tunecache")
    assert seen["daemon_imported_by_plugin"] is False  # the plugin imports nothing of the daemon's
    assert seen["backends"] == ["tunecache"]
    assert seen["run_daemon"] == "tunecache.client.preload_store.run_daemon"
    assert seen["daemon"]["stores"] == [["tunecache", "tunecache.client.preload_store", "TunecacheArtifactStore"]]
    assert seen["daemon"]["config"] == {"model": "meta-llama/Llama-3.1-8B", "max_num_batched_tokens": 8192}
    assert seen["exitcode"] == 0


@pytest.mark.parametrize("version", ["0.33.0", "0.25.0"])
def test_older_releases_get_no_store(tmp_path, version):
    seen = _preload(tmp_path, version)
    assert seen["backends"] == []
    assert seen["run_daemon"] == "vllm.model_executor.model_loader.weight_cache.daemon._run_daemon"
