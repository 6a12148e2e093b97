"""The vLLM plugin in real worker-like processes, with a stand-in `vllm` package at the edge.

The stand-in provides exactly the vLLM 0.33 names the plugin uses, in vLLM 0.33's order:
``vllm/v1/worker/gpu_worker.py`` binds ``kernel_warmup`` at import
(``from vllm.model_executor.warmup.kernel_warmup import kernel_warmup``) and its
``Worker.compile_or_warm_up_model()`` calls ``kernel_warmup(self)``, which runs
``deep_gemm_warmup(model, max_num_batched_tokens)`` (recording ``DG_JIT_CACHE_DIR`` as it
sees it) and then ``flashinfer_autotune(worker.model_runner)`` (recording whether this
rank's file was present and whether vLLM's loader would take the rank set: every rank's
file present with the same ``_metadata`` and entry count). ``flashinfer_autotune_cache``'s
``flashinfer_autotune_root`` / ``flashinfer_autotune_cache_hash`` /
``flashinfer_autotune_filename`` and ``vllm.distributed.parallel_state.get_world_group()``
(``rank_in_group`` and ``world_size`` from ``RANK`` / ``WORLD_SIZE``) complete it. The
worker script calls the plugin's ``register()`` first and imports ``gpu_worker`` after it,
as ``WorkerWrapperBase.init_worker`` does; a pod is several such processes sharing one
``vllm_config.instance_id``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import CUBLASLT_FILE, CUDNN_FILE
from tests.support.serve import free_port, as_admin
from tests.support.cli import push
from tests.support.vllm_stand_in import CONFIG_HASH, rank_file, run_pod, run_worker, tunecache_lines

# What this module tests happens on the pod: its server runs on SQLite only (tests/conftest.py).
SERVER_DATABASE_INCIDENTAL = True

def push_deep_gemm_run(server, signing_key, **key):
    """Record a run as the vLLM runner does: the tactics plus vLLM's DeepGEMM JIT cache,
    signed by the node's key. Returns the cache's tarball members."""
    from tests.support.builders import h200_key, run_payload, signed
    from tests.support.jit import deep_gemm_tarball

    members = [("cache/kernel.abc/kernel.cubin", b"cubin")]
    tarball = deep_gemm_tarball(members)
    for blob in (tarball, CUDNN_FILE.read_bytes()):
        assert as_admin.put(f"{server}/v1/artifacts/{hashlib.sha256(blob).hexdigest()}", content=blob).status_code == 201
    payload = run_payload(CUDNN_FILE, h200_key(**key))
    payload["artifacts"].append({"kind": "deep_gemm_jit_cache", "name": "deep-gemm-jit-cache.tar.gz",
                                 "media_type": "application/gzip", "sha256": hashlib.sha256(tarball).hexdigest()})
    assert as_admin.post(f"{server}/v1/tunings", json=signed(payload, signing_key)).status_code == 201
    return members


def test_worker_finds_the_tuning_installed_before_warmup(server, tmp_path):
    assert push(server).returncode == 0
    seen, log = run_worker(tmp_path, TUNECACHE_URL=server)
    assert seen == {"deep_gemm_warmup": {"DG_JIT_CACHE_DIR": None},
                    "flashinfer_autotune": {"file_present_at_warmup": True, "loadable": True}}
    assert rank_file(tmp_path, 0).read_bytes() == CUDNN_FILE.read_bytes()
    [line] = tunecache_lines(log)
    assert line.startswith("tunecache: installed run 1 (42 entries, 0 JIT modules) for meta-llama/Llama-3.1-8B into")


def test_miss_and_server_down_never_stop_the_worker(server, tmp_path):
    seen, log = run_worker(tmp_path, TUNECACHE_URL=server)  # nothing stored yet
    assert seen["flashinfer_autotune"] == {"file_present_at_warmup": False, "loadable": False}
    assert "tunecache: no tuning installed, vLLM will tune: no tuning is stored yet" in log
    seen, log = run_worker(tmp_path, TUNECACHE_URL=f"http://127.0.0.1:{free_port()}")
    assert seen["flashinfer_autotune"] == {"file_present_at_warmup": False, "loadable": False}
    assert "tunecache: no tuning installed, vLLM will tune: ServerUnreachable" in log


def test_push_back_uploads_a_pod_tuning_unverified(server, tmp_path):
    rank_file(tmp_path, 0).parent.mkdir(parents=True)
    rank_file(tmp_path, 0).write_bytes(CUDNN_FILE.read_bytes())  # as if this worker had tuned locally after the miss
    _, log = run_worker(tmp_path, TUNECACHE_URL=server, TUNECACHE_PUSH_BACK="1")
    assert "tunecache: pushed this pod's tuning back as unverified run 1" in log
    import httpx

    run = httpx.get(f"{server}/v1/tunings/1").json()
    assert run["trigger"] == "pod" and run["verified"] is False and run["is_current"] is False


def test_without_tunecache_url_the_plugin_does_nothing(tmp_path):
    seen, log = run_worker(tmp_path)
    assert seen["flashinfer_autotune"] == {"file_present_at_warmup": False, "loadable": False}
    assert "tunecache" not in log


def test_deep_gemm_cache_of_a_run_is_merged_into_the_pods_deep_gemm_directory(server, tmp_path, node_signing_key):
    """A run with a DeepGEMM cache (the deep_gemm stage's, or the vLLM runner's): the plugin
    merges its kernels into the pod's own DeepGEMM directory (vLLM's default here) and sets
    DG_JIT_CACHE_DIR to it before vLLM's warmup reads it."""
    push_deep_gemm_run(server, node_signing_key)
    seen, _ = run_worker(tmp_path, TUNECACHE_URL=server)
    installed = tmp_path / "vllm-cache" / "deep_gemm"  # vLLM's default DG_JIT_CACHE_DIR
    expected = str(installed)
    assert seen["deep_gemm_warmup"] == {"DG_JIT_CACHE_DIR": expected}
    assert seen["flashinfer_autotune"] == {"file_present_at_warmup": True, "loadable": True, "DG_JIT_CACHE_DIR": expected}
    assert (installed / "cache" / "kernel.abc" / "kernel.cubin").read_bytes() == b"cubin"


