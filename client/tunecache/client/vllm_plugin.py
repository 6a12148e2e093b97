"""vLLM plugin: install the fleet's tuning for a whole pod, once per boot, before vLLM's warmup.

Registered in the ``vllm.general_plugins`` entry-point group, which vLLM loads in every
worker process (``vllm/plugins/__init__.py::load_general_plugins``, called from
``WorkerWrapperBase.init_worker`` before the worker class ``vllm.v1.worker.gpu_worker`` is
imported). With ``TUNECACHE_URL`` set, :func:`register` wraps vLLM's (0.25 to 0.33)
``vllm.model_executor.warmup.kernel_warmup.kernel_warmup(worker)`` (and re-binds that name
in any module that imported it already), which ``Worker.compile_or_warm_up_model`` calls and
which runs, in order, DeepGEMM warmup, ``flashinfer_autotune(runner)`` and FlashInfer's
attention warmup; ``flashinfer_autotune`` is wrapped too, as a fallback. The install runs
once per worker process, in whichever hook comes first, so before DeepGEMM warmup:

* **One lookup per pod boot.** The workers of one engine (vLLM's world group: ``pp * tp``
  processes) share ``vllm_config.instance_id`` (the parent process when it is absent).
  Under an exclusive lock on ``<root>/.tunecache/<hash>.lock`` (``<root>`` and ``<hash>``
  from vLLM's ``flashinfer_autotune_root()`` and ``flashinfer_autotune_cache_hash(runner)``),
  the first worker of the boot looks up the current tuning for the pod's key (GPU, model,
  max_num_batched_tokens, parallelism) and its FlashInfer environment, fetches and verifies
  it within the install deadline (``TUNECACHE_INSTALL_DEADLINE``, counted from its hook),
  installs it for every rank and records the outcome (installed, miss or failed; the run;
  the file's sha256) for its instance in ``<root>/.tunecache/<hash>.json``. The other
  workers wait for the lock (never longer than the install deadline plus
  :data:`INSTALL_WAIT_MARGIN_S`), read that record and look nothing up: every worker of the
  pod gets the same run, or the same miss or failure. A record of another instance (an
  earlier boot on a persistent volume) means a fresh lookup.
* **Both vLLM layouts.** vLLM 0.33 reads one v1 file per rank,
  ``<root>/<hash>/autotune_configs_dp{dp}_rank{rank}.json``; vLLM 0.25 (the release that
  pins torch 2.11 and FlashInfer 0.6.13) reads ``<root>/<hash>/autotune_configs.json``
  (``resolve_flashinfer_autotune_file``) in a single-process engine only, and tunes every
  rank of a larger one itself: there the plugin says so and installs nothing (:func:`_pod`).
* **The served model.** The key's model is vLLM's ``served_model_name`` (``model`` when
  none is given), so a pod loading weights from a directory asks for the model it serves.
* **All ranks or none.** The run's bytes become every rank's v1 file at once
  (:func:`tunecache.client.layouts.install_vllm_rank_files`: staged, then the whole
  ``<hash>`` directory renamed into place), so a full disk or any failure leaves no partial
  rank set; or FlashInfer's v2 store when vLLM uses it (``use_flashinfer_autotune_v2()``:
  single rank). Each other worker checks that its own rank file holds the recorded bytes.
* **Before DeepGEMM warmup.** The run's FlashInfer JIT modules go into the FlashInfer
  workspace, as its own FlashInfer names it (modules built for another FlashInfer version or
  arch, or with other paths, are skipped; ``TUNECACHE_JIT=0`` turns that off), and a
  DeepGEMM JIT cache, when the run has one, has its kernels merged into this pod's DeepGEMM
  cache directory (``DG_JIT_CACHE_DIR``, else vLLM's ``$VLLM_CACHE_ROOT/deep_gemm``:
  :func:`tunecache.client.layouts.deep_gemm_cache_dir`), which every worker then sets as
  ``DG_JIT_CACHE_DIR`` in its own process before DeepGEMM reads it.

vLLM then loads the files and skips tuning; on a miss it tunes as it always does. Each
worker logs one line: what it installed, what the pod's first worker installed or found, or
why nothing was installed. Each worker also reports its own outcome to the server
(:mod:`tunecache.client.report`: in the background, one attempt within
``TUNECACHE_REPORT_TIMEOUT``, never delaying the boot; ``TUNECACHE_REPORT=0`` turns it off):
the first worker's report says what its lookup found (``looked_up``) and how long the pod's
install took; each other worker's, for the key and environment the first recorded, whether
its own rank file holds the run (its seconds: its wait for the first worker and its check). Nothing here ever raises into vLLM; on any failure vLLM boots as
without tunecache. With ``TUNECACHE_PUSH_BACK=1``, after a miss, rank 0 uploads its locally
tuned rank file as a ``pod`` run (stored unverified; never made current).

Settings: :class:`tunecache.client.settings.ClientSettings` (``TUNECACHE_URL``,
``TUNECACHE_DTYPE`` / ``TUNECACHE_QUANTIZATION`` for the key, ``TUNECACHE_JIT``,
``TUNECACHE_PUSH_BACK``, ``TUNECACHE_ENVIRONMENT_FILE``, the token, timeouts and attempts,
the install deadline), read once per worker when its install runs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Under vLLM's own ``vllm`` logger, whose handler vLLM configures (``vllm/logger.py``:
#: ``DEFAULT_LOGGING_CONFIG``, ``propagate: False``; the root logger has none), so the
#: plugin's lines appear in vLLM's log, in its format, at ``VLLM_LOGGING_LEVEL``.
log = logging.getLogger("vllm.plugins.tunecache")

#: Seconds a worker waits for the pod's first worker beyond the install deadline: the
#: installer writes nothing once the deadline has passed, and writing takes less than this.
INSTALL_WAIT_MARGIN_S = 10.0
#: ``TUNECACHE_INSTALL_DEADLINE``'s default (seconds), for settings that do not have it.
DEFAULT_INSTALL_DEADLINE_S = 30.0

_OUTCOMES = ("installed", "miss", "failed")


@dataclass(frozen=True)
class PodInstall:
    """What this worker's install came to (once per process).

    ``outcome``: ``installed`` (this rank's file holds the run), ``miss`` (the server has
    no matching tuning: vLLM tunes), ``failed`` (tunecache failed, logged: vLLM tunes).
    """

    outcome: str
    rank: int | None = None
    settings: Any = None


_installed: PodInstall | None = None
_pushed_back = False


def register() -> None:
    """Entry point of the ``vllm.general_plugins`` group (``load_general_plugins`` calls it
    in every worker). With ``TUNECACHE_URL`` set, hooks vLLM 0.33's ``kernel_warmup``; an
    other vLLM layout is logged and vLLM boots as without tunecache. Never raises."""
    settings = _settings_safely()
    if settings is None or not settings.url:
        return
    try:
        _wrap_warmup()
    except Exception as exc:  # another vLLM layout than 0.33's: vLLM boots as without tunecache
        log.warning("tunecache: not installing tunings: cannot hook vLLM's kernel_warmup (%s: %s)", type(exc).__name__, exc)


def _wrap_warmup() -> None:
    """Wrap ``kernel_warmup.kernel_warmup`` (the earliest warmup step, before DeepGEMM's) and
    ``kernel_warmup.flashinfer_autotune`` (fallback, and push-back after vLLM tuned)."""
    import functools

    from vllm.model_executor.warmup import kernel_warmup as module

    if getattr(module, "_tunecache_wrapped", False):
        return
    original_autotune = module.flashinfer_autotune  # AttributeError: another vLLM layout
    original_warmup = getattr(module, "kernel_warmup", None)

    @functools.wraps(original_autotune)
    def flashinfer_autotune(runner: Any, *args: Any, **kwargs: Any) -> Any:
        installed = _install_once(runner)
        result = original_autotune(runner, *args, **kwargs)
        _push_back_once(runner, installed)
        return result

    module.flashinfer_autotune = flashinfer_autotune
    if callable(original_warmup):

        @functools.wraps(original_warmup)
        def kernel_warmup(worker: Any, *args: Any, **kwargs: Any) -> Any:
            runner = getattr(worker, "model_runner", None)
            if runner is not None:
                _install_once(runner)
            return original_warmup(worker, *args, **kwargs)

        module.kernel_warmup = kernel_warmup
        _rebind(original_warmup, kernel_warmup)
    module._tunecache_wrapped = True


def _rebind(original: Any, replacement: Any) -> None:
    """Point every already-imported ``vllm`` module's global that holds ``original`` (e.g.
    ``vllm.v1.worker.gpu_worker.kernel_warmup``, bound by its ``from ... import``) at
    ``replacement``."""
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "vllm" or name.startswith("vllm.")):
            continue
        namespace = getattr(module, "__dict__", {})
        for attribute, value in list(namespace.items()):
            if value is original:
                setattr(module, attribute, replacement)


def _install_once(runner: Any) -> PodInstall:
    """This process's install, run on the first call (from whichever hook comes first)."""
    global _installed
    if _installed is None:
        settings = _settings_safely()
        _installed = _install_for_pod(runner, settings) if settings is not None else PodInstall("failed")
    return _installed


