"""Nothing a run carries picks a path on a pod: the FlashInfer workspace a run records
(``summary.flashinfer_jit.workspace_subdir``) is compared with the pod's own, never made
into a path.

Played against a live server with signed runs whose layout names ``/etc/x`` or
``../../../../tmp/x``, pulled by the real ``tunecache pull --layout vllm --jit`` in a pod
with FlashInfer (the one installed here) and in one without it (a ``flashinfer`` package on
``PYTHONPATH`` that cannot be imported, as in an init container's image).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import forked
from tests.support.cli import tunecache_executable
from tests.support.paths import CUDNN_FILE
from tests.support.serve import as_admin
from tests.support.builders import run_payload, signed
from tests.support.jit import fake_workspace
from tunecache.formats.jit_module import module_tarball

# What this module tests happens on the pod: its server runs on SQLite only (tests/conftest.py).
SERVER_DATABASE_INCIDENTAL = True

MODEL = "meta-llama/Llama-3.1-8B"
MODULE = "batch_prefill_bf16_h128"
CONFIG_HASH = "cd" * 32
RANK_FILE = "autotune_configs_dp0_rank0.json"
HOSTILE = ["/etc/x", "../../../../tmp/x"]


def publish(server: str, tmp_path: Path, signing_key, workspace_subdir: str) -> None:
    """A run signed by the fleet's node, with one JIT module, recording ``workspace_subdir``."""
    module = module_tarball(fake_workspace(tmp_path / f"node-{hashlib.sha256(workspace_subdir.encode()).hexdigest()[:8]}"),
                            MODULE)
    for blob in (CUDNN_FILE.read_bytes(), module):
        assert as_admin.put(f"{server}/v1/artifacts/{hashlib.sha256(blob).hexdigest()}", content=blob).status_code in (200, 201)
    payload = run_payload(CUDNN_FILE, summary={"entries": 42, "flashinfer_jit": {"workspace_subdir": workspace_subdir}})
    payload["artifacts"].append({"kind": "flashinfer_jit_module", "name": f"flashinfer-jit/{MODULE}.tar.gz",
                                 "media_type": "application/gzip", "sha256": hashlib.sha256(module).hexdigest()})
    answer = as_admin.post(f"{server}/v1/tunings", json=signed(payload, signing_key))
    assert answer.status_code == 201 and answer.json()["is_current"], answer.text


def pod_env(tmp_path: Path, flashinfer: bool) -> dict[str, str]:
    env = {**os.environ, "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "pod-home"),
           "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache")}
    env.pop("VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR", None)
    if not flashinfer:
        blocked = tmp_path / "image-without-flashinfer"
        (blocked / "flashinfer").mkdir(parents=True, exist_ok=True)
        (blocked / "flashinfer" / "__init__.py").write_text('raise ImportError("no flashinfer in this image")\n')
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(blocked), env.get("PYTHONPATH")]))
    return env


def pull(server: str, env: dict[str, str], *extra: str) -> subprocess.CompletedProcess:
    return forked.run(["pull", "--server", server, "--model", MODEL, "--max-num-batched-tokens", "8192",
                       "--environment", str(CUDNN_FILE), "--layout", "vllm", "--vllm-config-hash", CONFIG_HASH, "--jit",
                       *extra], env=env)


def where_the_run_pointed(tmp_path: Path, subdir: str) -> list[Path]:
    """Every place the run's ``workspace_subdir`` would reach if a pod joined it to its roots."""
    return [Path(os.path.normpath(root / subdir)) for root in (
        tmp_path / "pod-home" / ".cache" / "flashinfer", tmp_path / "vllm-cache" / "flashinfer_autotune_cache")]


def state(path: Path):
    """What a path holds now (to see that a pull changed nothing there)."""
    if not os.path.lexists(path):
        return None
    return path.lstat().st_mtime_ns, sorted(os.listdir(path)) if path.is_dir() else None


