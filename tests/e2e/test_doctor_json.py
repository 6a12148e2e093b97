"""``tunecache doctor --json`` against a live ``tunecache serve``: the document a deployment
pipeline reads before a rollout (:class:`tunecache.client.doctor_report.DoctorReport`), per kind
what will load with this image's packages and why not, and doctor's exit code, which is pull's.

stdout is the document only, whatever happens (a miss, a refused run, an unreachable server, a
bad setting); stderr says nothing.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from importlib.metadata import version

import pytest

from tests.e2e.test_warm_state import push_warm_run
from tests.support.cli import MODEL, push, tunecache_executable
from tests.support.paths import CUDNN_FILE
from tests.support.serve import free_port
from tunecache.cli_kit import ExitCode
from tunecache.client.doctor_report import SCHEMA_VERSION, DoctorReport

# What this module tests happens on the pod: its server runs on SQLite only (tests/conftest.py).
SERVER_DATABASE_INCIDENTAL = True


def doctor_json(server, tmp_path, *extra, environment=CUDNN_FILE, stand_in_of=None,
                **env) -> tuple[DoctorReport, subprocess.CompletedProcess]:
    """``tunecache doctor --json`` on a pod whose packages include the stand-in vLLM (written by
    ``stand_in_of``, the plain one's by default); the document, validated against the model, and
    the process (stdout must be the document alone)."""
    from tests.support.vllm_stand_in import write_stand_in

    stand_in = (stand_in_of or write_stand_in)(tmp_path)
    full = {**os.environ, "PYTHONPATH": os.pathsep.join([str(stand_in), os.environ.get("PYTHONPATH", "")]),
            "VLLM_USE_AOT_COMPILE": "1", "VLLM_CACHE_ROOT": str(tmp_path / "doctor-vllm-cache"), **env}
    for name in [name for name, value in env.items() if value is None]:
        full.pop(name)
    command = [tunecache_executable(), "doctor", "--json", "--server", server, "--model", MODEL,
               "--max-num-batched-tokens", "8192", *(["--environment", str(environment)] if environment else []), *extra]
    result = subprocess.run(command, env=full, capture_output=True, text=True, timeout=120)
    assert result.stderr == "", result.stderr
    json.loads(result.stdout)  # the whole of stdout is one JSON document
    report = DoctorReport.model_validate_json(result.stdout)
    assert report.schema_version == SCHEMA_VERSION == 1
    assert report.exit_code == result.returncode
    return report, result


def test_a_run_that_loads_says_so_kind_by_kind_with_this_images_versions(server, tmp_path, node_signing_key):
    run_id = push_warm_run(server, tmp_path, node_signing_key, block_size=32)
    report, result = doctor_json(server, tmp_path)
    assert result.returncode == 0 and report.error is None and report.miss is None
    assert report.run is not None and report.run.id == run_id
    assert report.key is not None and report.key.model == MODEL and report.key.max_num_batched_tokens == 8192
    assert report.environment is not None and report.environment.cudnn_version == "91900"
    assert report.image.python == platform.python_version() and report.image.torch == version("torch")
    assert report.image.vllm == "0.25.0"  # the stand-in's, as vLLM names itself
    kinds = {k.kind: k for k in report.kinds}
    assert set(kinds) == set(report.run.artifacts) and "flashinfer_autotune_v1" in kinds
    assert kinds["flashinfer_autotune_v1"].loads is True
    assert kinds["triton_cache"].loads is True and kinds["triton_cache"].why.startswith("merged into ")
    assert kinds["vllm_modelinfos"].loads is True
    assert kinds["vllm_compile_cache"].loads is None  # the engine's arguments decide the rest
    assert kinds["vllm_compile_cache"].why.startswith("vLLM version, environment and traced sources match")


def test_kinds_built_with_other_packages_will_not_load_and_say_which(server, tmp_path, node_signing_key):
    """The new image's Triton is not the tuner's: its Triton and compile caches will not load,
    each naming the difference; the pod still takes the run (exit 0, as pull)."""
    from tunecache.formats.dependencies import installed_versions

    push_warm_run(server, tmp_path, node_signing_key, block_size=32,
                  dependencies={**installed_versions(), "triton": "0.0.1-the-tuners"})
    report, result = doctor_json(server, tmp_path)
    assert result.returncode == 0
    kinds = {k.kind: k for k in report.kinds}
    for kind in ("triton_cache", "vllm_compile_cache"):
        assert kinds[kind].loads is False
        assert kinds[kind].why.startswith("built with other packages: triton: node 0.0.1-the-tuners, pod ")
    assert kinds["flashinfer_autotune_v1"].loads is True and kinds["vllm_modelinfos"].loads is True


def test_a_run_the_pod_refuses_exits_14_and_says_why(server, tmp_path, node_signing_key):
    assert push(server).returncode == 0  # unsigned, and this pod trusts the node's key
    report, result = doctor_json(server, tmp_path)
    assert result.returncode == int(ExitCode.UNTRUSTED_RUN)
    assert report.run is not None and report.error == "tuning run 1 refused: run is unsigned; nothing would be installed"
    [tactics] = report.kinds
    assert tactics.loads is False and tactics.why.startswith("the run is refused, nothing of it installs: ")


def test_a_miss_exits_3_with_the_closest_runs_and_each_differing_field(server, tmp_path):
    assert push(server).returncode == 0
    other = tmp_path / "env.json"
    other.write_text(json.dumps(json.loads(CUDNN_FILE.read_text())["_metadata"] | {"flashinfer_version": "0.7.3"}))
    report, result = doctor_json(server, tmp_path, environment=other)
    assert result.returncode == int(ExitCode.NO_COMPATIBLE_TUNING)
    assert report.run is None and report.kinds == [] and report.environment.flashinfer_version == "0.7.3"
    [closest] = report.miss.closest
    assert [(d.field, d.stored, d.yours) for d in closest.differences] == [("flashinfer_version", "0.7.4", "0.7.3")]


def test_without_a_gpu_the_gpu_name_names_the_pods_gpu(server, tmp_path):
    """On a machine without a GPU FlashInfer says ``gpu: unknown``: ``--gpu-name`` names the GPU
    the pods will have, and the document is for it."""
    assert push(server).returncode == 0
    no_gpu = tmp_path / "no-gpu.json"
    no_gpu.write_text(json.dumps(json.loads(CUDNN_FILE.read_text())["_metadata"] | {"gpu": "unknown"}))
    report, result = doctor_json(server, tmp_path, "--gpu-name", "NVIDIA H200", environment=no_gpu,
                                 TUNECACHE_TRUSTED_KEYS=None)
    assert result.returncode == 0, report.error
    assert report.environment.gpu == "NVIDIA H200" and report.key.gpu_name == "NVIDIA H200"
    assert report.run is not None and report.run.id == 1


@pytest.mark.parametrize("case, code, said", [
    ("unreachable", ExitCode.SERVER_UNREACHABLE, "unreachable"),
    ("bad trusted keys", ExitCode.USAGE, "TUNECACHE_TRUSTED_KEYS"),
    ("bad environment file", ExitCode.BAD_INPUT, "cannot read environment file"),
])
def test_errors_are_the_document_too_with_the_exit_code(tmp_path, case, code, said):
    server = f"http://127.0.0.1:{free_port()}"
    env = {"TUNECACHE_TRUSTED_KEYS": str(tmp_path / "no-such-file")} if case == "bad trusted keys" else {}
    environment = tmp_path / "missing.json" if case == "bad environment file" else CUDNN_FILE
    report, result = doctor_json(server, tmp_path, environment=environment, **env)
    assert result.returncode == int(code) and said in report.error
    assert report.run is None and report.kinds == []


def test_a_0_34_runs_aot_artifact_names_each_input_that_makes_the_pod_miss(server, tmp_path, node_signing_key):
    """vLLM 0.33/0.34's run: doctor compares what the tuner recorded with this image (torch's
    SystemInfo, vLLM's environment factors) and names each difference, the per-pod ones
    (``CUDA_HOME``, side-channel ports: only the name vLLM gives the artifact) apart."""
    from tests.e2e.test_aot_placement import push_aot_run
    from tests.support.vllm_stand_in_aot import write_stand_in_aot
    from tunecache.contract import ArtifactKind

    push_aot_run(server, tmp_path, node_signing_key, {0: 0}, variant=True, CUDA_HOME="/usr/local/cuda-12.9")
    report, result = doctor_json(server, tmp_path, stand_in_of=write_stand_in_aot, STAND_IN_VLLM_VERSION="0.34.0",
                                 CUDA_HOME="/opt/cuda", VLLM_P2P_SIDE_CHANNEL_PORT="5800")
    assert result.returncode == 0, report.error
    assert report.image.vllm == "0.34.0"
    [compiled] = [k for k in report.kinds if k.kind is ArtifactKind.VLLM_COMPILE_CACHE]
    assert compiled.loads is False, compiled.why
    assert compiled.why.startswith("vLLM would compile again: ")
    # this image's torch is a CPU build: torch.version.cuda is None, the tuner's was CUDA 12.9
    assert "torch's SystemInfo would refuse it: CUDA toolkit: tuner \"12.9\", pod null" in compiled.why
    placed = compiled.why.split("placed under this pod's own name although these differ: ")[1]
    assert "CUDA_HOME: tuner \"/usr/local/cuda-12.9\", pod \"/opt/cuda\"" in placed
    assert "VLLM_P2P_SIDE_CHANNEL_PORT: tuner 5710, pod 5800" in placed