def _push_back_once(runner: Any, installed: PodInstall) -> None:
    """After vLLM's own tuning on a miss: rank 0 pushes its rank file back, once."""
    global _pushed_back
    settings = installed.settings
    if _pushed_back or installed.outcome != "miss" or installed.rank != 0 or settings is None or not settings.push_back:
        return
    _pushed_back = True
    _push_back_safely(runner, settings)


class SingleProcessLayout(Exception):
    """vLLM 0.25's layout in an engine of several processes: vLLM tunes every rank itself
    and reads no autotune file, so there is nothing to install tactics into."""


@dataclass(frozen=True)
class _Pod:
    """This worker's place in its pod, all from vLLM's own functions and config."""

    root: Path
    config_hash: str
    rank: int
    instance: str
    file_names: tuple[str, ...]
    """The file of every worker of the pod under ``root/config_hash``, as vLLM names them."""
    rank_file: Path
    """This worker's own v1 file, as vLLM names it."""

    @property
    def lock(self) -> Path:
        return self.root / ".tunecache" / f"{self.config_hash}.lock"

    @property
    def marker(self) -> Path:
        return self.root / ".tunecache" / f"{self.config_hash}.json"

    def shown_ranks(self) -> str:
        count = len(self.file_names)
        return f"rank {self.rank}" if count == 1 else f"ranks 0-{count - 1}"