def test_vllm_025_single_process_engine_reads_the_installed_file(server, tmp_path):
    """vLLM 0.25's layout (``resolve_flashinfer_autotune_file``: ``<root>/<hash>/
    autotune_configs.json``), the one the H200's vLLM has: the run becomes that file before
    vLLM's FlashInfer autotune opens it."""
    assert push(server).returncode == 0
    seen, log = run_worker(tmp_path, TUNECACHE_URL=server, STAND_IN_VLLM_LAYOUT="0.25")
    assert seen["flashinfer_autotune"] == {"file_present_at_warmup": True, "loadable": True}
    installed = tmp_path / "vllm-autotune" / CONFIG_HASH / "autotune_configs.json"
    assert installed.read_bytes() == CUDNN_FILE.read_bytes()
    assert sorted(p.name for p in installed.parent.iterdir()) == ["autotune_configs.json"]
    [line] = tunecache_lines(log)
    assert line.startswith(f"tunecache: installed run 1 (42 entries, 0 JIT modules) for meta-llama/Llama-3.1-8B into "
                           f"{installed.parent} (rank 0)")


def test_vllm_025_multi_process_engine_is_told_it_tunes_itself(server, tmp_path):
    """vLLM 0.25 tunes every rank of a TP=2 engine and reads no file: each worker says so in
    one line and nothing is written."""
    assert push(server).returncode == 0
    workers, _ = run_pod(tmp_path, 2, TUNECACHE_URL=server, STAND_IN_VLLM_LAYOUT="0.25")
    for seen, log in workers:
        assert seen["flashinfer_autotune"] == {"tunes_every_rank": True}
        assert tunecache_lines(log) == ["tunecache: no tuning installed, vLLM will tune: SingleProcessLayout: this vLLM "
                                        "tunes every rank of a 2-process engine itself and reads no autotune file "
                                        "(vLLM 0.25's and 0.26's kernel_warmup.flashinfer_autotune)"]
    assert not (tmp_path / "vllm-autotune").exists()


