"""What vLLM tells about the engine being booted, from vLLM's own functions and config: the
pod's key, each worker's place in its pod, the engine's compile factors as this pod computes
them, the arguments that name its engine variant, and the main process's FlashInfer environment
asked without initializing CUDA. Used by the plugin's hooks (:mod:`tunecache.client.boot.hooks`);
vLLM is imported inside each function, so importing this module needs no vLLM.
"""

from __future__ import annotations

import contextlib
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:  # the pod's settings, imported only where it is booted (not with the plugin)
    from tunecache.client.settings import ClientSettings
    from tunecache.contract import EnvironmentMetadata, TuningKey
    from tunecache.engines.vllm.compile_cache import CompileFactors, PodCompileFactors
    from tunecache.engines.vllm.objects import EngineArgs, Json, ModelConfig, ModelRunner, VllmConfig
    from tunecache.engines.vllm.releases import VllmRelease


def pod_compile_factors(config: VllmConfig, node: CompileFactors) -> PodCompileFactors:
    """This worker's :class:`tunecache.engines.vllm.compile_cache.PodCompileFactors` for the node's
    ``node`` (:class:`~tunecache.engines.vllm.compile_cache.CompileFactors`), from vLLM's own
    functions: ``vllm.envs.compile_factors()``, ``VllmConfig.compute_hash()`` (also with
    ``ModelConfig.model`` set to the node's, so that where the model lives is no difference)
    and the sha256 of the node's traced source files as this pod has them, each looked up
    where this pod imports its module from (another package prefix: the pod's own paths and
    code hash, :func:`tunecache.engines.vllm.compile_cache.traced_files_here`)."""
    import json

    import vllm
    import vllm.envs as envs

    from tunecache.engines.vllm.compile_cache import (PodCompileFactors, config_hashes, model_named, traced_files_here,
                                                 variant_factors)

    with model_named(config, node.model):
        as_node, hashes_as_node = config.compute_hash(), config_hashes(config)
    digests, moved, own_code_hash = traced_files_here(dict(node.traced_files))
    env = json.loads(json.dumps(envs.compile_factors(), default=str))
    return PodCompileFactors(
        vllm_version=vllm.__version__, env=env,
        config_hash=config.compute_hash(), config_hash_as_node=as_node, config_hashes_as_node=hashes_as_node,
        traced_files=digests, traced_here=moved, code_hash=own_code_hash,
        variant_factors=variant_factors(config, env, vllm.__version__, _model_name(config.model_config)),
    )


@contextlib.contextmanager
def cuda_answered_by_nvml() -> Iterator[None]:
    """Within: ``torch.cuda.get_device_name``, ``get_device_capability`` and
    ``current_device`` answered by vLLM's ``current_platform`` (NVML), which initializes no
    CUDA context. For the engine's main process: FlashInfer asks torch for the GPU's
    capability when ``flashinfer.jit.env`` is first imported (``CompilationContext``, for
    its workspace's arch folder) and for its name in ``_collect_metadata()``; either would
    initialize CUDA there, and vLLM then starts its engine core with ``spawn`` instead of
    ``fork``: every import again, 15 s of a 32 s boot measured on the H200. Where vLLM's
    platform cannot answer (no NVML, a stand-in vLLM), nothing is replaced."""
    try:
        import torch
        from vllm.platforms import current_platform

        platform_name, platform_capability = current_platform.get_device_name, current_platform.get_device_capability
    except Exception:
        yield
        return

    def index(device: object = None) -> int:  # an index, "cuda:1", a torch.device or None
        if device is None:
            return 0
        if isinstance(device, int):
            return device
        if isinstance(device, str):
            return int(device.rsplit(":", 1)[1]) if ":" in device else 0
        return getattr(device, "index", None) or 0  # torch.device

    def get_device_capability(device: object = None) -> tuple[int, int]:
        capability = platform_capability(index(device))
        if capability is None:
            raise RuntimeError("NVML gave no capability")
        return (int(capability.major), int(capability.minor))

    replaced = {"get_device_name": lambda device=None: platform_name(index(device)),
                "get_device_capability": get_device_capability, "current_device": lambda: 0}
    saved = {name: getattr(torch.cuda, name) for name in replaced}
    for name, function in replaced.items():
        setattr(torch.cuda, name, function)
    try:
        yield
    finally:
        for name, function in saved.items():
            setattr(torch.cuda, name, function)


