"""What the boot reads of vLLM (tunecache.client.boot.engine): the main process's questions to
NVML instead of CUDA, and the engine arguments that name an engine variant."""

from __future__ import annotations

from tests.support.torch_tests import IMPORTS_TORCH


def _platform_module(names: dict[int, str], capability: tuple[int, int]):
    """A ``vllm.platforms`` whose ``current_platform`` answers as vLLM's NVML platform does."""
    import types
    from collections import namedtuple

    capability_type = namedtuple("DeviceCapability", "major minor")
    asked: list[tuple[str, int]] = []

    class Platform:
        @staticmethod
        def get_device_name(device_id=0):
            asked.append(("name", device_id))
            return names[device_id]

        @staticmethod
        def get_device_capability(device_id=0):
            asked.append(("capability", device_id))
            return capability_type(*capability)

    module = types.ModuleType("vllm.platforms")
    module.current_platform = Platform()
    return module, asked


@IMPORTS_TORCH
def test_the_main_process_asks_nvml_not_cuda(monkeypatch):
    """FlashInfer's import asks torch for the GPU's capability and _collect_metadata for its
    name; in the engine's main process vLLM's platform (NVML) answers, and torch's own
    functions are back afterwards."""
    import sys
    import types

    import torch

    from tunecache.client.boot.engine import cuda_answered_by_nvml

    platforms, asked = _platform_module({0: "NVIDIA H200", 1: "NVIDIA H100 80GB HBM3"}, (9, 0))
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    monkeypatch.setitem(sys.modules, "vllm.platforms", platforms)
    originals = (torch.cuda.get_device_name, torch.cuda.get_device_capability, torch.cuda.current_device)
    with cuda_answered_by_nvml():
        assert torch.cuda.get_device_capability() == (9, 0)
        assert torch.cuda.get_device_capability(torch.device("cuda", 1)) == (9, 0)
        assert torch.cuda.get_device_name("cuda:1") == "NVIDIA H100 80GB HBM3"
        assert torch.cuda.get_device_name(0) == "NVIDIA H200"
        assert torch.cuda.current_device() == 0
        assert not torch.cuda.is_initialized()
    assert asked == [("capability", 0), ("capability", 1), ("name", 1), ("name", 0)]
    assert (torch.cuda.get_device_name, torch.cuda.get_device_capability, torch.cuda.current_device) == originals


@IMPORTS_TORCH
def test_without_vllms_platform_torch_answers(monkeypatch):
    import sys

    import torch

    from tunecache.client.boot.engine import cuda_answered_by_nvml

    monkeypatch.setitem(sys.modules, "vllm.platforms", None)  # import fails
    original = torch.cuda.get_device_capability
    with cuda_answered_by_nvml():
        assert torch.cuda.get_device_capability is original


def test_the_engine_args_that_name_a_variant_are_the_non_default_plain_ones():
    import dataclasses

    from tunecache.client.boot.engine import engine_args_of

    @dataclasses.dataclass
    class CompilationConfig:  # vLLM's config objects are dataclasses too
        mode: int = 3
        cudagraph_capture_sizes: list | None = None
        cache_dir: str = ""
        inductor_passes: dict = dataclasses.field(default_factory=dict)

    @dataclasses.dataclass
    class EngineArgs:  # vLLM's EngineArgs is a dataclass of this kind
        model: str = "x"
        max_model_len: int | None = None
        gpu_memory_utilization: float = 0.9
        compilation_config: CompilationConfig = dataclasses.field(default_factory=CompilationConfig)
        hf_overrides: dict = dataclasses.field(default_factory=dict)
        download_dir: str | None = None
        seed: int = 0
        kv_cache_dtype: str = "auto"
        logits_processors: object = None

    args = EngineArgs(model="/models/llama", max_model_len=8192,
                      compilation_config=CompilationConfig(cudagraph_capture_sizes=[1, 2, 4], cache_dir="/mnt/cc",
                                                           inductor_passes={"post_grad": "mod.fn"}),
                      hf_overrides={"rope_scaling": {"factor": 2.0}}, download_dir="/mnt/models", seed=7,
                      kv_cache_dtype="auto", logits_processors=object())
    # only what the contract's allow-list takes (the service refuses a report with any other):
    # hf_overrides can name code to import (auto_map), inductor_passes a module
    assert engine_args_of(args) == {"compilation_config": {"cudagraph_capture_sizes": [1, 2, 4]}, "max_model_len": 8192}
    assert engine_args_of(EngineArgs()) == {}
    assert engine_args_of(object()) == {}