def _pod(runner: Any) -> _Pod:
    """Where this worker's vLLM reads its FlashInfer autotune file, in either layout of
    ``vllm/model_executor/warmup/flashinfer_autotune_cache.py``:

    * vLLM 0.33: ``flashinfer_autotune_root()/flashinfer_autotune_cache_hash(runner)/
      flashinfer_autotune_filename(dp_rank, rank)``, one file per rank of the world group;
    * vLLM 0.25: ``resolve_flashinfer_autotune_file(runner)`` (the same root and hash,
      ``autotune_configs.json``), read by a single-process engine only
      (``kernel_warmup.flashinfer_autotune``: with a world size above 1 every rank tunes).

    Raises:
        SingleProcessLayout: vLLM 0.25's layout with a world size above 1.
        AttributeError: neither layout (another vLLM).
    """
    from vllm.distributed.parallel_state import get_world_group
    from vllm.model_executor.warmup import flashinfer_autotune_cache as cache

    group = get_world_group()
    config = runner.vllm_config
    dp_rank, rank = int(config.parallel_config.data_parallel_rank), int(group.rank_in_group)
    world_size = int(getattr(group, "world_size", 1))
    if hasattr(cache, "flashinfer_autotune_root"):
        root, config_hash = Path(cache.flashinfer_autotune_root()), str(cache.flashinfer_autotune_cache_hash(runner))
        names = tuple(cache.flashinfer_autotune_filename(dp_rank, r) for r in range(world_size))
        own = names[rank]
    else:
        if world_size > 1:
            raise SingleProcessLayout(f"this vLLM tunes every rank of a {world_size}-process engine itself and reads no "
                                      "autotune file (vLLM 0.25's kernel_warmup.flashinfer_autotune)")
        path = Path(cache.resolve_flashinfer_autotune_file(runner))
        root, config_hash, names, own = path.parent.parent, path.parent.name, (path.name,), path.name
    return _Pod(root=root, config_hash=config_hash, rank=rank, instance=_instance_id(config), file_names=names,
                rank_file=root / config_hash / own)


def _instance_id(config: Any) -> str:
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
        _model_name(config.model_config),
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


def _model_name(model_config: Any) -> str:
    """The model of the pod's key: vLLM's ``served_model_name`` (its first name when a list),
    which vLLM sets to ``model`` when none is given (``vllm/config/model.py::
    get_served_model_name``). A pod that loads its weights from a local directory
    (``model=/models/llama``) names the model it serves with ``--served-model-name
    meta-llama/Llama-3.1-8B``, and asks for that model's tuning."""
    served = getattr(model_config, "served_model_name", None)
    if isinstance(served, (list, tuple)):
        served = served[0] if served else None
    return served if isinstance(served, str) and served else model_config.model


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