def main_process_environment(settings: ClientSettings):
    """This pod's FlashInfer environment in the engine's main process:
    ``TUNECACHE_ENVIRONMENT_FILE`` when set, else FlashInfer's own
    ``flashinfer.autotuner._collect_metadata()``, called under :func:`cuda_answered_by_nvml`
    (it asks ``torch.cuda.get_device_name``)."""
    from tunecache.client.environment import environment_from_file
    from tunecache.contract import EnvironmentMetadata

    if settings.environment_file:
        return environment_from_file(settings.environment_file)
    from flashinfer.autotuner import _collect_metadata

    return EnvironmentMetadata.from_flashinfer_metadata(_collect_metadata())  # under cuda_answered_by_nvml()


def engine_args_key(engine_args: EngineArgs, environment: EnvironmentMetadata, settings: ClientSettings) -> TuningKey:
    """The pod's key from vLLM's ``EngineArgs`` as given (before vLLM fills its defaults)."""
    served = getattr(engine_args, "served_model_name", None)
    if isinstance(served, (list, tuple)):
        served = served[0] if served else None
    return _key(environment, settings, served if isinstance(served, str) and served else str(engine_args.model),
                engine_args.max_num_batched_tokens, engine_args.tensor_parallel_size,
                getattr(engine_args, "data_parallel_size", 1), bool(getattr(engine_args, "enable_expert_parallel", False)),
                getattr(engine_args, "prefill_context_parallel_size", 1))


def config_key(config: VllmConfig, environment: EnvironmentMetadata, settings: ClientSettings) -> TuningKey:
    """The pod's key from vLLM's ``VllmConfig`` (as :meth:`VllmWorker.key`)."""
    parallel = config.parallel_config
    return _key(environment, settings, _model_name(config.model_config), config.scheduler_config.max_num_batched_tokens,
                parallel.tensor_parallel_size, getattr(parallel, "data_parallel_size", 1),
                bool(getattr(parallel, "enable_expert_parallel", False)),
                getattr(parallel, "prefill_context_parallel_size", 1))


def _key(environment: EnvironmentMetadata, settings: ClientSettings, model: str, max_num_batched_tokens: int, tp: int, dp: int,
         ep: bool, pcp: int) -> TuningKey:
    from tunecache.client.environment import pod_key
    from tunecache.contract import expert_parallel_size

    return pod_key(environment.gpu, model, int(max_num_batched_tokens), dtype=settings.dtype,
                   quantization=settings.quantization, tensor_parallel_size=int(tp), data_parallel_size=int(dp),
                   expert_parallel_size=expert_parallel_size(int(tp), int(dp), ep, int(pcp or 1)))


class SingleProcessLayout(Exception):
    """vLLM 0.25's layout in an engine of several processes: vLLM tunes every rank itself
    and reads no autotune file, so there is nothing to install tactics into."""