def test_the_plugins_line_appears_in_vllms_own_log(server, tmp_path):
    """vLLM logs through its ``vllm`` logger only (its handler, ``propagate: False``; the
    root logger has no handler): the plugin logs under it, so its INFO line is printed
    there, in vLLM's format."""
    assert push(server).returncode == 0
    _, log = run_worker(tmp_path, TUNECACHE_URL=server, STAND_IN_VLLM_LOGGING="1")
    [line, attested] = [line for line in log.splitlines() if "tunecache:" in line]
    assert line.startswith("(EngineCore) tunecache: installed run 1 (42 entries, 0 JIT modules) for meta-llama/Llama-3.1-8B")
    assert attested.startswith("(EngineCore) tunecache: this boot compiled ")  # the attestation, in vLLM's log too


def test_a_pod_serving_weights_from_a_directory_asks_for_its_served_model_name(server, tmp_path):
    """``model=/models/llama`` with ``--served-model-name meta-llama/Llama-3.1-8B``: the key's
    model is the served name (vLLM's ``served_model_name``), so the pod finds the tuning."""
    assert push(server).returncode == 0
    seen, log = run_worker(tmp_path, TUNECACHE_URL=server, STAND_IN_MODEL="/models/llama",
                           STAND_IN_SERVED_MODEL_NAME="meta-llama/Llama-3.1-8B")
    assert seen["flashinfer_autotune"] == {"file_present_at_warmup": True, "loadable": True}
    [line] = tunecache_lines(log)
    assert line.startswith("tunecache: installed run 1 (42 entries, 0 JIT modules) for meta-llama/Llama-3.1-8B into")
    seen, log = run_worker(tmp_path, TUNECACHE_URL=server, STAND_IN_MODEL="/models/llama",
                           VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR=str(tmp_path / "another-pod"))
    assert seen["flashinfer_autotune"] == {"file_present_at_warmup": False, "loadable": False}
    assert "tunecache: no tuning installed, vLLM will tune:" in log and "/models/llama" in log


def test_an_unexpected_vllm_layout_is_logged_not_raised(tmp_path):
    stand_in = tmp_path / "other_vllm"
    (stand_in / "vllm" / "model_executor" / "warmup").mkdir(parents=True)
    for init in ("vllm", "vllm/model_executor", "vllm/model_executor/warmup"):
        (stand_in / init / "__init__.py").write_text("")
    (stand_in / "vllm/__init__.py").write_text('__version__ = "0.33.0"\n')
    (stand_in / "vllm/model_executor/warmup/kernel_warmup.py").write_text("x = 1  # no flashinfer_autotune here\n")
    code = ("import logging, sys; logging.basicConfig(level=logging.INFO, stream=sys.stderr, format='%(message)s'); "
            "from tunecache.client.boot.hooks import register; register(); print('booted')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": str(stand_in), "TUNECACHE_URL": "http://127.0.0.1:1"})
    assert result.returncode == 0 and result.stdout.strip() == "booted"
    assert "tunecache: not installing tunings: cannot hook vLLM's kernel_warmup (AttributeError" in result.stderr
    # a release tunecache does not know: one line, nothing hooked, vLLM boots as without it
    # (another directory: a rewrite of the same size within a second would reuse the cached bytecode)
    unknown = tmp_path / "unknown_vllm" / "vllm"
    unknown.mkdir(parents=True)
    (unknown / "__init__.py").write_text('__version__ = "0.40.0"\n')
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": str(unknown.parent), "TUNECACHE_URL": "http://127.0.0.1:1"})
    assert result.returncode == 0 and result.stdout.strip() == "booted"
    assert result.stderr.splitlines() == ["tunecache: vLLM 0.40.0 is not a release tunecache knows (0.25-0.34): "
                                          "nothing is installed, vLLM boots as without tunecache"]


