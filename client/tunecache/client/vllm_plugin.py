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
* the tuning's FlashInfer JIT modules go into the FlashInfer workspace (``TUNECACHE_JIT=0``
  turns that off), and a DeepGEMM JIT cache, when the run has one, is unpacked under
  ``$VLLM_CACHE_ROOT/tunecache/deep_gemm/<run>`` and added to ``DG_JIT_CACHE_DIR`` as a
  read-only root (set in this process before DeepGEMM first reads it).

vLLM then loads them and skips tuning; on a miss it tunes as it always does. One log line
says what was installed or why not. Nothing here ever raises into vLLM. With
``TUNECACHE_PUSH_BACK=1`` a worker that tuned locally (the tuning was missing) uploads
its rank file afterwards as a ``pod`` run (stored unverified; never made current).

Settings: ``TUNECACHE_URL``, ``TUNECACHE_DTYPE`` / ``TUNECACHE_QUANTIZATION`` (the key's
dtype and quantization, default ``auto``), ``TUNECACHE_JIT``, ``TUNECACHE_PUSH_BACK``, and
the client's timeouts (``TUNECACHE_CONNECT_TIMEOUT``, ``TUNECACHE_READ_TIMEOUT``,
``TUNECACHE_TOTAL_TIMEOUT``, ``TUNECACHE_ATTEMPTS``).
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
    if not os.environ.get("TUNECACHE_URL"):
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
        installed = _install_safely(runner)
        result = original(runner, *args, **kwargs)
        if installed is not None and not installed and os.environ.get("TUNECACHE_PUSH_BACK") == "1":
            _push_back_safely(runner)
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


def _key(runner: Any, environment: Any):
    from tunecache.client.environment import detect_arch
    from tunecache.identity import TuningKey

    config = runner.vllm_config
    return TuningKey(
        gpu_name=environment.gpu,
        arch=detect_arch(environment.gpu),
        model=config.model_config.model,
        max_num_batched_tokens=config.scheduler_config.max_num_batched_tokens,
        dtype=os.environ.get("TUNECACHE_DTYPE", "auto"),
        quantization=os.environ.get("TUNECACHE_QUANTIZATION", "auto"),
        tensor_parallel_size=config.parallel_config.tensor_parallel_size,
    )


def _client():
    from tunecache.client.http import client_from_environment

    return client_from_environment(os.environ["TUNECACHE_URL"])


def _vllm_cache_root() -> Path:
    try:
        import vllm.envs as envs

        return Path(envs.VLLM_CACHE_ROOT)
    except Exception:
        return Path(os.environ.get("VLLM_CACHE_ROOT") or os.path.join(os.path.expanduser("~"), ".cache", "vllm"))


def _environment():
    from tunecache.client.environment import detect_environment, environment_from_file

    path = os.environ.get("TUNECACHE_ENVIRONMENT_FILE")  # for pods whose FlashInfer cannot detect its own
    return environment_from_file(Path(path)) if path else detect_environment()


def _install_safely(runner: Any) -> bool | None:
    """Install for this worker. True: installed; False: the server has no matching tuning;
    None: tunecache failed (logged). Never raises."""
    from tunecache.client.http import NoCompatibleTuning
    from tunecache.client.install import fetch_tuning, install_jit_modules, write_atomically
    from tunecache.client.layouts import deep_gemm_cache_dirs, flashinfer_v2_root, install_deep_gemm_cache, install_v2_store

    try:
        environment = _environment()
        key = _key(runner, environment)
        jit = os.environ.get("TUNECACHE_JIT", "1") != "0"
        with _client() as client:
            fetched = fetch_tuning(client, key, environment, jit=jit, deep_gemm=jit)
        modules, _ = install_jit_modules(fetched, True) if jit else ([], None)
        if fetched.deep_gemm is not None:
            directory = install_deep_gemm_cache(
                fetched.deep_gemm, _vllm_cache_root() / "tunecache" / "deep_gemm" / str(fetched.run["id"])
            )
            os.environ["DG_JIT_CACHE_DIR"] = deep_gemm_cache_dirs(directory)
        if _uses_v2():
            where = install_v2_store(fetched.autotune, flashinfer_v2_root())
        else:
            where = _rank_file(runner)
            write_atomically(where, fetched.autotune)
        log.info(
            "tunecache: installed run %s (%s entries, %d JIT modules) for %s into %s",
            fetched.run["id"], fetched.run["summary"].get("entries"), len(modules), key.model, where,
        )
        return True
    except NoCompatibleTuning as exc:
        log.info("tunecache: no tuning installed, vLLM will tune: %s", exc.detail)
        return False
    except Exception as exc:  # whatever happens, vLLM boots as it would without tunecache
        log.warning("tunecache: no tuning installed, vLLM will tune: %s: %s", type(exc).__name__, exc)
        return None


def _push_back_safely(runner: Any) -> None:
    """Upload this worker's locally tuned rank file as an unverified ``pod`` run. Never raises."""
    from tunecache.client.autotune_file import ARTIFACT_KIND, MEDIA_TYPE, parse_autotune_file

    try:
        path = _rank_file(runner)
        data = path.read_bytes()
        parsed = parse_autotune_file(data, source=str(path))
        key = _key(runner, parsed.environment)
        with _client() as client:
            sha256 = client.upload_artifact(data)
            run = client.record_run({
                "key": key.model_dump(), "environment": parsed.environment.model_dump(), "trigger": "pod",
                "node": socket.gethostname(), "summary": {"entries": parsed.entries},
                "artifacts": [{"kind": ARTIFACT_KIND, "name": "autotune.json", "media_type": MEDIA_TYPE, "sha256": sha256}],
            })
        log.info("tunecache: pushed this pod's tuning back as unverified run %s", run["id"])
    except Exception as exc:
        log.warning("tunecache: push-back failed: %s: %s", type(exc).__name__, exc)
