"""Where a vLLM pod keeps what tunecache installs, as vLLM (and the libraries it points) name it.

* vLLM's cache root: ``VLLM_CACHE_ROOT`` (``vllm.envs.VLLM_CACHE_ROOT`` where vLLM is
  importable; else the same default, ``$XDG_CACHE_HOME/vllm`` or ``~/.cache/vllm``), with
  ``modelinfos/`` and ``torch_compile_cache/`` (:mod:`tunecache.engines.vllm.compile_cache`).
* vLLM's per-rank FlashInfer autotune files (0.33 and later):
  ``<root>/<hash>/autotune_configs_dp{dp}_rank{rank}.json`` where ``<root>`` is
  ``vllm/model_executor/warmup/flashinfer_autotune_cache.py::flashinfer_autotune_root()``
  (``$VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR`` if set, else
  ``$VLLM_CACHE_ROOT/flashinfer_autotune_cache/<flashinfer version>/<arch dir>``) and
  ``<hash>`` is ``flashinfer_autotune_cache_hash(runner)``. vLLM loads them only when every
  rank has a file with the same ``_metadata`` and entry count, so all ranks get the same bytes.
* FlashInfer's v2 store (single-rank vLLM): ``$VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR`` if set
  (vLLM's ``resolve_flashinfer_autotune_v2_root``), else FlashInfer's ``get_default_cache_root()``.
* DeepGEMM's JIT cache: ``DG_JIT_CACHE_DIR`` (vLLM sets ``$VLLM_CACHE_ROOT/deep_gemm`` when it
  is unset: ``vllm/utils/deep_gemm.py::_lazy_init``).

With vllm importable, vLLM's own functions give the roots; without it (an init container) they
are composed as above, mirrored from vLLM 0.33.0, from this pod's own environment. Nothing a
run carries becomes part of a path. Pure: the standard library (vLLM and FlashInfer lazily,
inside the functions that ask them); writing into these places is the pod's
(:mod:`tunecache.client.layouts`, :mod:`tunecache.client.warm_state`).
"""

from __future__ import annotations

import os
from pathlib import Path


def _default_cache_root() -> str:
    return os.environ.get("VLLM_CACHE_ROOT") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache"), "vllm")


def vllm_cache_root() -> Path:
    """This pod's ``VLLM_CACHE_ROOT``: ``vllm.envs.VLLM_CACHE_ROOT`` where vLLM is importable,
    else the variable, else vLLM's default (``$XDG_CACHE_HOME/vllm``, ``~/.cache/vllm``)."""
    try:
        import vllm.envs as envs

        return Path(envs.VLLM_CACHE_ROOT).expanduser()
    except Exception:
        pass
    return Path(_default_cache_root()).expanduser()


def vllm_rank_file_name(dp_rank: int, rank: int) -> str:
    """``autotune_configs_dp{dp}_rank{rank}.json`` (vLLM 0.33 ``flashinfer_autotune_filename``)."""
    return f"autotune_configs_dp{dp_rank}_rank{rank}.json"


def shared_autotune_file_names() -> tuple[str, ...]:
    """The file vLLM 0.33/0.34's FlashInfer sparse-MLA decode autotune reads beside the per-rank
    files, where this worker's vLLM runs it: ``("autotune_configs.json",)`` on an SM120-family
    GPU of a release with ``vllm/model_executor/warmup/flashinfer_sparse_mla_warmup.py``, else ``()``.

    There (``_run_flashinfer_sparse_mla_decode_autotune``, vLLM's v1 path: an engine of several
    ranks) the leader tunes with ``flashinfer_autotune(True, cache=resolve_flashinfer_autotune_file(runner))``,
    which loads that file first, and every rank writes and loads what the leader broadcasts. vLLM
    runs that warmup before ``flashinfer_autotune`` in ``kernel_warmup``, whose per-rank file is
    FlashInfer's ``AutoTuner.save_configs`` of everything the process tuned or loaded, so the
    run's file (rank 0's) holds the shared file's entries. The name is the one
    ``resolve_flashinfer_autotune_file`` returns, not asked of it: it makes the directory.
    Whether the GPU is of that family: vLLM's ``current_platform.is_device_capability_family(120)``.
    """
    import importlib.util

    try:
        if importlib.util.find_spec("vllm.model_executor.warmup.flashinfer_sparse_mla_warmup") is None:
            return ()
        from vllm.platforms import current_platform

        return ("autotune_configs.json",) if current_platform.is_device_capability_family(120) else ()
    except (ImportError, AttributeError):  # another vLLM: no such warmup
        return ()


def vllm_autotune_root() -> Path:
    """vLLM's per-rank autotune root for this process, from this pod's own environment:
    vLLM's ``flashinfer_autotune_root()``; without vllm,
    ``$VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR``, else
    ``$VLLM_CACHE_ROOT/flashinfer_autotune_cache/`` + the ``<version>/<arch dir>`` of this
    pod's FlashInfer workspace.

    Raises:
        ValueError: neither vllm nor flashinfer is importable here and
            ``VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR`` is unset, so nothing here tells the
            FlashInfer version and arch directory.
    """
    try:
        from vllm.model_executor.warmup.flashinfer_autotune_cache import flashinfer_autotune_root

        return Path(flashinfer_autotune_root())
    except ImportError:
        pass
    override = os.environ.get("VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR")
    if override:
        return Path(override).expanduser()
    try:
        from flashinfer.jit import env as jit_env

        workspace = Path(jit_env.FLASHINFER_WORKSPACE_DIR)
        subdir = Path(workspace.parent.name) / workspace.name
    except ImportError:
        raise ValueError("cannot tell FlashInfer's version/arch directory here (neither vllm nor flashinfer is "
                         "importable); set VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR or pass --dest") from None
    return Path(_default_cache_root()).expanduser() / "flashinfer_autotune_cache" / subdir


def flashinfer_v2_root() -> Path:
    """Where FlashInfer's v2 store is read: ``$VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR`` (as vLLM
    passes it to ``autotune_v2(cache_root=...)``) or FlashInfer's default root.

    Raises:
        ImportError: flashinfer is not importable and the variable is unset.
    """
    override = os.environ.get("VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR")
    if override:
        return Path(override).expanduser()
    from flashinfer.autotune_cache import get_default_cache_root

    return Path(get_default_cache_root())


def deep_gemm_cache_dir() -> Path:
    """This pod's DeepGEMM JIT cache directory, where DeepGEMM looks up and writes kernels:
    ``$DG_JIT_CACHE_DIR``, else vLLM's default ``$VLLM_CACHE_ROOT/deep_gemm``
    (``vllm/utils/deep_gemm.py::_lazy_init`` sets the variable to it when unset; DeepGEMM's
    ``Compiler`` reads the variable as one directory, ``csrc/jit/compiler.hpp``)."""
    current = os.environ.get("DG_JIT_CACHE_DIR")
    if current:
        return Path(current).expanduser()
    return Path(_default_cache_root()).expanduser() / "deep_gemm"
