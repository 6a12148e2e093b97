"""The pod's side of a tuning's identity: its FlashInfer environment and its GPU.

On a GPU with FlashInfer importable, the environment is exactly what FlashInfer itself
will compare when it loads a cache file (``flashinfer.autotuner._collect_metadata``).
Elsewhere (a laptop, a CPU-only CI) it is read from a file: a FlashInfer cache file's
``_metadata`` block, or a JSON object of those fields.
"""

from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path

from tunecache.client.local_files import FileTooLarge, read_bounded
from tunecache.contract import DEFAULT_ENGINE, ENVIRONMENT_FIELDS, MAX_AUTOTUNE_FILE_BYTES, EnvironmentMetadata, TuningKey
from tunecache.formats.arch import arch_for_gpu_name, arch_from_capability
from tunecache.formats.autotune_file import NotAnAutotuneFile, parse_autotune_file


class EnvironmentUnavailable(RuntimeError):
    """The environment (or GPU) cannot be determined here; the message says what to pass instead."""


def detect_environment() -> EnvironmentMetadata:
    """This process's FlashInfer environment metadata.

    Source: ``flashinfer.autotuner._collect_metadata()`` (FlashInfer 0.7.4), the function
    ``AutoTuner.load_configs`` compares cache files against.

    Raises:
        EnvironmentUnavailable: flashinfer is not importable.
    """
    try:
        from flashinfer.autotuner import _collect_metadata
    except Exception as exc:  # ImportError, or a broken CUDA stack under it
        raise EnvironmentUnavailable(
            f"cannot detect the FlashInfer environment ({type(exc).__name__}: {exc}); "
            "pass --environment FILE (a FlashInfer cache file or a JSON object of its _metadata fields)"
        ) from None
    return EnvironmentMetadata.from_flashinfer_metadata(_collect_metadata())


def environment_from_file(path: Path) -> EnvironmentMetadata:
    """Environment metadata from a FlashInfer cache file or a JSON object of the fields.

    Raises:
        EnvironmentUnavailable: unreadable, not JSON, or fields missing (named).
    """
    try:
        data = read_bounded(path, MAX_AUTOTUNE_FILE_BYTES)  # a FlashInfer cache file at most; never a device whole
    except FileTooLarge:
        raise EnvironmentUnavailable(f"environment file {path} is over {MAX_AUTOTUNE_FILE_BYTES:,} bytes "
                                     "(a FlashInfer autotune file is at most that)") from None
    except OSError as exc:
        raise EnvironmentUnavailable(f"cannot read environment file {path}: {exc.strerror}") from None
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise EnvironmentUnavailable(f"environment file {path} is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise EnvironmentUnavailable(f"environment file {path} is not a JSON object")
    if "_metadata" in doc:  # a FlashInfer cache file
        try:
            return parse_autotune_file(data, source=str(path)).environment
        except NotAnAutotuneFile as exc:
            raise EnvironmentUnavailable(str(exc)) from None
    # every field but cutlass_dsl_version, which FlashInfer 0.6 does not track (NOT_TRACKED)
    missing = [f for f in ENVIRONMENT_FIELDS if f not in doc and f != "cutlass_dsl_version"]
    if missing:
        raise EnvironmentUnavailable(f"environment file {path} lacks fields: {', '.join(missing)}")
    try:
        return EnvironmentMetadata.from_flashinfer_metadata(doc)
    except ValueError as exc:
        raise EnvironmentUnavailable(f"environment file {path}: {exc}") from None


def _no_cuda_driver() -> bool:
    """Whether this is a Linux machine whose NVIDIA driver library (``libcuda.so.1``, what
    torch's CUDA runtime loads) cannot be loaded, in a process that has not imported torch:
    then torch can find no CUDA device, and :func:`detect_arch` need not spend the seconds
    of importing it to hear so (a ``tunecache push`` on a laptop, an init container
    without a GPU)."""
    if not sys.platform.startswith("linux") or "torch" in sys.modules:
        return False
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return True
    return False


def detect_arch(gpu_name: str) -> str:
    """The arch (``"sm90"``) of the local CUDA device 0, else of a known ``gpu_name``.

    Raises:
        EnvironmentUnavailable: no CUDA device and an unknown GPU name.
    """
    try:
        if not _no_cuda_driver():
            import torch

            if torch.cuda.is_available():
                return arch_from_capability(*torch.cuda.get_device_capability(0))
    except ImportError:
        pass
    arch = arch_for_gpu_name(gpu_name)
    if arch is None:
        raise EnvironmentUnavailable(f"cannot tell the arch of GPU {gpu_name!r}: no CUDA device here and not a GPU "
                                     "tunecache knows; give the arch (CLI: --arch sm90)")
    return arch


def pod_key(
    gpu_name: str,
    model: str,
    max_num_batched_tokens: int,
    *,
    arch: str | None = None,
    dtype: str = "auto",
    quantization: str = "auto",
    tensor_parallel_size: int = 1,
    data_parallel_size: int = 1,
    expert_parallel_size: int = 1,
    engine: str = DEFAULT_ENGINE,
) -> TuningKey:
    """The key a pod asks for: its GPU (``gpu_name`` as torch names it, e.g. a detected
    environment's ``gpu``; ``arch`` by default from :func:`detect_arch`) and the
    deployment's model settings (``expert_parallel_size``: see
    :func:`tunecache.contract.expert_parallel_size`).

    The one place a pod-side key is built: ``tunecache pull``/``push``/``doctor``/
    ``retune``, the Python API and the vLLM plugin all call it.

    Raises:
        EnvironmentUnavailable: the arch cannot be told (no CUDA, unknown GPU name).
        pydantic.ValidationError: a field out of range (named).
    """
    return TuningKey(
        gpu_name=gpu_name,
        arch=arch or detect_arch(gpu_name),
        model=model,
        max_num_batched_tokens=max_num_batched_tokens,
        dtype=dtype,
        quantization=quantization,
        tensor_parallel_size=tensor_parallel_size,
        data_parallel_size=data_parallel_size,
        expert_parallel_size=expert_parallel_size,
        engine=engine,
    )