@dataclass(frozen=True)
class VllmWorker:
    """This worker as vLLM tells it (a :class:`tunecache.client.boot.coordination.Worker`): its place in
    the pod, its key and its FlashInfer layout, all from vLLM's own functions and config."""

    runner: ModelRunner
    """vLLM's model runner (``runner.vllm_config``)."""
    settings: ClientSettings
    """This worker's :class:`tunecache.client.settings.ClientSettings` (the key's dtype and quantization)."""
    release: VllmRelease | None = None
    """This process's vLLM release (:class:`tunecache.engines.vllm.releases.VllmRelease`): its autotune
    layout where vLLM's own functions do not tell it."""

    def pod(self):
        """Where this worker's vLLM reads its FlashInfer autotune file
        (:class:`tunecache.client.boot.coordination.Pod`), in either layout of
        ``vllm/model_executor/warmup/flashinfer_autotune_cache.py``:

        * vLLM 0.33: ``flashinfer_autotune_root()/flashinfer_autotune_cache_hash(runner)/
          flashinfer_autotune_filename(dp_rank, rank)`` (named here by
          :func:`tunecache.engines.vllm.paths.vllm_rank_file_name`), one file per rank of the
          world group;
        * vLLM 0.25: ``resolve_flashinfer_autotune_file(runner)`` (the same root and hash,
          ``autotune_configs.json``), read by a single-process engine only
          (``kernel_warmup.flashinfer_autotune``: with a world size above 1 every rank tunes).

        Raises:
            SingleProcessLayout: vLLM 0.25's layout with a world size above 1.
            AttributeError: neither layout (another vLLM).
        """
        from vllm.distributed.parallel_state import get_world_group
        from vllm.model_executor.warmup import flashinfer_autotune_cache as cache

        from tunecache.engines.vllm.paths import shared_autotune_file_names, vllm_rank_file_name
        from tunecache.client.boot.coordination import Pod

        group = get_world_group()
        config = self.runner.vllm_config
        dp_rank, rank = int(config.parallel_config.data_parallel_rank), int(group.rank_in_group)
        world_size = int(getattr(group, "world_size", 1))
        shared: tuple[str, ...] = ()
        # vLLM's own functions where the release has them (the root layout's), else its row
        if hasattr(cache, "flashinfer_autotune_root"):
            layout = "root"
        else:
            layout = self.release.autotune_layout if self.release is not None and self.release.autotune_layout != "root" \
                else "single-process"
        if layout == "root":
            root, config_hash = Path(cache.flashinfer_autotune_root()), str(cache.flashinfer_autotune_cache_hash(self.runner))
            names = tuple(vllm_rank_file_name(dp_rank, r) for r in range(world_size))
            own, shared = names[rank], shared_autotune_file_names()
        else:
            if layout == "single-process" and world_size > 1:
                raise SingleProcessLayout(f"this vLLM tunes every rank of a {world_size}-process engine itself and reads "
                                          "no autotune file (vLLM 0.25's and 0.26's kernel_warmup.flashinfer_autotune)")
            path = Path(cache.resolve_flashinfer_autotune_file(self.runner))
            root, config_hash = path.parent.parent, path.parent.name
            if layout == "per-rank":  # vLLM 0.32: <stem>_dp{dp}_rank{rank}<suffix> beside it, one per rank
                names = tuple(f"{path.stem}_dp{dp_rank}_rank{r}{path.suffix}" for r in range(world_size))
                own = names[rank]
            else:  # single-process, or broadcast (0.27-0.31): rank 0 reads the one file and sends it to the others
                names, own = (path.name,), path.name
        return Pod(root=root, config_hash=config_hash, rank=rank, instance=_instance_id(config), file_names=names,
                   rank_file=root / config_hash / own, shared_names=shared)

    def key(self, environment: EnvironmentMetadata) -> TuningKey:
        """The pod's :class:`tunecache.contract.TuningKey`: ``environment``'s GPU, the served
        model, vLLM's ``max_num_batched_tokens`` and parallelism (``ParallelConfig``)."""
        return config_key(self.runner.vllm_config, environment, self.settings)

    def uses_v2(self) -> bool:
        """vLLM's ``use_flashinfer_autotune_v2()`` (FlashInfer's v2 store, single rank)."""
        from vllm.model_executor.warmup import flashinfer_autotune_cache, kernel_warmup

        check = getattr(kernel_warmup, "use_flashinfer_autotune_v2", None) or getattr(
            flashinfer_autotune_cache, "use_flashinfer_autotune_v2", None
        )
        return bool(check and check())


def _instance_id(config: VllmConfig) -> str:
    """The boot's identity shared by its workers: vLLM's ``VllmConfig.instance_id`` (set in
    ``__post_init__`` when empty), else the parent process, told apart from an earlier
    process with the same pid (a container's pids repeat across boots) by its start time."""
    instance = getattr(config, "instance_id", None)
    if isinstance(instance, str) and instance:
        return instance
    parent = os.getppid()
    try:
        started = Path(f"/proc/{parent}/stat").read_text().rsplit(")", 1)[1].split()[19]
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except (OSError, IndexError):
        started, boot = "?", "?"
    return f"ppid:{socket.gethostname()}:{boot}:{parent}:{started}"


