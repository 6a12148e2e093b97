"""vLLM plugin: install the fleet's tuning in each worker before vLLM's kernel_warmup.

Registered in the ``vllm.general_plugins`` entry-point group, which vLLM loads in every
worker process (``vllm/plugins/__init__.py::load_general_plugins``, called from
``WorkerWrapperBase.init_worker``), long before ``kernel_warmup``. With ``TUNECACHE_URL``
set, :func:`register` wraps ``vllm.model_executor.warmup.kernel_warmup.flashinfer_autotune``
so that, in each worker, before FlashInfer's autotune step:

* the current tuning for (GPU, model, max_num_batched_tokens, tp) and this process's
  FlashInfer environment is fetched and verified;
* it is written where this vLLM will look: the rank's v1 file at
  ``flashinfer_autotune_root() / flashinfer_autotune_cache_hash(runner) /
  flashinfer_autotune_filename(dp_rank, rank)`` (vLLM's own functions), or FlashInfer's v2
  store when vLLM uses it (``use_flashinfer_autotune_v2()``: single-rank);
* the tuning's FlashInfer JIT modules go into this worker's FlashInfer workspace, as its
  own FlashInfer names it (modules built for another FlashInfer version or arch, or with
  other paths, are skipped; ``TUNECACHE_JIT=0`` turns that off), and a DeepGEMM JIT cache,
  when the run has one, is unpacked under
  ``$VLLM_CACHE_ROOT/tunecache/deep_gemm/<run>`` and added to ``DG_JIT_CACHE_DIR`` as a
  read-only root (set in this process before DeepGEMM first reads it).

vLLM then loads them and skips tuning; on a miss it tunes as it always does. One log line
says what was installed or why not. Nothing here ever raises into vLLM. With
``TUNECACHE_PUSH_BACK=1`` a worker that tuned locally (the tuning was missing) uploads
its rank file afterwards as a ``pod`` run (stored unverified; never made current).

Settings: :class:`tunecache.client.settings.ClientSettings` (``TUNECACHE_URL``,
``TUNECACHE_DTYPE`` / ``TUNECACHE_QUANTIZATION`` for the key, ``TUNECACHE_JIT``,
``TUNECACHE_PUSH_BACK``, ``TUNECACHE_ENVIRONMENT_FILE``, the token, timeouts and attempts),
read once per worker when its install runs.
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path
from typing import Any

log = logging.getLogger("tunecache.vllm_plugin")


def register() -> None:
    """Entry point of the ``vllm.general_plugins`` group. Never raises."""
    settings = _settings_safely()
    if settings is None or not settings.url:
        return
    try:
        _wrap_flashinfer_autotune()
    except Exception as exc:  # another vLLM layout than 0.33's: vLLM boots as without tunecache
        log.warning("tunecache: not installing tunings: cannot hook vLLM's kernel_warmup (%s: %s)", type(exc).__name__, exc)


def _wrap_flashinfer_autotune() -> None:
    from vllm.model_executor.warmup import kernel_warmup

    if getattr(kernel_warmup, "_tunecache_wrapped", False):
        return
    original = kernel_warmup.flashinfer_autotune

    def flashinfer_autotune(runner: Any, *args: Any, **kwargs: Any) -> Any:
        settings = _settings_safely()
        installed = _install_safely(runner, settings) if settings is not None else None
        result = original(runner, *args, **kwargs)
        if installed is not None and not installed and settings.push_back:
            _push_back_safely(runner, settings)
        return result

    kernel_warmup.flashinfer_autotune = flashinfer_autotune
    kernel_warmup._tunecache_wrapped = True


def _rank_file(runner: Any) -> Path:
    from vllm.distributed.parallel_state import get_world_group
    from vllm.model_executor.warmup import flashinfer_autotune_cache as cache

    config = runner.vllm_config
    return (
        Path(cache.flashinfer_autotune_root())
        / cache.flashinfer_autotune_cache_hash(runner)
        / cache.flashinfer_autotune_filename(config.parallel_config.data_parallel_rank, get_world_group().rank_in_group)
    )


def _uses_v2() -> bool:
    from vllm.model_executor.warmup import flashinfer_autotune_cache, kernel_warmup

    check = getattr(kernel_warmup, "use_flashinfer_autotune_v2", None) or getattr(
        flashinfer_autotune_cache, "use_flashinfer_autotune_v2", None
    )
    return bool(check and check())


def _settings_safely():
    """This worker's :class:`ClientSettings`, or ``None`` (logged) when a variable is invalid."""
    from tunecache.client.settings import load_client_settings

    try:
        return load_client_settings()
    except ValueError as exc:
        log.warning("tunecache: no tuning installed, vLLM will tune: %s", exc)
        return None