def test_a_pod_that_trusts_keys_refuses_an_unsigned_run_in_one_line_and_boots(server, tmp_path, node_signing_key):
    """TUNECACHE_TRUSTED_KEYS set (by the fixture): the unsigned current run installs nothing,
    the worker logs why in one line and vLLM warms up as without tunecache; once the node's
    signed run is current, the same pod installs it."""
    from tests.support.builders import run_payload, signed

    assert push(server).returncode == 0  # `tunecache push` records an unsigned run
    seen, log = run_worker(tmp_path, TUNECACHE_URL=server)
    assert seen["flashinfer_autotune"] == {"file_present_at_warmup": False, "loadable": False}
    [line] = tunecache_lines(log)
    assert line == "tunecache: no tuning installed, vLLM will tune: UntrustedRun: tuning run 1 refused: run is unsigned"
    assert as_admin.post(f"{server}/v1/tunings", json=signed(run_payload(CUDNN_FILE), node_signing_key)).status_code == 201
    seen, log = run_worker(tmp_path, TUNECACHE_URL=server)
    assert seen["flashinfer_autotune"] == {"file_present_at_warmup": True, "loadable": True}
    assert "tunecache: installed run 2" in log


# Issue 10: one run per pod boot, all ranks or none, before DeepGEMM warmup.


def test_every_worker_of_a_pod_installs_the_run_its_first_worker_found(server, tmp_path):
    """Run 2 is recorded after rank 0 of a TP=2 pod installed run 1 and before rank 1
    reaches its warmup: rank 1 still gets run 1 (the pod's run), so vLLM takes the rank set.
    The next boot (another instance id, same volume) looks up again and gets run 2."""
    assert "current" in push(server, CUDNN_FILE, "--tensor-parallel-size", "2").stdout  # run 1
    seen0, log0 = run_worker(tmp_path, rank=0, world_size=2, instance="boot-1", TUNECACHE_URL=server)
    assert "current" in push(server, CUBLASLT_FILE, "--tensor-parallel-size", "2").stdout  # run 2, now current
    seen1, log1 = run_worker(tmp_path, rank=1, world_size=2, instance="boot-1", TUNECACHE_URL=server)

    assert rank_file(tmp_path, 0).read_bytes() == rank_file(tmp_path, 1).read_bytes() == CUDNN_FILE.read_bytes()
    assert seen0["flashinfer_autotune"]["loadable"] and seen1["flashinfer_autotune"]["loadable"]
    [line0], [line1] = tunecache_lines(log0), tunecache_lines(log1)
    assert line0.startswith(f"tunecache: installed run 1 (42 entries, 0 JIT modules) for meta-llama/Llama-3.1-8B into "
                            f"{tmp_path / 'vllm-autotune' / CONFIG_HASH} (ranks 0-1)")
    assert line1 == (f"tunecache: run 1 installed for this pod by rank 0 (42 entries, 0 JIT modules) for "
                     f"meta-llama/Llama-3.1-8B: {rank_file(tmp_path, 1)}")

    for rank in (0, 1):  # the pod restarts on the same volume
        seen, log = run_worker(tmp_path, rank=rank, world_size=2, instance="boot-2", TUNECACHE_URL=server)
        assert seen["flashinfer_autotune"]["loadable"]
    assert rank_file(tmp_path, 0).read_bytes() == rank_file(tmp_path, 1).read_bytes() == CUBLASLT_FILE.read_bytes()


@pytest.fixture
def logged_server(database_url, monkeypatch, request):
    """`server` with uvicorn's access log on (``TUNECACHE_ACCESS_LOG``): one line per request in serve.log."""
    monkeypatch.setenv("TUNECACHE_ACCESS_LOG", "true")
    return request.getfixturevalue("server")