@pytest.fixture
def outside():
    """``/etc/x`` and ``/tmp/x`` as they were before the test; asserts they are so after it."""
    paths = [Path("/etc/x"), Path("/tmp/x")]
    before = {p: state(p) for p in paths}
    yield
    assert {p: state(p) for p in paths} == before


def pod_workspace(env: dict[str, str]) -> tuple[Path, str]:
    """The pod's own FlashInfer workspace and its ``<version>/<archs>``, as its FlashInfer says."""
    code = ("import json; from tunecache.client.jit_install import flashinfer_workspace as w; "
            "print(json.dumps(None if w() is None else [str(w().path), w().subdir]))")
    found = json.loads(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                      check=True).stdout)
    if found is None:
        pytest.skip("FlashInfer is not importable here")
    return Path(found[0]), found[1]


@pytest.mark.parametrize("subdir", HOSTILE)
def test_a_pod_without_flashinfer_installs_only_where_it_says(server, tmp_path, node_signing_key, outside, subdir):
    publish(server, tmp_path, node_signing_key, subdir)
    env = pod_env(tmp_path, flashinfer=False)

    nowhere = pull(server, env)  # no vLLM, no FlashInfer, no --dest: the pod cannot tell its root
    assert nowhere.returncode == 2 and "cannot tell FlashInfer's version/arch directory here" in nowhere.stderr
    assert not (tmp_path / "vllm-cache").exists() and not (tmp_path / "pod-home").exists()

    named = pull(server, env, "--dest", str(tmp_path / "pod-root"))
    assert named.returncode == 0, named.stderr
    assert Path(named.stdout.strip()) == tmp_path / "pod-root" / CONFIG_HASH / RANK_FILE
    assert (tmp_path / "pod-root" / CONFIG_HASH / RANK_FILE).read_bytes() == CUDNN_FILE.read_bytes()
    [line] = [line for line in named.stderr.splitlines() if "JIT modules" in line]
    assert line == ("tunecache: 1 FlashInfer JIT modules not installed: FlashInfer is not importable here, so this "
                    "pod's FlashInfer workspace is unknown (tunecache pull --jit-workspace DIR names one) "
                    "(the tactics are installed)")
    assert not (tmp_path / "vllm-cache").exists() and not (tmp_path / "pod-home").exists()

    workspace = tmp_path / "pod-workspace"  # a workspace the pod names itself
    both = pull(server, env, "--dest", str(tmp_path / "pod-root"), "--jit-workspace", str(workspace))
    assert both.returncode == 0 and f"installed 1 FlashInfer JIT modules into {workspace}" in both.stderr, both.stderr
    assert (workspace / "cached_ops" / MODULE / f"{MODULE}.so").is_file()
    for pointed in where_the_run_pointed(tmp_path, subdir):
        assert not os.path.lexists(pointed), pointed


@pytest.mark.parametrize("subdir", HOSTILE)
def test_a_pod_with_flashinfer_uses_its_own_root_and_skips_modules_built_elsewhere(server, tmp_path, node_signing_key,
                                                                                    outside, subdir):
    env = pod_env(tmp_path, flashinfer=True)
    workspace, own_subdir = pod_workspace(env)
    assert workspace.is_relative_to(tmp_path / "pod-home")
    publish(server, tmp_path, node_signing_key, subdir)

    pulled = pull(server, env)
    assert pulled.returncode == 0, pulled.stderr
    root = tmp_path / "vllm-cache" / "flashinfer_autotune_cache" / workspace.parent.name / workspace.name  # vLLM's rule
    assert Path(pulled.stdout.strip()) == root / CONFIG_HASH / RANK_FILE
    assert (root / CONFIG_HASH / RANK_FILE).read_bytes() == CUDNN_FILE.read_bytes()
    [line] = [line for line in pulled.stderr.splitlines() if "JIT modules" in line]
    assert line.startswith(f"tunecache: 1 FlashInfer JIT modules not installed, built elsewhere: "
                           f"workspace_subdir: node {subdir}, here {own_subdir}")
    assert not (workspace / "cached_ops").exists()
    assert [p.relative_to(tmp_path / "vllm-cache") for p in (tmp_path / "vllm-cache").rglob("*") if p.is_file()] == \
        [(root / CONFIG_HASH / RANK_FILE).relative_to(tmp_path / "vllm-cache")]
    for pointed in where_the_run_pointed(tmp_path, subdir):
        assert not os.path.lexists(pointed), pointed