def _install_deadline(settings: Any) -> float:
    """Seconds from a worker's first hook within which its pod's install must have fetched
    everything: ``TUNECACHE_INSTALL_DEADLINE`` where the settings have it, else 30."""
    value = getattr(settings, "install_deadline", None)
    try:
        return float(value) if value is not None and float(value) > 0 else DEFAULT_INSTALL_DEADLINE_S
    except (TypeError, ValueError):
        return DEFAULT_INSTALL_DEADLINE_S


def _install_for_pod(runner: Any, settings: Any) -> PodInstall:
    """This worker's part of its pod's install. Never raises; logs one line.

    Under the pod's lock: the first worker of this boot (no record of its instance) looks
    up, fetches and installs for every rank (:func:`_install_as_first`); the others follow
    that record (:func:`_follow`), waiting for the lock at most the install deadline plus
    :data:`INSTALL_WAIT_MARGIN_S` seconds from this call.
    """
    from tunecache.client.atomic import file_lock

    started = time.monotonic()
    deadline = _install_deadline(settings)
    rank = None
    try:
        pod = _pod(runner)
        rank = pod.rank
        with file_lock(pod.lock, started + deadline + INSTALL_WAIT_MARGIN_S - time.monotonic()):
            record = _read_marker(pod)
            if record is not None:
                return _follow(pod, record, settings, started)
            return _install_as_first(pod, runner, settings, started, deadline)
    except TimeoutError:  # only the lock's wait: the two calls above catch everything
        log.warning("tunecache: no tuning installed, vLLM will tune: this pod's first worker was still installing after "
                    "%.0f s (the install deadline, %g s, plus %g s)", time.monotonic() - started, deadline,
                    INSTALL_WAIT_MARGIN_S)
    except Exception as exc:  # whatever happens, vLLM boots as it would without tunecache
        log.warning("tunecache: no tuning installed, vLLM will tune: %s: %s", type(exc).__name__, exc)
    return PodInstall("failed", rank, settings)


def _install_as_first(pod: _Pod, runner: Any, settings: Any, started: float, deadline: float) -> PodInstall:
    """Look up once for the pod, fetch, install every rank's file (all or none), the JIT
    modules and the DeepGEMM cache; record the outcome for the pod's other workers. Call it
    holding the pod's lock. Never raises."""
    from tunecache.store import NoCompatibleTuning
    from tunecache.client.install import fetch_tuning, install_jit_modules
    from tunecache.client.layouts import (
        deep_gemm_cache_dir,
        flashinfer_v2_root,
        install_deep_gemm_cache,
        install_v2_store,
        install_vllm_rank_files,
    )
    from tunecache.signing import load_trusted_keys
    from tunecache.client.install import jit_not_installed
    from tunecache.client.report import outcome_of, worth_reporting

    record: dict[str, Any] = {"instance": pod.instance, "rank": pod.rank, "host": socket.gethostname(), "pid": os.getpid()}
    key = environment = client = None
    report: dict[str, Any] = {}
    try:
        environment = _environment(settings)
        key = _key(runner, environment, settings)
        # the pod's other workers report their own outcome for the same key and environment
        record.update(key=key.model_dump(), environment=environment.model_dump())
        jit = settings.jit
        trusted = load_trusted_keys(settings.trusted_keys) if settings.trusted_keys else None
        client = _client(settings)
        with client:
            left = started + deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"the install deadline ({deadline:g} s) passed while this worker waited for the "
                                   "pod's lock; nothing was installed")
            scope = getattr(client, "deadline_scope", None)  # every request within the seconds left
            with scope(left) if scope is not None else contextlib.nullcontext():
                fetched = fetch_tuning(client, key, environment, jit=jit, deep_gemm=jit, trusted_keys=trusted)
        took = time.monotonic() - started
        if took > deadline:  # the other workers stop waiting soon: write nothing they would not expect
            raise TimeoutError(f"fetching run {fetched.run.id} took {took:.1f} s, more than the install deadline "
                               f"({deadline:g} s); nothing was installed")
        modules, _, skipped = install_jit_modules(fetched, True) if jit else ([], None, None)
        deep_gemm = None
        if fetched.deep_gemm is not None:  # merged into this pod's own DeepGEMM cache directory
            deep_gemm = deep_gemm_cache_dir()
            install_deep_gemm_cache(fetched.deep_gemm, deep_gemm)
        v2 = _uses_v2()
        if v2:
            where = install_v2_store(fetched.autotune, flashinfer_v2_root())
        else:  # last, so that a failure before it leaves the previous rank files as they were
            install_vllm_rank_files(fetched.autotune, pod.root, pod.config_hash, list(pod.file_names))
            where = pod.root / pod.config_hash
        if deep_gemm is not None:  # the directory vLLM would set, set before DeepGEMM reads it
            os.environ["DG_JIT_CACHE_DIR"] = str(deep_gemm)
        not_installed = jit_not_installed(fetched.run, modules) if jit else 0
        record.update(outcome="installed", run=fetched.run.id, entries=fetched.run.entries, jit_modules=len(modules),
                      jit_skipped=not_installed, deep_gemm=deep_gemm is not None,
                      sha256=hashlib.sha256(fetched.autotune).hexdigest(), model=key.model, v2=v2, where=str(where))
        report = {"outcome": "installed", "run_id": fetched.run.id, "jit_modules": len(modules), "jit_skipped": not_installed}
        level = logging.INFO
        line = (f"tunecache: installed run {fetched.run.id} ({fetched.run.entries} entries, {len(modules)} JIT modules) "
                f"for {key.model} into {where}" + ("" if v2 else f" ({pod.shown_ranks()})")
                + (f"; {skipped}" if skipped else ""))
    except NoCompatibleTuning as exc:
        outcome, fields = outcome_of(exc)
        report = {"outcome": outcome.value, **fields}
        record.update(outcome="miss", reason=exc.detail, closest_run=fields["run_id"],
                      differences=[d.model_dump() for d in fields["differences"]])
        level, line = logging.INFO, f"tunecache: no tuning installed, vLLM will tune: {exc.detail}"
    except Exception as exc:  # whatever happens, vLLM boots as it would without tunecache
        # not reported when the server could not be reached or failed (it would not take a report either)
        report = {"outcome": "error", "error_kind": type(exc).__name__} if worth_reporting(exc) else {}
        record.update(outcome="failed", reason=f"{type(exc).__name__}: {exc}",
                      error_kind=type(exc).__name__ if report else None)
        level, line = logging.WARNING, f"tunecache: no tuning installed, vLLM will tune: {record['reason']}"
    try:
        _write_marker(pod, record)
    except Exception as exc:
        line += (f" (not recorded for this pod's other workers, which will look up themselves: "
                 f"{type(exc).__name__}: {exc})")
    log.log(level, "%s", line)
    if key is not None and environment is not None and report:
        _report(settings, client, key, environment, time.monotonic() - started, pod.rank, True, report)
    return PodInstall(record["outcome"], pod.rank, settings)


