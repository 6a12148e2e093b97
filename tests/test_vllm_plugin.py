"""The vLLM plugin in a real worker-like process, with a stand-in `vllm` package at the edge.

The stand-in provides exactly the vLLM 0.33 names the plugin uses
(``vllm.model_executor.warmup.kernel_warmup.flashinfer_autotune``,
``flashinfer_autotune_cache.flashinfer_autotune_root`` / ``flashinfer_autotune_cache_hash`` /
``flashinfer_autotune_filename``, ``vllm.distributed.parallel_state.get_world_group``); its
``flashinfer_autotune`` records whether the rank file was present when it ran, as vLLM's
loader would look for it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points

from conftest import CUDNN_FILE, free_port, as_admin
from test_cli import push

STAND_IN = {
    "vllm/__init__.py": "",
    "vllm/distributed/__init__.py": "",
    "vllm/distributed/parallel_state.py": textwrap.dedent('''
        import os
        class _Group:
            rank_in_group = int(os.environ.get("RANK", "0"))
        def get_world_group():
            return _Group()
    '''),
    "vllm/model_executor/__init__.py": "",
    "vllm/model_executor/warmup/__init__.py": "",
    "vllm/model_executor/warmup/flashinfer_autotune_cache.py": textwrap.dedent('''
        import os
        from pathlib import Path
        def flashinfer_autotune_root():
            return Path(os.environ["VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR"])
        def flashinfer_autotune_cache_hash(runner):
            return "ef" * 32
        def flashinfer_autotune_filename(dp_rank, rank):
            return f"autotune_configs_dp{dp_rank}_rank{rank}.json"
    '''),
    "vllm/model_executor/warmup/kernel_warmup.py": textwrap.dedent('''
        import json, os
        from vllm.model_executor.warmup import flashinfer_autotune_cache as c
        def use_flashinfer_autotune_v2():
            return False
        def flashinfer_autotune(runner):
            path = c.flashinfer_autotune_root() / c.flashinfer_autotune_cache_hash(runner) / c.flashinfer_autotune_filename(0, 0)
            out = {"file_present_at_warmup": path.is_file()}
            if os.environ.get("DG_JIT_CACHE_DIR"):
                out["DG_JIT_CACHE_DIR"] = os.environ["DG_JIT_CACHE_DIR"]
            print(json.dumps(out))
    '''),
}

WORKER = textwrap.dedent('''
    import logging, sys
    from types import SimpleNamespace as NS
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    from importlib.metadata import entry_points
    [plugin] = [e for e in entry_points(group="vllm.general_plugins") if e.name == "tunecache"]
    plugin.load()()   # what vllm.plugins.load_general_plugins does in each worker
    from vllm.model_executor.warmup import kernel_warmup
    runner = NS(vllm_config=NS(model_config=NS(model="meta-llama/Llama-3.1-8B"),
                               scheduler_config=NS(max_num_batched_tokens=8192),
                               parallel_config=NS(tensor_parallel_size=1, data_parallel_rank=0)))
    kernel_warmup.flashinfer_autotune(runner)   # as kernel_warmup calls it
''')


def run_worker(tmp_path, **env):
    stand_in = tmp_path / "stand_in"
    for name, text in STAND_IN.items():
        (stand_in / name).parent.mkdir(parents=True, exist_ok=True)
        (stand_in / name).write_text(text)
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    base = {**os.environ, "PYTHONPATH": f"{stand_in}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
            "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR": str(tmp_path / "vllm-autotune"),
            "TUNECACHE_ENVIRONMENT_FILE": str(CUDNN_FILE), "TUNECACHE_ATTEMPTS": "1", "TUNECACHE_CONNECT_TIMEOUT": "2"}
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env={**base, **env})
    assert result.returncode == 0, result.stderr  # never raises into vLLM
    return json.loads(result.stdout.strip().splitlines()[-1]), result.stderr


def test_entry_point_is_registered():
    assert "tunecache" in {e.name for e in entry_points(group="vllm.general_plugins")}


def test_worker_finds_the_tuning_installed_before_warmup(server, tmp_path):
    assert push(server).returncode == 0
    seen, log = run_worker(tmp_path, TUNECACHE_URL=server)
    assert seen == {"file_present_at_warmup": True}
    installed = tmp_path / "vllm-autotune" / ("ef" * 32) / "autotune_configs_dp0_rank0.json"
    assert installed.read_bytes() == CUDNN_FILE.read_bytes()
    [line] = [line for line in log.splitlines() if line.startswith("tunecache:")]
    assert line.startswith("tunecache: installed run 1 (42 entries, 0 JIT modules) for meta-llama/Llama-3.1-8B into")


def test_miss_and_server_down_never_stop_the_worker(server, tmp_path):
    seen, log = run_worker(tmp_path, TUNECACHE_URL=server)  # nothing stored yet
    assert seen == {"file_present_at_warmup": False}
    assert "tunecache: no tuning installed, vLLM will tune: no tuning is stored yet" in log
    seen, log = run_worker(tmp_path, TUNECACHE_URL=f"http://127.0.0.1:{free_port()}")
    assert seen == {"file_present_at_warmup": False}
    assert "tunecache: no tuning installed, vLLM will tune: ServerUnreachable" in log


def test_push_back_uploads_a_pod_tuning_unverified(server, tmp_path):
    rank_file = tmp_path / "vllm-autotune" / ("ef" * 32) / "autotune_configs_dp0_rank0.json"
    rank_file.parent.mkdir(parents=True)
    rank_file.write_bytes(CUDNN_FILE.read_bytes())  # as if this worker had tuned locally after the miss
    _, log = run_worker(tmp_path, TUNECACHE_URL=server, TUNECACHE_PUSH_BACK="1")
    assert "tunecache: pushed this pod's tuning back as unverified run 1" in log
    import httpx

    run = httpx.get(f"{server}/v1/tunings/1").json()
    assert run["trigger"] == "pod" and run["verified"] is False and run["is_current"] is False


def test_without_tunecache_url_the_plugin_does_nothing(tmp_path):
    seen, log = run_worker(tmp_path)
    assert seen == {"file_present_at_warmup": False} and "tunecache" not in log


def test_deep_gemm_cache_of_a_vllm_runner_run_becomes_a_read_only_root(server, tmp_path, node_signing_key):
    """A run recorded by the vLLM runner carries vLLM's DeepGEMM cache; the plugin unpacks it
    and puts it after DeepGEMM's writable directory before vLLM's warmup reads it."""
    import hashlib

    import httpx

    from helpers import run_payload, signed
    from test_layouts import deep_gemm_tarball

    tarball = deep_gemm_tarball([("cache/kernel.abc/kernel.cubin", b"cubin")])
    for blob in (tarball, CUDNN_FILE.read_bytes()):
        assert as_admin.put(f"{server}/v1/artifacts/{hashlib.sha256(blob).hexdigest()}", content=blob).status_code == 201
    payload = run_payload(CUDNN_FILE)
    payload["artifacts"].append({"kind": "deep_gemm_jit_cache", "name": "deep-gemm-jit-cache.tar.gz",
                                 "media_type": "application/gzip", "sha256": hashlib.sha256(tarball).hexdigest()})
    assert as_admin.post(f"{server}/v1/tunings", json=signed(payload, node_signing_key)).status_code == 201
    seen, _ = run_worker(tmp_path, TUNECACHE_URL=server, VLLM_CACHE_ROOT=str(tmp_path / "vllm-cache"))
    installed = tmp_path / "vllm-cache" / "tunecache" / "deep_gemm" / "1"
    assert seen["file_present_at_warmup"] is True
    assert seen["DG_JIT_CACHE_DIR"] == f"{tmp_path / 'vllm-cache' / 'deep_gemm'}:{installed}"
    assert (installed / "cache" / "kernel.abc" / "kernel.cubin").read_bytes() == b"cubin"


def test_an_unexpected_vllm_layout_is_logged_not_raised(tmp_path):
    stand_in = tmp_path / "other_vllm"
    (stand_in / "vllm" / "model_executor" / "warmup").mkdir(parents=True)
    for init in ("vllm", "vllm/model_executor", "vllm/model_executor/warmup"):
        (stand_in / init / "__init__.py").write_text("")
    (stand_in / "vllm/model_executor/warmup/kernel_warmup.py").write_text("x = 1  # no flashinfer_autotune here\n")
    code = ("import logging, sys; logging.basicConfig(level=logging.INFO, stream=sys.stderr, format='%(message)s'); "
            "from tunecache.client.vllm_plugin import register; register(); print('booted')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": str(stand_in), "TUNECACHE_URL": "http://127.0.0.1:1"})
    assert result.returncode == 0 and result.stdout.strip() == "booted"
    assert "tunecache: not installing tunings: cannot hook vLLM's kernel_warmup (AttributeError" in result.stderr


def test_a_pod_that_trusts_keys_refuses_an_unsigned_run_in_one_line_and_boots(server, tmp_path, node_signing_key):
    """TUNECACHE_TRUSTED_KEYS set (by the fixture): the unsigned current run installs nothing,
    the worker logs why in one line and vLLM warms up as without tunecache; once the node's
    signed run is current, the same pod installs it."""
    from helpers import run_payload, signed

    assert push(server).returncode == 0  # `tunecache push` records an unsigned run
    seen, log = run_worker(tmp_path, TUNECACHE_URL=server)
    assert seen == {"file_present_at_warmup": False}
    [line] = [line for line in log.splitlines() if line.startswith("tunecache:")]
    assert line == "tunecache: no tuning installed, vLLM will tune: UntrustedRun: tuning run 1 refused: run is unsigned"
    assert as_admin.post(f"{server}/v1/tunings", json=signed(run_payload(CUDNN_FILE), node_signing_key)).status_code == 201
    seen, log = run_worker(tmp_path, TUNECACHE_URL=server)
    assert seen == {"file_present_at_warmup": True}
    assert "tunecache: installed run 2" in log
