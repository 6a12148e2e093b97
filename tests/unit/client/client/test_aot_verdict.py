"""Before a boot, a vLLM 0.33/0.34 run's AOT artifact (tunecache.client.aot_verdict): torch's own
``SystemInfo`` of this machine against the tuner's, vLLM's environment factors, each difference
named; the per-pod inputs named apart, since they only change the name vLLM gives the artifact."""

from __future__ import annotations

from types import SimpleNamespace

from tests.support.torch_tests import IMPORTS_TORCH
from tunecache.client.aot_verdict import POD_GPU_NAME, aot_verdict, system_here
from tunecache.client.warm_state import compile_cache_verdict

#: torch's SystemInfo: these tests share one test process (``--dist loadgroup``).
pytestmark = IMPORTS_TORCH

AOT = "a" * 64


def recorded(system, **env):
    return {"vllm_version": "0.34.0", "aot": {
        "vllm_version": "0.34.0", "aot_dir": AOT, "ranks": [{"rank": 0, "dp_rank": 0, "device_index": 0,
                                                             "sha256": "b" * 64}],
        "env": {"CUDA_HOME": "/usr/local/cuda", "VLLM_P2P_SIDE_CHANNEL_PORT": 5710, "VLLM_USE_AOT_COMPILE": True, **env},
        "system": system}}


def test_system_here_is_torchs_own_with_the_pods_gpu():
    import platform

    import torch

    system = system_here("NVIDIA H100 NVL")
    assert system["python_version"] == platform.python_version() and system["torch_version"] == torch.__version__
    assert system["gpu_name"] == "NVIDIA H100 NVL" and system["toolkit_version"] == torch.version.cuda


def test_an_image_that_matches_depends_on_the_engine_and_names_the_per_pod_inputs():
    system = system_here("NVIDIA H100 80GB HBM3")
    env = {"CUDA_HOME": "/opt/cuda", "VLLM_P2P_SIDE_CHANNEL_PORT": 5711, "VLLM_USE_AOT_COMPILE": True}
    loads, why = aot_verdict(recorded(system), "0123456789abcdef", None, "0.34.0", env, system)
    assert loads is None, why
    assert "rank 0 on cuda:0" in why and "engine variant 0123456789abcdef" in why
    assert why.endswith("placed under this pod's own name although these differ: CUDA_HOME: tuner \"/usr/local/cuda\", "
                        "pod \"/opt/cuda\"; VLLM_P2P_SIDE_CHANNEL_PORT: tuner 5710, pod 5711")


def test_each_input_torch_or_vllm_would_refuse_is_named():
    tuner = {**system_here("NVIDIA H100 80GB HBM3"), "python_version": "3.12.1", "torch_version": "2.14.0",
             "toolkit_version": "13.0"}
    env = {"CUDA_HOME": "/usr/local/cuda", "VLLM_P2P_SIDE_CHANNEL_PORT": 5710, "VLLM_USE_AOT_COMPILE": False}
    loads, why = aot_verdict(recorded(tuner), None, None, "0.33.0", env, system_here("NVIDIA H100 NVL"))
    assert loads is False
    for named in ("vLLM version: tuner 0.34.0, pod 0.33.0", "environment VLLM_USE_AOT_COMPILE: tuner true, pod false",
                  "torch's SystemInfo would refuse it: Python: tuner \"3.12.1\"",
                  "torch's SystemInfo would refuse it: torch: tuner \"2.14.0\"",
                  "torch's SystemInfo would refuse it: CUDA toolkit: tuner \"13.0\"",
                  "torch's SystemInfo would refuse it: GPU: tuner \"NVIDIA H100 80GB HBM3\", pod \"NVIDIA H100 NVL\""):
        assert named in why, (named, why)


def test_doctors_compile_cache_verdict_of_an_aot_run_is_the_aot_verdict_for_the_pods_gpu():
    """Before, an AOT run's summary was read as 0.25's factors: "records no compile factors"."""
    run = SimpleNamespace(summary={"vllm_compile": recorded(system_here("NVIDIA H200"))}, variant=None)
    token = POD_GPU_NAME.set("NVIDIA H100 NVL")
    try:
        loads, why = compile_cache_verdict(run)
    finally:
        POD_GPU_NAME.reset(token)
    assert loads is False and "GPU: tuner \"NVIDIA H200\", pod \"NVIDIA H100 NVL\"" in why, why