def _report(settings: Any, client: Any, key: Any, environment: Any, seconds: float, rank: int, looked_up: bool,
            fields: dict[str, Any]) -> None:
    """Send this worker's install report (:mod:`tunecache.client.report`) in the background,
    through ``client``'s server and token (a new client of ``settings`` when ``None``),
    unless ``TUNECACHE_REPORT=0``. ``fields``: ``outcome`` and the report's other fields.
    Never raises, never waits."""
    if not getattr(settings, "report", True):
        return
    try:
        from tunecache.client.report import build_report, send_in_background
        from tunecache.contract import ReportOutcome, ReportSource

        if client is None:
            client = _client(settings)
            client.close()  # only its server, token and TLS settings are used, by the report's own client
        fields = dict(fields)
        outcome = ReportOutcome(fields.pop("outcome"))
        send_in_background(client, build_report(key, environment, outcome, seconds, ReportSource.PLUGIN, rank=rank,
                                                looked_up=looked_up, **fields))
    except Exception as exc:
        log.debug("tunecache: install report not sent: %s: %s", type(exc).__name__, exc)


def _follower_report(record: dict[str, Any], settings: Any, started: float | None, rank: int, fields: dict[str, Any]) -> None:
    """Report a follower's own outcome for the key and environment its pod's first worker
    recorded (nothing when the record has none, e.g. written by an older plugin)."""
    try:
        from tunecache.contract import EnvironmentMetadata, TuningKey

        key, environment = TuningKey.model_validate(record["key"]), EnvironmentMetadata.model_validate(record["environment"])
    except Exception:
        return
    seconds = time.monotonic() - started if started is not None else 0.0
    _report(settings, None, key, environment, seconds, rank, False, fields)


