"""What the plugin reads of vLLM's own objects, as Protocols: the attributes it uses and no more,
so a function of the boot says which of vLLM's objects it takes without importing vLLM (the
plugin loads before vLLM's config modules, and with a stand-in vLLM in the CPU tests).

Each Protocol names the vLLM class it stands for, read from vLLM 0.25-0.34's own code:
``vllm/config/vllm.py::VllmConfig``, ``vllm/config/model.py::ModelConfig``,
``vllm/config/parallel.py::ParallelConfig``, ``vllm/config/scheduler.py::SchedulerConfig``,
``vllm/engine/arg_utils.py::EngineArgs``, ``vllm/v1/worker/gpu_model_runner.py::GPUModelRunner``
and ``vllm/v1/worker/gpu_worker.py::Worker``. Attributes a release may lack are read with
``getattr`` where used and are not declared here.
"""

from __future__ import annotations

from typing import Callable, Protocol, Union

#: A function of vLLM the plugin wraps (a hook target): whatever it takes and returns is passed through.
Hooked = Callable[..., object]

#: The values of plain JSON, as the engine arguments a pod hands its workers are.
Json = Union[None, bool, int, float, str, list["Json"], dict[str, "Json"]]


class ModelConfig(Protocol):
    """``vllm.config.ModelConfig``: where the weights are (``served_model_name`` read with ``getattr``)."""

    model: str


class ParallelConfig(Protocol):
    """``vllm.config.ParallelConfig``: the key's parallelism and this worker's data-parallel rank."""

    tensor_parallel_size: int
    data_parallel_rank: int


class SchedulerConfig(Protocol):
    """``vllm.config.SchedulerConfig``."""

    max_num_batched_tokens: int


class VllmConfig(Protocol):
    """``vllm.config.VllmConfig``: the engine's configuration (``compile_factors`` from 0.34 and
    ``instance_id``: read with ``getattr``)."""

    model_config: ModelConfig
    parallel_config: ParallelConfig
    scheduler_config: SchedulerConfig

    def compute_hash(self) -> str:
        """0.25-0.33 (gone in 0.34, whose compile cache the plugin places without it)."""
        ...


class ModelRunner(Protocol):
    """``GPUModelRunner``: the worker's runner, which FlashInfer's autotune hook receives."""

    vllm_config: VllmConfig


class GpuWorker(Protocol):
    """``vllm.v1.worker.gpu_worker.Worker``: the ``self`` of the hooked worker methods."""

    vllm_config: VllmConfig
    model_runner: ModelRunner


class CompiledModel(Protocol):
    """The model ``@support_torch_compile`` decorates: what ``_try_load_aot_compiled_fn(model, path)`` receives."""

    vllm_config: VllmConfig


class EngineArgs(Protocol):
    """``vllm.engine.arg_utils.EngineArgs`` as given, before vLLM fills its defaults (a dataclass;
    the parallelism beyond tensor parallelism read with ``getattr``)."""

    model: str
    max_num_batched_tokens: int | None
    tensor_parallel_size: int