def _key(runner: Any, environment: Any, settings: Any):
    from tunecache.client.environment import pod_key
    from tunecache.contract import expert_parallel_size

    config = runner.vllm_config
    parallel = config.parallel_config  # vllm/config/parallel.py::ParallelConfig
    tp = parallel.tensor_parallel_size
    dp = getattr(parallel, "data_parallel_size", 1)
    return pod_key(
        environment.gpu,
        config.model_config.model,
        config.scheduler_config.max_num_batched_tokens,
        dtype=settings.dtype,
        quantization=settings.quantization,
        tensor_parallel_size=tp,
        data_parallel_size=dp,
        expert_parallel_size=expert_parallel_size(
            tp, dp, bool(getattr(parallel, "enable_expert_parallel", False)),
            getattr(parallel, "prefill_context_parallel_size", 1),
        ),
    )


def _client(settings: Any):
    from tunecache.client.http import TunecacheClient

    return TunecacheClient.from_settings(settings)


def _vllm_cache_root() -> Path:
    try:
        import vllm.envs as envs

        return Path(envs.VLLM_CACHE_ROOT)
    except Exception:
        return Path(os.environ.get("VLLM_CACHE_ROOT") or os.path.join(os.path.expanduser("~"), ".cache", "vllm"))


def _environment(settings: Any):
    from tunecache.client.environment import detect_environment, environment_from_file

    # TUNECACHE_ENVIRONMENT_FILE: for pods whose FlashInfer cannot detect its own
    return environment_from_file(settings.environment_file) if settings.environment_file else detect_environment()


def _install_safely(runner: Any, settings: Any) -> bool | None:
    """Install for this worker. True: installed; False: the server has no matching tuning;
    None: tunecache failed (logged). Never raises."""
    from tunecache.store import NoCompatibleTuning
    from tunecache.client.atomic import write_atomically
    from tunecache.client.install import fetch_tuning, install_jit_modules
    from tunecache.client.layouts import deep_gemm_cache_dirs, flashinfer_v2_root, install_deep_gemm_cache, install_v2_store
    from tunecache.signing import load_trusted_keys

    try:
        environment = _environment(settings)
        key = _key(runner, environment, settings)
        jit = settings.jit
        trusted = load_trusted_keys(settings.trusted_keys) if settings.trusted_keys else None
        with _client(settings) as client:
            fetched = fetch_tuning(client, key, environment, jit=jit, deep_gemm=jit, trusted_keys=trusted)
        modules, _, skipped = install_jit_modules(fetched, True) if jit else ([], None, None)
        if fetched.deep_gemm is not None:
            directory = install_deep_gemm_cache(
                fetched.deep_gemm, _vllm_cache_root() / "tunecache" / "deep_gemm" / str(fetched.run.id)
            )
            os.environ["DG_JIT_CACHE_DIR"] = deep_gemm_cache_dirs(directory)
        if _uses_v2():
            where = install_v2_store(fetched.autotune, flashinfer_v2_root())
        else:
            where = _rank_file(runner)
            write_atomically(where, fetched.autotune)
        log.info(
            "tunecache: installed run %s (%s entries, %d JIT modules) for %s into %s%s",
            fetched.run.id, fetched.run.entries, len(modules), key.model, where, f"; {skipped}" if skipped else "",
        )
        return True
    except NoCompatibleTuning as exc:
        log.info("tunecache: no tuning installed, vLLM will tune: %s", exc.detail)
        return False
    except Exception as exc:  # whatever happens, vLLM boots as it would without tunecache
        log.warning("tunecache: no tuning installed, vLLM will tune: %s: %s", type(exc).__name__, exc)
        return None


def _push_back_safely(runner: Any, settings: Any) -> None:
    """Upload this worker's locally tuned rank file as an unverified ``pod`` run. Never raises."""
    from tunecache.client.autotune_file import parse_autotune_file, pushed_run

    try:
        path = _rank_file(runner)
        data = path.read_bytes()
        parsed = parse_autotune_file(data, source=str(path))
        key = _key(runner, parsed.environment, settings)
        with _client(settings) as client:
            stored = client.upload_artifact(data)
            run = client.record_run(pushed_run(key, parsed, stored.sha256, "pod", socket.gethostname()))
        log.info("tunecache: pushed this pod's tuning back as unverified run %s", run.id)
    except Exception as exc:
        log.warning("tunecache: push-back failed: %s: %s", type(exc).__name__, exc)