def test_workers_reaching_warmup_together_look_up_once_and_install_the_same_bytes(logged_server, tmp_path):
    """Four workers of one boot released at the same moment: the server sees one lookup
    (its access log), every rank file holds the run, one worker says it installed it and
    the three others that it was installed for the pod."""
    server = logged_server
    assert push(server, CUDNN_FILE, "--tensor-parallel-size", "4").returncode == 0
    access = (tmp_path / "serve.log").read_text().count('"POST /v1/tunings/lookup HTTP/1.1"')
    workers, _ = run_pod(tmp_path, 4, TUNECACHE_URL=server)

    lookups = (tmp_path / "serve.log").read_text().count('"POST /v1/tunings/lookup HTTP/1.1"') - access
    assert lookups == 1
    assert {rank_file(tmp_path, rank).read_bytes() for rank in range(4)} == {CUDNN_FILE.read_bytes()}
    assert all(seen["flashinfer_autotune"] == {"file_present_at_warmup": True, "loadable": True} for seen, _ in workers)
    lines = [tunecache_lines(log) for _, log in workers]
    assert all(len(one) == 1 for one in lines), lines
    installer = [rank for rank, [line] in enumerate(lines) if line.startswith("tunecache: installed run 1 (42 entries")]
    assert len(installer) == 1 and " (ranks 0-3)" in lines[installer[0]][0]
    assert sorted(line for rank, [line] in enumerate(lines) if rank not in installer) == [
        f"tunecache: run 1 installed for this pod by rank {installer[0]} (42 entries, 0 JIT modules) for "
        f"meta-llama/Llama-3.1-8B: {rank_file(tmp_path, rank)}" for rank in range(4) if rank not in installer]


def small_tmpfs(mountpoint: Path, size: str) -> list[str]:
    """A command prefix that runs a command in a mount namespace of its own with a tmpfs of
    ``size`` on ``mountpoint``, unmounted when the command ends (as root: ``unshare -m``;
    otherwise in a user namespace, ``unshare -Urm``). Skips the test where neither can mount."""
    # sh -c SCRIPT MOUNTPOINT SIZE COMMAND...: $0 is the mountpoint, $1 the size
    script = 'mount -t tmpfs -o size="$1" tunecache-test "$0" || exit 97; shift; "$@"; rc=$?; umount "$0"; exit $rc'
    mountpoint.mkdir(parents=True, exist_ok=True)
    if shutil.which("unshare") is None:
        pytest.skip("a small tmpfs is needed and util-linux `unshare` is not installed")
    tries = ([["unshare", "-m"]] if os.geteuid() == 0 else []) + [["unshare", "-Urm"]]
    errors = []
    for unshare in tries:
        command = [*unshare, "sh", "-c", script, str(mountpoint), size]
        probe = subprocess.run([*command, "true"], capture_output=True, text=True, timeout=30)
        if probe.returncode == 0:
            return command
        errors.append(f"{' '.join(unshare)}: {probe.stderr.strip() or probe.returncode}")
    pytest.skip(f"cannot mount a tmpfs here ({'; '.join(errors)})")