def _follow(pod: _Pod, record: dict[str, Any], settings: Any, started: float | None = None) -> PodInstall:
    """Take what the pod's first worker recorded: check this rank's file holds the run's
    bytes and put the run's DeepGEMM cache on this process's ``DG_JIT_CACHE_DIR``; no
    lookup. Reports this worker's own outcome (``looked_up`` false). Never raises."""
    from tunecache.client.layouts import deep_gemm_cache_dir

    by = record.get("rank")
    if record["outcome"] != "installed":
        level = logging.INFO if record["outcome"] == "miss" else logging.WARNING
        log.log(level, "tunecache: no tuning installed, vLLM will tune: %s (found for this pod by rank %s)",
                record.get("reason"), by)
        if record["outcome"] == "miss":
            _follower_report(record, settings, started, pod.rank, {
                "outcome": "miss", "run_id": record.get("closest_run"), "differences": record.get("differences") or []})
        elif record.get("error_kind"):  # none: the server failed the first worker, it would not take a report
            _follower_report(record, settings, started, pod.rank, {"outcome": "error", "error_kind": record["error_kind"]})
        return PodInstall(record["outcome"], pod.rank, settings)
    try:
        run = int(record["run"])
        if record.get("v2"):
            where = Path(record["where"])  # this pod's own record, written by _install_as_first
            if not where.is_dir():
                raise FileNotFoundError(f"run {run} was installed for this pod by rank {by} into {where}, which is gone")
        else:
            where = pod.rank_file
            try:
                held = hashlib.sha256(where.read_bytes()).hexdigest()
            except FileNotFoundError:
                held = None
            if held != record["sha256"]:
                raise FileNotFoundError(f"run {run} was installed for this pod by rank {by}, but {where} "
                                        f"{'is missing' if held is None else 'holds other bytes'}")
        note = ""
        if record.get("deep_gemm"):
            directory = deep_gemm_cache_dir()
            if (directory / "cache").is_dir():
                os.environ["DG_JIT_CACHE_DIR"] = str(directory)
            else:
                note = f"; its DeepGEMM cache {directory} is missing"
        log.info("tunecache: run %s installed for this pod by rank %s (%s entries, %s JIT modules) for %s: %s%s",
                 run, by, record.get("entries"), record.get("jit_modules"), record.get("model"), where, note)
        _follower_report(record, settings, started, pod.rank, {
            "outcome": "installed", "run_id": run, "jit_modules": int(record.get("jit_modules") or 0),
            "jit_skipped": int(record.get("jit_skipped") or 0)})
        return PodInstall("installed", pod.rank, settings)
    except Exception as exc:
        log.warning("tunecache: no tuning installed, vLLM will tune: %s: %s", type(exc).__name__, exc)
        _follower_report(record, settings, started, pod.rank, {"outcome": "error", "error_kind": type(exc).__name__})
        return PodInstall("failed", pod.rank, settings)


def _read_marker(pod: _Pod) -> dict[str, Any] | None:
    """The pod's record of this boot (``pod.instance``), or ``None``: none, another
    instance's (an earlier boot), or unreadable as a record (then it is rewritten).

    Raises:
        OSError: the record exists but cannot be read (permissions, I/O).
    """
    try:
        record = json.loads(pod.marker.read_bytes())
    except FileNotFoundError:
        return None
    except ValueError:
        return None
    if not isinstance(record, dict) or record.get("instance") != pod.instance or record.get("outcome") not in _OUTCOMES:
        return None
    if record["outcome"] == "installed" and not (isinstance(record.get("run"), int) and isinstance(record.get("sha256"), str)):
        return None
    return record


def _write_marker(pod: _Pod, record: dict[str, Any]) -> None:
    """Write the pod's record whole (staged and renamed). Raises OSError."""
    from tunecache.client.atomic import write_atomically

    write_atomically(pod.marker, json.dumps({**record, "written_at": time.time()}, indent=1).encode())


def _push_back_safely(runner: Any, settings: Any) -> None:
    """Upload this worker's locally tuned rank file (vLLM wrote it after tuning on a miss) as an
    unverified ``pod`` run. Never raises."""
    from tunecache.client.autotune_file import parse_autotune_file, pushed_run

    try:
        path = _pod(runner).rank_file
        data = path.read_bytes()
        parsed = parse_autotune_file(data, source=str(path))
        key = _key(runner, parsed.environment, settings)
        with _client(settings) as client:
            stored = client.upload_artifact(data)
            run = client.record_run(pushed_run(key, parsed, stored.sha256, "pod", socket.gethostname()))
        log.info("tunecache: pushed this pod's tuning back as unverified run %s", run.id)
    except Exception as exc:
        log.warning("tunecache: push-back failed: %s: %s", type(exc).__name__, exc)