def _model_name(model_config: ModelConfig) -> str:
    """The model of the pod's key: vLLM's ``served_model_name`` (its first name when a list),
    which vLLM sets to ``model`` when none is given (``vllm/config/model.py::
    get_served_model_name``). A pod that loads its weights from a local directory
    (``model=/models/llama``) names the model it serves with ``--served-model-name
    meta-llama/Llama-3.1-8B``, and asks for that model's tuning."""
    served = getattr(model_config, "served_model_name", None)
    if isinstance(served, (list, tuple)):
        served = served[0] if served else None
    return served if isinstance(served, str) and served else model_config.model


#: ``EngineArgs`` fields never reported: the key's own, where the model and its files live, and
#: what changes no compiled kernel of the engine (ports, logging, seeds).
_NOT_VARIANT_ARGS = frozenset({
    "model", "served_model_name", "tokenizer", "download_dir", "load_format", "skip_tokenizer_init", "hf_config_path",
    "max_num_batched_tokens", "tensor_parallel_size", "data_parallel_size", "enable_expert_parallel", "dtype",
    "quantization", "seed", "revision", "code_revision", "tokenizer_revision", "hf_token", "trust_remote_code",
    "disable_log_stats", "enable_log_requests", "worker_cls", "worker_extension_cls", "allowed_local_media_path",
})


def _plain(value: object) -> Json | object:
    """``value`` as plain JSON data (numbers, strings, booleans, ``None``, lists and objects
    of those; a tuple as a list), or :data:`_NOT_PLAIN`."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        items = [_plain(v) for v in value]
        return _NOT_PLAIN if any(i is _NOT_PLAIN for i in items) else items
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        items = {k: _plain(v) for k, v in value.items()}
        return _NOT_PLAIN if any(i is _NOT_PLAIN for i in items.values()) else items
    return _NOT_PLAIN


_NOT_PLAIN = object()


def engine_args_of(engine_args: object, nested: bool = True) -> dict[str, Json]:
    """A vLLM ``EngineArgs``' fields whose value differs from the field's default, as plain
    JSON, but :data:`_NOT_VARIANT_ARGS` and paths: the arguments that name the pod's engine
    variant, as ``tune --engine-args`` (``vllm.LLM``) takes them. A field that holds a config
    object (``compilation_config``: vLLM's ``CompilationConfig``) becomes the object of its own
    non-default plain fields, as ``vllm.LLM`` takes it too. Only what the contract's allow-list
    takes (:func:`tunecache.contract.engine_args.allowed_engine_args`: the service refuses a
    report with any other), so at most :data:`tunecache.contract.identity.MAX_ENGINE_ARGS`, each
    at most :data:`~tunecache.contract.identity.MAX_ENGINE_ARG_CHARS` characters of JSON, by name."""
    import dataclasses

    from tunecache.contract.engine_args import allowed_engine_args

    if not dataclasses.is_dataclass(engine_args):
        return {}
    found: dict[str, Json] = {}
    for field in sorted(dataclasses.fields(engine_args), key=lambda f: f.name):
        if field.name in _NOT_VARIANT_ARGS or field.name.startswith("_") or "path" in field.name or "dir" in field.name:
            continue
        value = getattr(engine_args, field.name, None)
        if field.default is not dataclasses.MISSING:
            default = field.default
        elif field.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            try:
                default = field.default_factory()  # type: ignore[misc]
            except Exception:
                continue
        else:
            continue
        if nested and dataclasses.is_dataclass(value) and not isinstance(value, type):
            plain = engine_args_of(value, nested=False) or _NOT_PLAIN
        else:
            plain = _plain(value)
            if plain is not _NOT_PLAIN and plain == _plain(default):
                continue
        if plain is _NOT_PLAIN:
            continue
        found[field.name] = plain
    return allowed_engine_args(found) if nested else found