def test_a_volume_with_room_for_one_rank_file_gets_no_rank_file(server, tmp_path):
    """A TP=2 pod on a real tmpfs with room for one rank file but not two: no rank file is
    left, both workers say why (no space), and vLLM's autotune finds nothing, as on a miss."""
    assert push(server, CUDNN_FILE, "--tensor-parallel-size", "2").returncode == 0
    pages = -(-len(CUDNN_FILE.read_bytes()) // 4096)  # 6 pages each; two rank files need 12
    volume = tmp_path / "small-volume"
    prefix = small_tmpfs(volume, f"{(pages + 3) * 4}k")
    workers, files = run_pod(tmp_path, 2, prefix=prefix, list_dir=volume, TUNECACHE_URL=server,
                             VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR=str(volume))

    assert [name for name in files if not name.startswith(".tunecache/")] == []  # no rank file, no staging left
    for seen, log in workers:
        assert seen["flashinfer_autotune"] == {"file_present_at_warmup": False, "loadable": False}
        [line] = tunecache_lines(log)
        assert line.startswith("tunecache: no tuning installed, vLLM will tune: ") and "No space left on device" in line


def test_deep_gemm_cache_is_in_place_before_deep_gemm_warmup_in_every_worker(server, tmp_path, node_signing_key):
    """A TP=2 pod and a run with a DeepGEMM cache: each worker's DeepGEMM warmup, which runs
    before FlashInfer's autotune, sees the installed cache on DG_JIT_CACHE_DIR; also on a
    boot whose vLLM imported gpu_worker (binding kernel_warmup) before loading the plugins."""
    members = push_deep_gemm_run(server, node_signing_key, tensor_parallel_size=2)
    installed = tmp_path / "vllm-cache" / "deep_gemm"  # vLLM's default DG_JIT_CACHE_DIR
    expected = str(installed)
    workers, _ = run_pod(tmp_path, 2, TUNECACHE_URL=server)
    early, _ = run_pod(tmp_path, 2, TUNECACHE_URL=server, STAND_IN_IMPORT_WORKER_FIRST="1")

    for seen, log in workers + early:
        assert seen["deep_gemm_warmup"] == {"DG_JIT_CACHE_DIR": expected}, log
        assert seen["flashinfer_autotune"]["loadable"] is True
    [(name, data)] = members
    assert (installed / name).read_bytes() == data


def test_every_worker_reports_its_own_outcome(server, database_url, tmp_path):
    """Issue 11: each worker of a pod reports what its install came to: the first worker
    what its lookup found (``looked_up``), each other worker whether its own rank file holds
    the pod's run; a miss carries the pod's environment."""
    from tests.support.builders import file_environment, h200_key
    from tests.support.builders import stored_reports

    run_worker(tmp_path, TUNECACHE_URL=server)  # nothing stored yet: a miss
    [miss] = stored_reports(database_url, 1)
    environment = file_environment(CUDNN_FILE)
    assert (miss.outcome, miss.source, miss.rank, miss.looked_up, miss.run_id) == ("miss", "plugin", 0, True, None)
    assert miss.environment == environment.model_dump() and miss.key_hash == h200_key().key_hash()

    assert push(server, CUDNN_FILE, "--tensor-parallel-size", "2").returncode == 0
    workers, _ = run_pod(tmp_path, 2, TUNECACHE_URL=server)
    assert all(seen["flashinfer_autotune"]["loadable"] for seen, _ in workers)
    installed = stored_reports(database_url, 3)[1:]
    assert sorted((r.rank, r.outcome, r.run_id, r.source) for r in installed) == [(0, "installed", 1, "plugin"),
                                                                                  (1, "installed", 1, "plugin")]
    assert sorted(r.looked_up for r in installed) == [False, True]  # one lookup for the pod
    key = h200_key(tensor_parallel_size=2)
    for row in installed:
        assert row.key_hash == key.key_hash() and row.environment_hash == environment.environment_hash()
        assert row.environment is None and row.pod == socket.gethostname() and row.install_seconds > 0


def read_only_volume(mountpoint: Path, contents: Path) -> list[str]:
    """As :func:`small_tmpfs`, a command prefix with a tmpfs on ``mountpoint``, holding a copy
    of the directory ``contents`` and remounted read-only before the command runs: a cache
    root baked into an image. Skips the test where no tmpfs can be mounted."""
    script = ('mount -t tmpfs tunecache-test "$0" || exit 97; cp -a "$1/." "$0/" || exit 98; '
              'mount -o remount,ro "$0" || exit 99; shift; "$@"; rc=$?; umount "$0"; exit $rc')
    prefix = small_tmpfs(mountpoint, "1m")  # skips where no tmpfs can be mounted
    return [*prefix[:prefix.index("sh")], "sh", "-c", script, str(mountpoint), str(contents)]


def _baked_root(tmp_path: Path, data: bytes | None) -> Path:
    baked = tmp_path / "image-layer"
    (baked / CONFIG_HASH).mkdir(parents=True)
    if data is not None:
        (baked / CONFIG_HASH / "autotune_configs_dp0_rank0.json").write_bytes(data)
    return baked


@pytest.mark.parametrize("baked", ["valid", "other environment", "none"])
def test_a_read_only_cache_root_with_a_baked_file_is_named_for_what_vllm_does(server, tmp_path, baked):
    """Issue 21: a valid autotune file baked into a read-only cache root made the plugin log
    'no tuning installed, vLLM will tune: OSError: Read-only file system' before any lookup,
    while vLLM loads that file. Now the one line says what vLLM does with what is there: it
    loads the baked file (its environment is this pod's), or tunes (the file is for another
    FlashInfer environment, or there is none), and that nothing could be installed there."""
    import json

    assert push(server).returncode == 0
    document = json.loads(CUDNN_FILE.read_bytes())
    if baked == "other environment":
        document["_metadata"]["cudnn_version"] = "91700"
    data = None if baked == "none" else json.dumps(document).encode()
    volume = tmp_path / "read-only-root"
    prefix = read_only_volume(volume, _baked_root(tmp_path, data))
    [(seen, log)], files = run_pod(tmp_path, 1, prefix=prefix, list_dir=volume, TUNECACHE_URL=server,
                                   VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR=str(volume))
    own = volume / CONFIG_HASH / "autotune_configs_dp0_rank0.json"
    assert files == ({} if data is None else {f"{CONFIG_HASH}/autotune_configs_dp0_rank0.json": hashlib.sha256(data).hexdigest()})
    assert seen["flashinfer_autotune"]["file_present_at_warmup"] is (data is not None)
    [line] = tunecache_lines(log)
    assert "OSError" not in line and f"{volume} is read-only, so nothing was looked up or installed" in line, line
    if baked == "valid":
        assert line.startswith(f"tunecache: vLLM will load the autotune file already in place: {own} (42 entries, "
                               "for this pod's FlashInfer environment); ")
    elif baked == "other environment":
        assert line.startswith("tunecache: no tuning installed, vLLM will tune: the autotune file already in place, "
                               f"{own}, is for another FlashInfer environment (cudnn_version: file 91700, this pod 91900), "
                               "and is left as it is; ")
    else:
        assert line.startswith("tunecache: no tuning installed, vLLM will tune: ")


@pytest.mark.parametrize("version, layout, files", [
    ("0.29.0", "0.29", ["autotune_configs.json"]),  # rank 0 reads it for every rank
    ("0.32.0", "0.32", ["autotune_configs_dp0_rank0.json", "autotune_configs_dp0_rank1.json"]),  # one per rank
])
def test_the_autotune_layouts_of_vllm_027_to_032_in_a_two_process_engine(server, tmp_path, version, layout, files):
    """vLLM 0.27-0.31 read one file at rank 0 and broadcast it; 0.32 one file per rank beside
    resolve_flashinfer_autotune_file's, loaded only when every rank's matches
    (tunecache.engines.vllm.releases)."""
    assert push(server, CUDNN_FILE, "--tensor-parallel-size", "2").returncode == 0
    workers, _ = run_pod(tmp_path, 2, TUNECACHE_URL=server, STAND_IN_VLLM_LAYOUT=layout, STAND_IN_VLLM_VERSION=version)
    for seen, _log in workers:
        assert seen["flashinfer_autotune"]["loadable"] is True, _log
    directory = tmp_path / "vllm-autotune" / CONFIG_HASH
    assert sorted(p.name for p in directory.iterdir()) == files


@pytest.mark.parametrize("family, shared", [("120", True), ("90", False)])
def test_vllm_033_on_sm120_gets_the_shared_file_its_sparse_mla_decode_autotune_reads(server, tmp_path, family, shared):
    """vLLM 0.33/0.34 on an SM120-family GPU: the sparse-MLA decode autotune's leader reads
    ``autotune_configs.json`` beside the per-rank files before ``flashinfer_autotune`` reads
    those (tunecache.engines.vllm.paths.shared_autotune_file_names); a pod of two ranks finds it
    there with the run's file, written with the rank files. On another GPU nothing reads it and
    nothing is written under that name."""
    assert push(server, CUDNN_FILE, "--tensor-parallel-size", "2").returncode == 0
    workers, _ = run_pod(tmp_path, 2, TUNECACHE_URL=server, STAND_IN_GPU_FAMILY=family)
    directory = tmp_path / "vllm-autotune" / CONFIG_HASH
    names = ["autotune_configs_dp0_rank0.json", "autotune_configs_dp0_rank1.json"]
    assert sorted(p.name for p in directory.iterdir()) == sorted(names + (["autotune_configs.json"] if shared else []))
    for seen, log in workers:
        assert seen["flashinfer_autotune"] == {"file_present_at_warmup": True, "loadable": True}, log
        if shared:
            assert seen["sparse_mla_decode_autotune"]["shared_file_present"] is True
            assert seen["sparse_mla_decode_autotune"]["entries"] > 0
        else:
            assert "sparse_mla_decode_autotune" not in seen
    if shared:
        assert (directory / "autotune_configs.json").read_bytes() == CUDNN_FILE.read_bytes()