def test_a_run_for_the_pods_own_flashinfer_installs_into_its_own_workspace(server, tmp_path, node_signing_key):
    env = pod_env(tmp_path, flashinfer=True)
    workspace, own_subdir = pod_workspace(env)
    publish(server, tmp_path, node_signing_key, own_subdir)
    pulled = pull(server, env)
    assert pulled.returncode == 0 and f"installed 1 FlashInfer JIT modules into {workspace}" in pulled.stderr, pulled.stderr
    assert (workspace / "cached_ops" / MODULE / f"{MODULE}.so").is_file()


def test_a_full_volume_midway_leaves_no_jit_module_installed_either(server, tmp_path, node_signing_key):
    """All or nothing: the module's small files fit, the rank files do not (writes past 4 kB
    fail as a full volume fails); the module that went in first is taken back (it was left
    installed, with exit 12)."""
    import resource
    import signal

    publish(server, tmp_path, node_signing_key, "0.6.13/90a")
    env = pod_env(tmp_path, flashinfer=True)
    env["FLASHINFER_WORKSPACE_BASE"] = str(tmp_path / "pod-home")

    def small_volume():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    result = subprocess.run(
        [tunecache_executable(), "pull", "--server", server, "--model", MODEL, "--max-num-batched-tokens", "8192",
         "--environment", str(CUDNN_FILE), "--layout", "vllm", "--vllm-config-hash", CONFIG_HASH, "--jit",
         "--jit-workspace", str(tmp_path / "workspace")],
        env=env, capture_output=True, text=True, timeout=120, preexec_fn=small_volume)
    assert result.returncode == 12, result.stderr
    assert not (tmp_path / "workspace" / "cached_ops" / MODULE).exists(), result.stderr
    assert not (tmp_path / "vllm-cache" / "flashinfer_autotune_cache").exists() or not any(
        (tmp_path / "vllm-cache" / "flashinfer_autotune_cache").rglob(RANK_FILE))


def test_a_module_whose_build_ninja_names_an_include_directory_the_pod_lacks_is_left_out(server, tmp_path,
                                                                                         node_signing_key):
    """Installed for ninja (pull --jit), a module whose build.ninja points at headers this pod
    does not have would fail or build again: it is left out, and the directory is named."""
    node = fake_workspace(tmp_path / "node-includes")
    (node / "cached_ops" / MODULE / "build.ninja").write_text(
        "cflags = -isystem /opt/tuner-only/tvm_ffi/include -O3\nrule nvcc\n")
    module = module_tarball(node, MODULE)
    for blob in (CUDNN_FILE.read_bytes(), module):
        assert as_admin.put(f"{server}/v1/artifacts/{hashlib.sha256(blob).hexdigest()}", content=blob).status_code in (200, 201)
    payload = run_payload(CUDNN_FILE, summary={"entries": 42, "flashinfer_jit": {"workspace_subdir": "0.6.13/90a"}})
    payload["artifacts"].append({"kind": "flashinfer_jit_module", "name": f"flashinfer-jit/{MODULE}.tar.gz",
                                 "media_type": "application/gzip", "sha256": hashlib.sha256(module).hexdigest()})
    assert as_admin.post(f"{server}/v1/tunings", json=signed(payload, node_signing_key)).status_code == 201
    result = pull(server, pod_env(tmp_path, flashinfer=True), "--jit-workspace", str(tmp_path / "workspace"))
    assert result.returncode == 0, result.stderr
    assert ("1 FlashInfer JIT modules not installed: module batch_prefill_bf16_h128's build.ninja names include "
            "directories this pod lacks: /opt/tuner-only/tvm_ffi/include") in result.stderr
    assert not (tmp_path / "workspace" / "cached_ops" / MODULE).exists()
