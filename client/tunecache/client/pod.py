"""Pod coordination: the workers of one engine install a tuning once per boot, as one.

Used by the vLLM plugin (:mod:`tunecache.client.vllm_plugin`, which tells each worker's
:class:`Pod` from vLLM's own functions). Under an exclusive lock on ``<root>/.tunecache/<hash>.lock``
(:attr:`Pod.lock`), the first worker of the boot (no :class:`PodRecord` of its instance in
``<root>/.tunecache/<hash>.json``, :attr:`Pod.marker`) looks up the current tuning for the
pod's key and its FlashInfer environment, fetches and verifies it within the install
deadline (``TUNECACHE_INSTALL_DEADLINE``, counted from its hook), installs it for every rank
(:func:`tunecache.client.install.install`) and records what it came to for its instance.
The other workers wait for the lock (never longer than the install deadline plus
:data:`INSTALL_WAIT_MARGIN_S`), read that record and look nothing up: every worker of the pod
gets the same run, or the same miss or error. A record of another instance (an earlier boot
on a persistent volume) means a fresh lookup.

Each worker logs one line (under vLLM's ``vllm`` logger, as the plugin does) and reports its
own outcome (:mod:`tunecache.client.report`, in the background); nothing here raises.

Before any worker exists, the engine's main process installs the rest of the boot's warm
state (:class:`WarmBoot`): in vLLM's ``EngineArgs.create_engine_config``, before the model is
inspected, the FlashInfer JIT modules, the DeepGEMM cache, Triton's cache and vLLM's
model-inspection cache, and stages the compile cache, which each worker puts under the
directory names its own vLLM config gives right before it compiles
(:func:`install_staged_compile_cache`). The workers then install the tactics only
(:attr:`tunecache.client.boot.handoff.Handoff.warm_state_run`).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, ValidationError

from tunecache.client.atomic import file_lock, write_atomically
from tunecache.client.boot.handoff import Handoff
from tunecache.client.destinations import destinations_of
from tunecache.client.http import TunecacheClient
from tunecache.client.install import (
    FetchedTuning,
    DeepGemmCache,
    FlashInferV2Store,
    InstallResult,
    InstallTarget,
    JitWorkspace,
    VllmRankFiles,
    fetch_tuning,
    install,
)
from tunecache.client.jit_install import use_aot_dir
from tunecache.client.layouts import deep_gemm_cache_dir
from tunecache.client.warm_state import (TritonCache, VllmCacheRoot, read_compile_factors, relocate_compile_dirs,
                                         vllm_cache_root)
from tunecache.formats.vllm_compile import (FACTORS_FILE, CompileFactors, PodCompileFactors, differences,
                                             pod_dir_names, variant_differences)
from tunecache.contract import (ENVIRONMENT_FIELDS, ArtifactKind, EnvironmentMetadata, ReportOutcome, ReportSource, TuningKey,
                                kinds_where)
from tunecache.formats.autotune_file import check_loadable
from tunecache.signing import load_trusted_keys

#: The vLLM plugin's logger (``tunecache.client.vllm_plugin.log``): under vLLM's own
#: ``vllm`` logger, so these lines appear in vLLM's log, in its format.
log = logging.getLogger("vllm.plugins.tunecache")

#: Seconds a worker waits for the pod's first worker beyond the install deadline: the
#: installer writes nothing once the deadline has passed, and writing takes less than this.
INSTALL_WAIT_MARGIN_S = 10.0
#: ``TUNECACHE_INSTALL_DEADLINE``'s default (seconds), for settings that do not have it.
DEFAULT_INSTALL_DEADLINE_S = 30.0


@dataclass(frozen=True)
class PodInstall:
    """What this worker's install came to (once per process): ``outcome`` ``installed``
    (this rank's file holds the run, or, with ``baked``, the valid file of this pod's
    environment that was already in a cache root tunecache cannot write), ``miss`` (the
    server has no matching tuning: vLLM tunes) or ``error`` (tunecache failed, logged: vLLM
    tunes)."""

    outcome: ReportOutcome
    rank: int | None = None
    settings: Any = None
    baked: Path | None = None


@dataclass(frozen=True)
class Pod:
    """This worker's place in its pod."""

    root: Path
    config_hash: str
    rank: int
    instance: str
    """The boot's identity, shared by the pod's workers."""
    file_names: tuple[str, ...]
    """The file of every worker of the pod under ``root/config_hash``."""
    rank_file: Path
    """This worker's own v1 file."""

    @property
    def lock(self) -> Path:
        return self.root / ".tunecache" / f"{self.config_hash}.lock"

    @property
    def marker(self) -> Path:
        return self.root / ".tunecache" / f"{self.config_hash}.json"

    @property
    def commit_lock(self) -> Path:
        """Held by the first worker while it puts the run in place and records it, and by a
        worker that gave up waiting while it decides (:func:`_commit_window`, :func:`_give_up`)."""
        return self.root / ".tunecache" / f"{self.config_hash}.commit.lock"

    @property
    def abandoned(self) -> Path:
        """Made by a worker of this boot that gave up waiting for the first: the first then
        installs nothing (:func:`_commit_window`)."""
        instance = hashlib.sha256(self.instance.encode()).hexdigest()[:16]
        return self.root / ".tunecache" / f"{self.config_hash}.abandoned-{instance}"

    def shown_ranks(self) -> str:
        count = len(self.file_names)
        return f"rank {self.rank}" if count == 1 else f"ranks 0-{count - 1}"


class Worker(Protocol):
    """What the inference engine tells about this worker (the vLLM plugin's ``VllmWorker``)."""

    def pod(self) -> Pod: ...

    def key(self, environment: EnvironmentMetadata) -> TuningKey: ...

    def uses_v2(self) -> bool:
        """Whether the engine reads FlashInfer's v2 store instead of rank files."""


class PodRecord(BaseModel):
    """What the pod's first worker recorded for its boot, in :attr:`Pod.marker`."""

    instance: str
    rank: int
    """The first worker's rank."""
    host: str
    pid: int
    key: TuningKey | None = None
    """The key and environment looked up (the other workers report for the same), if it got that far."""
    environment: EnvironmentMetadata | None = None
    v2: bool = False
    """The tactics went into FlashInfer's v2 store (``result.paths[0]``), not rank files."""
    result: InstallResult
    written_at: float | None = None


def install_deadline(settings: Any) -> float:
    """Seconds from a worker's first hook within which its pod's install must have fetched
    everything: ``TUNECACHE_INSTALL_DEADLINE`` where the settings have it, else 30."""
    value = getattr(settings, "install_deadline", None)
    try:
        return float(value) if value is not None and float(value) > 0 else DEFAULT_INSTALL_DEADLINE_S
    except (TypeError, ValueError):
        return DEFAULT_INSTALL_DEADLINE_S


def install_for_pod(worker: Worker, settings: Any) -> PodInstall:
    """This worker's part of its pod's install. Never raises; logs one line.

    Under the pod's lock: the first worker of this boot (no record of its instance) looks
    up, fetches and installs for every rank (:func:`_install_as_first`); the others follow
    that record (:func:`_follow`), waiting for the lock at most the install deadline plus
    :data:`INSTALL_WAIT_MARGIN_S` seconds from this call.
    """
    started = time.monotonic()
    deadline = install_deadline(settings)
    rank = None
    try:
        pod = worker.pod()
        rank = pod.rank
        lock = contextlib.ExitStack()
        try:
            lock.enter_context(file_lock(pod.lock, started + deadline + INSTALL_WAIT_MARGIN_S - time.monotonic()))
        except TimeoutError:
            raise
        except OSError as exc:  # a cache root this pod cannot write (baked into a read-only image)
            return _in_place(pod, worker, settings, exc)
        with lock:
            record = _read_record(pod)
            if record is not None:
                return _follow(pod, record, settings, started)
            return _install_as_first(pod, worker, settings, started, deadline)
    except TimeoutError:  # only the lock's wait: the two calls above catch everything
        try:
            return _give_up(pod, settings, started, deadline)
        except Exception as exc:
            log.warning("tunecache: no tuning installed, vLLM will tune: %s: %s", type(exc).__name__, exc)
    except Exception as exc:  # whatever happens, vLLM boots as it would without tunecache
        log.warning("tunecache: no tuning installed, vLLM will tune: %s: %s", type(exc).__name__, exc)
    return PodInstall(ReportOutcome.ERROR, rank, settings)


#: Seconds a worker waits for the commit lock (:attr:`Pod.commit_lock`): its holder only
#: renames what it staged into place and writes the record.
COMMIT_WAIT_S = 30.0


class Abandoned(RuntimeError):
    """A worker of this boot gave up waiting for the first, so the first installs nothing:
    every worker of the boot then boots without the run, as one (vllm#57423)."""


@contextlib.contextmanager
def _commit_window(pod: Pod) -> Iterator[None]:
    """The first worker's window to put the run in place and record it: under the commit lock,
    and only while no worker of this boot gave up waiting (:attr:`Pod.abandoned`).

    Raises:
        Abandoned: one did; nothing may be put in place.
        TimeoutError: the commit lock stayed held (a worker that gave up is deciding).
    """
    with file_lock(pod.commit_lock, COMMIT_WAIT_S):
        if pod.abandoned.exists():
            raise Abandoned("a worker of this boot gave up waiting for this one (its wait, the install deadline plus "
                            f"{INSTALL_WAIT_MARGIN_S:g} s, passed first); nothing was installed, so that every rank "
                            "boots without the run alike")
        yield


def _give_up(pod: Pod, settings: Any, started: float, deadline: float) -> PodInstall:
    """After this worker's wait for the pod's first worker ran out: under the commit lock,
    follow the first worker's record if it put the run in place meanwhile; else mark the boot
    abandoned (:attr:`Pod.abandoned`), so that the first installs nothing either: every rank
    sees the same state, never one rank's run and another's nothing (vllm#57423)."""
    from tunecache.client.atomic import write_atomically

    with file_lock(pod.commit_lock, COMMIT_WAIT_S):
        record = _read_record(pod)
        if record is not None:
            return _follow(pod, record, settings, started)
        _remove_stale(pod.abandoned.parent.glob(f"{pod.config_hash}.abandoned-*"))
        write_atomically(pod.abandoned, pod.instance.encode())
    log.warning("tunecache: no tuning installed, vLLM will tune: this pod's first worker was still installing after "
                "%.0f s (the install deadline, %g s, plus %g s); it will install nothing either, so every rank boots "
                "alike", time.monotonic() - started, deadline, INSTALL_WAIT_MARGIN_S)
    return PodInstall(ReportOutcome.ERROR, pod.rank, settings)


def _in_place(pod: Pod, worker: Worker, settings: Any, unwritable: OSError) -> PodInstall:
    """The pod's cache root cannot be written (``unwritable``: the lock beside the tunings
    could not be made), so nothing can be installed there and nothing is looked up: say in
    one line what vLLM will do with what is already there (an image may bake the tunings
    in), leaving it as it is. vLLM loads the rank files when every rank's file is one
    FlashInfer loads, all alike, for this pod's FlashInfer environment; otherwise it tunes.
    Never raises."""
    root = pod.root
    cannot = (f"{root} is read-only" if unwritable.errno == errno.EROFS
              else f"{root} cannot be written ({unwritable.strerror or unwritable})")
    why = f"{cannot}, so nothing was looked up or installed"
    tunes = "tunecache: no tuning installed, vLLM will tune: "
    own = pod.rank_file
    try:
        if worker.uses_v2():
            log.info("tunecache: %s; vLLM uses what FlashInfer's v2 store already holds", why)
            return PodInstall(ReportOutcome.ERROR, pod.rank, settings)
        files = [pod.root / pod.config_hash / name for name in pod.file_names]
        if not own.is_file():
            log.warning("%sthere is no autotune file in place (%s); %s", tunes, own, why)
            return PodInstall(ReportOutcome.ERROR, pod.rank, settings)
        parsed = []
        for path in files:
            try:
                parsed.append(check_loadable(path.read_bytes(), source=str(path)))
            except (OSError, ValueError) as exc:
                reason = "missing" if isinstance(exc, FileNotFoundError) else f"{type(exc).__name__}: {exc}"
                log.warning("%sthe autotune files already in place are not a rank set vLLM loads (%s: %s), and are "
                            "left as they are; %s", tunes, path, reason, why)
                return PodInstall(ReportOutcome.ERROR, pod.rank, settings)
        if len({(p.environment, p.entries) for p in parsed}) > 1:
            log.warning("%sthe autotune files already in place under %s differ in environment or entries, which vLLM "
                        "does not load, and are left as they are; %s", tunes, root / pod.config_hash, why)
            return PodInstall(ReportOutcome.ERROR, pod.rank, settings)
        baked = parsed[0]
        try:
            environment = _environment(settings)
        except Exception as exc:  # no FlashInfer to ask: say what is there, and that it could not be compared
            log.info("tunecache: vLLM may load the autotune file already in place: %s (%s entries; this pod's FlashInfer "
                     "environment is unknown: %s: %s); %s", own, baked.entries, type(exc).__name__, exc, why)
            return PodInstall(ReportOutcome.ERROR, pod.rank, settings)
        differ = [f"{name}: file {getattr(baked.environment, name)}, this pod {getattr(environment, name)}"
                  for name in ENVIRONMENT_FIELDS if getattr(baked.environment, name) != getattr(environment, name)]
        if differ:
            log.warning("%sthe autotune file already in place, %s, is for another FlashInfer environment (%s), and is "
                        "left as it is; %s", tunes, own, "; ".join(differ), why)
            return PodInstall(ReportOutcome.ERROR, pod.rank, settings)
        log.info("tunecache: vLLM will load the autotune file already in place: %s (%s entries, for this pod's FlashInfer "
                 "environment); %s", own, baked.entries, why)
        return PodInstall(ReportOutcome.INSTALLED, pod.rank, settings, baked=own)
    except Exception as exc:  # whatever happens, vLLM boots as it would without tunecache
        log.warning("%s%s; %s: %s", tunes, why, type(exc).__name__, exc)
        return PodInstall(ReportOutcome.ERROR, pod.rank, settings)


def _install_as_first(pod: Pod, worker: Worker, settings: Any, started: float, deadline: float) -> PodInstall:
    """Look up once for the pod, fetch, install every rank's file (all or none), the JIT
    modules and the DeepGEMM cache; record the outcome for the pod's other workers. Call it
    holding the pod's lock. Never raises."""
    key = environment = client = None
    v2 = False
    commit = contextlib.ExitStack()
    try:
        environment = _environment(settings)
        key = worker.key(environment)
        trusted = load_trusted_keys(settings.trusted_keys) if settings.trusted_keys else None
        v2 = worker.uses_v2()
        # TUNECACHE_JIT: FlashInfer JIT modules and the DeepGEMM cache, unless the engine's main
        # process installed them with the rest of the warm state (WarmBoot)
        executable = settings.jit and not Handoff.from_environment().warm_state_run
        target = InstallTarget(
            jit_modules=JitWorkspace() if executable else None,  # this pod's own FlashInfer workspace
            deep_gemm=DeepGemmCache() if executable else None,  # this pod's own DeepGEMM cache directory
            tactics=FlashInferV2Store() if v2 else VllmRankFiles(pod.config_hash, pod.file_names, pod.root),
        )
        client = TunecacheClient.from_settings(settings)
        with client:
            left = started + deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"the install deadline ({deadline:g} s) passed while this worker waited for the "
                                   "pod's lock; nothing was installed")
            # every request within the seconds left of the deadline counted from the hook
            fetched = fetch_tuning(client, key, environment, trusted_keys=trusted, deadline_s=left,
                                   **target.fetch_options())
        took = time.monotonic() - started
        if took > deadline:  # the other workers stop waiting soon: write nothing they would not expect
            raise TimeoutError(f"fetching run {fetched.run.id} took {took:.1f} s, more than the install deadline "
                               f"({deadline:g} s); nothing was installed")
        # put in place only while no worker of this boot gave up waiting; the record below is
        # written in the same window, so a worker that gives up later finds it and follows
        commit.enter_context(_commit_window(pod))
        result = install(fetched, target)
        if result.deep_gemm_dir is not None:  # the directory vLLM would set, set before DeepGEMM reads it
            Handoff(deep_gemm_dir=result.deep_gemm_dir).hand_over()
        level = logging.INFO
        where = result.paths[0] if v2 else pod.root / pod.config_hash
        line = (f"tunecache: installed run {result.run_id} ({result.entries} entries, {len(result.jit_modules)} JIT "
                f"modules) for {key.model} into {where}" + ("" if v2 else f" ({pod.shown_ranks()})")
                + (f"; {result.jit_skipped}" if result.jit_skipped else ""))
    except Exception as exc:  # whatever happens, vLLM boots as it would without tunecache
        result = InstallResult.of_failure(exc)  # a miss (INFO), or an error that is not reported when the server failed
        level = logging.INFO if result.outcome is ReportOutcome.MISS else logging.WARNING
        line = f"tunecache: no tuning installed, vLLM will tune: {result.reason}"
    record = PodRecord(instance=pod.instance, rank=pod.rank, host=socket.gethostname(), pid=os.getpid(), key=key,
                       environment=environment, v2=v2, result=result)
    with commit:
        try:
            _write_record(pod, record)
        except Exception as exc:
            line += (f" (not recorded for this pod's other workers, which will look up themselves: "
                     f"{type(exc).__name__}: {exc})")
    log.log(level, "%s", line)
    _report(record, settings, client, started, pod.rank, True, result)
    return PodInstall(result.outcome, pod.rank, settings)


def _follow(pod: Pod, record: PodRecord, settings: Any, started: float | None = None) -> PodInstall:
    """Take what the pod's first worker recorded: check this rank's file holds the run's
    bytes and put the run's DeepGEMM cache on this process's ``DG_JIT_CACHE_DIR``; no
    lookup. Reports this worker's own outcome (``looked_up`` false). Never raises."""
    by, recorded = record.rank, record.result
    if recorded.outcome is not ReportOutcome.INSTALLED:
        level = logging.INFO if recorded.outcome is ReportOutcome.MISS else logging.WARNING
        log.log(level, "tunecache: no tuning installed, vLLM will tune: %s (found for this pod by rank %s)",
                recorded.reason, by)
        _report(record, settings, None, started, pod.rank, False, recorded)
        return PodInstall(recorded.outcome, pod.rank, settings)
    run = recorded.run_id
    try:
        if record.v2:
            where = recorded.paths[0]  # this pod's own record, written by _install_as_first
            if not where.is_dir():
                raise FileNotFoundError(f"run {run} was installed for this pod by rank {by} into {where}, which is gone")
        else:
            where = pod.rank_file
            try:
                held = hashlib.sha256(where.read_bytes()).hexdigest()
            except FileNotFoundError:
                held = None
            if held != recorded.sha256:
                raise FileNotFoundError(f"run {run} was installed for this pod by rank {by}, but {where} "
                                        f"{'is missing' if held is None else 'holds other bytes'}")
        note = ""
        if recorded.deep_gemm_dir is not None:
            directory = deep_gemm_cache_dir()
            if (directory / "cache").is_dir():
                Handoff(deep_gemm_dir=directory).hand_over()
            else:
                note = f"; its DeepGEMM cache {directory} is missing"
        log.info("tunecache: run %s installed for this pod by rank %s (%s entries, %s JIT modules) for %s: %s%s",
                 run, by, recorded.entries, len(recorded.jit_modules), record.key.model if record.key else None,
                 where, note)
        _report(record, settings, None, started, pod.rank, False, recorded)
        return PodInstall(ReportOutcome.INSTALLED, pod.rank, settings)
    except Exception as exc:
        log.warning("tunecache: no tuning installed, vLLM will tune: %s: %s", type(exc).__name__, exc)
        failed = InstallResult.of_failure(exc)
        _report(record, settings, None, started, pod.rank, False, failed)
        return PodInstall(failed.outcome, pod.rank, settings)


def _environment(settings: Any) -> EnvironmentMetadata:
    from tunecache.client.environment import detect_environment, environment_from_file

    # TUNECACHE_ENVIRONMENT_FILE: for pods whose FlashInfer cannot detect its own
    return environment_from_file(settings.environment_file) if settings.environment_file else detect_environment()


def _report(record: PodRecord, settings: Any, client: TunecacheClient | None, started: float | None, rank: int,
            looked_up: bool, result: InstallResult) -> None:
    """Send this worker's install report (:mod:`tunecache.client.report`) in the background,
    for the key and environment of the pod's record (nothing when it has none: the lookup
    never got that far, or an older plugin wrote it), through ``client``'s server and token
    (a new client of ``settings`` when ``None``), unless ``TUNECACHE_REPORT=0`` or the
    result is not reported (:meth:`InstallResult.report_fields`). Never raises, never waits."""
    fields = result.report_fields()
    if record.key is None or record.environment is None or fields is None or not getattr(settings, "report", True):
        return
    seconds = time.monotonic() - started if started is not None else 0.0
    if _deferred is not None:  # sent once the worker warmed up, with what its boot compiled
        _deferred.append((record, settings, client, seconds, rank, looked_up, result))
        return
    _send_report(record, settings, client, seconds, rank, looked_up, result)


#: Reports held until the worker warmed up (:func:`defer_reports`), else ``None``.
_deferred: list[tuple] | None = None


def defer_reports() -> None:
    """Hold this worker's install report until :func:`send_deferred_reports` (the vLLM plugin
    does, when it can count what the boot compiled once the worker warmed up)."""
    global _deferred
    if _deferred is None:
        _deferred = []


def send_deferred_reports(compiled: dict | None) -> None:
    """Send the held reports, each with the boot's attestation ``compiled``. Never raises."""
    global _deferred
    held, _deferred = _deferred or [], None
    for record, settings, client, seconds, rank, looked_up, result in held:
        _send_report(record, settings, client, seconds, rank, looked_up, result, compiled)


def _send_report(record: PodRecord, settings: Any, client: TunecacheClient | None, seconds: float, rank: int,
                 looked_up: bool, result: InstallResult, compiled: dict | None = None) -> None:
    fields = result.report_fields() or {}
    if compiled is not None:
        fields["compiled"] = compiled
    fields.update(variant_report_fields())
    try:
        from tunecache.client.report import build_report, send_in_background

        if client is None:
            client = TunecacheClient.from_settings(settings)
            client.close()  # only its server, token and TLS settings are used, by the report's own client
        send_in_background(client, build_report(record.key, record.environment, result.outcome, seconds,
                                                ReportSource.PLUGIN, rank=rank, looked_up=looked_up, **fields))
    except Exception as exc:
        log.debug("tunecache: install report not sent: %s: %s", type(exc).__name__, exc)


def _read_record(pod: Pod) -> PodRecord | None:
    """The pod's record of this boot (``pod.instance``), or ``None``: none, another
    instance's (an earlier boot), or unreadable as a record (then it is rewritten).

    Raises:
        OSError: the record exists but cannot be read (permissions, I/O).
    """
    try:
        record = PodRecord.model_validate_json(pod.marker.read_bytes())
    except (FileNotFoundError, ValidationError):
        return None
    if record.instance != pod.instance:
        return None
    result = record.result
    if result.outcome is ReportOutcome.INSTALLED and (result.run_id is None or result.sha256 is None or not result.paths):
        return None
    return record


def _write_record(pod: Pod, record: PodRecord) -> None:
    """Write the pod's record whole (staged and renamed). Raises OSError."""
    stamped = record.model_copy(update={"written_at": time.time()})
    write_atomically(pod.marker, stamped.model_dump_json(indent=1).encode())




@dataclass
class WarmBoot:
    """The engine main process's install of one boot's warm state (the vLLM plugin's
    ``create_engine_config`` hook), :meth:`before` the model is inspected (or, when the key
    is known only from vLLM's config, :meth:`after`): the FlashInfer JIT modules, the
    DeepGEMM cache, Triton's cache and vLLM's model-inspection cache installed, the compile
    cache staged for the workers (vLLM settles parts of its config, the KV-cache block size
    among them, in the engine core, so only a worker's config gives the names its vLLM will
    look for). Logs one line; nothing here raises."""

    settings: Any
    started: float
    key: TuningKey | None = None
    fetched: FetchedTuning | None = None
    result: InstallResult | None = None
    failure: str | None = None
    no_compile_cache: str | None = None
    """Why this vLLM gets no compile cache (:mod:`tunecache.client.vllm_releases`); ``None``: it does."""

    @classmethod
    def before(cls, settings: Any, key: TuningKey | None, environment: EnvironmentMetadata | None,
               no_compile_cache: str | None = None) -> WarmBoot:
        boot = cls(settings, time.monotonic(), key, no_compile_cache=no_compile_cache)
        if key is not None and environment is not None:
            boot._fetch_and_install(environment, "")
        return boot

    def after(self, key: TuningKey | None, environment: EnvironmentMetadata | None) -> None:
        """When nothing was looked up before (the key needed vLLM's config), do it now."""
        if self.fetched is None and self.failure is None and key is not None and environment is not None:
            self.key = key
            self._fetch_and_install(environment, " (max_num_batched_tokens was not given to vLLM, so the key was "
                                                 "known only after vLLM inspected the model)")

    def _fetch_and_install(self, environment: EnvironmentMetadata, note: str) -> None:
        try:
            deadline = install_deadline(self.settings)
            trusted = load_trusted_keys(self.settings.trusted_keys) if self.settings.trusted_keys else None
            cache = VllmCacheRoot(compile_cache=False)
            # the workers load the JIT modules through FlashInfer's AOT path (use_staged_aot_dir)
            target = InstallTarget(jit_modules=JitWorkspace(loads_as_aot=True), deep_gemm=DeepGemmCache(),
                                   triton=TritonCache(), vllm_cache=cache, tactics=None)
            with TunecacheClient.from_settings(self.settings) as client:
                self.fetched = fetch_tuning(client, self.key, environment, trusted_keys=trusted,
                                            deadline_s=self.started + deadline - time.monotonic(),
                                            **target.fetch_options())
            if self.fetched.executable_refused:
                self.failure, self.fetched = self.fetched.executable_refused, None
            else:
                self.result = install(self.fetched, target)
                Handoff(deep_gemm_dir=self.result.deep_gemm_dir, flashinfer_aot_dir=self.result.jit_aot_dir).hand_over()
                if self.result.triton_cache_dir is not None and not os.environ.get("TRITON_CACHE_DIR", "").strip():
                    # Inductor reads Triton kernels from TRITON_CACHE_DIR when it is set, else from
                    # <TORCHINDUCTOR_CACHE_DIR>/triton/<device> (torch._inductor.runtime.
                    # cache_dir_utils.triton_cache_dir), and vLLM 0.25 points TORCHINDUCTOR_CACHE_DIR
                    # into each compile directory when it loads it (vllm/compilation/decorators.py):
                    # without this the engine writes again the kernels installed in Triton's default
                    # (19 on the H200, 2026-12-03). Triton's own default is this directory already.
                    os.environ["TRITON_CACHE_DIR"] = str(self.result.triton_cache_dir)
                Handoff(warm_state_run=str(self.fetched.run.id)).hand_over()
                Handoff(compile_cache=self._stage_compile_cache(vllm_cache_root())).hand_over()
        except Exception as exc:  # whatever happens, vLLM boots as it would without tunecache
            self.fetched, self.result = None, None
            self.failure = InstallResult.of_failure(exc).reason
        self._log(note)

    def _stage_compile_cache(self, root: Path) -> Path | None:
        """Write the run's compile cache beside the cache root for the workers and unpack it
        there on a thread of its own (:func:`unpack_staged`), while vLLM goes on inspecting the
        model and starting its engine core: a worker then only renames its directories into
        place (:func:`install_staged_compile_cache`)."""
        data = self.fetched.warm_state.get(ArtifactKind.VLLM_COMPILE_CACHE) if self.fetched else None
        if data is None or self.fetched.drift.get(ArtifactKind.VLLM_COMPILE_CACHE) or self.no_compile_cache:
            return None
        path = root / ".tunecache" / f"compile-cache-run-{self.fetched.run.id}.tar.gz"
        write_atomically(path, data)
        threading.Thread(target=unpack_staged, args=(path, data), name="tunecache-unpack", daemon=True).start()
        return path

    def _log(self, note: str) -> None:
        took = time.monotonic() - self.started
        if self.result is None:
            log.info("tunecache: no warm state installed (%.1f s): %s%s", took, self.failure or "nothing looked up", note)
            return
        parts = [f"{len(self.result.jit_modules)} JIT modules", *self.result.warm_state]
        if self.result.deep_gemm_dir is not None:
            parts.append(f"DeepGEMM cache into {self.result.deep_gemm_dir}")
        if Handoff.from_environment().compile_cache:
            parts.append("compile cache staged for the workers")
        elif self.no_compile_cache and self.fetched is not None and self.fetched.warm_state.get(
                ArtifactKind.VLLM_COMPILE_CACHE):
            parts.append(f"compile cache not installed: {self.no_compile_cache}")
        elif self.fetched is not None and self.fetched.drift.get(ArtifactKind.VLLM_COMPILE_CACHE):
            parts.append(f"compile cache not installed, built with other packages "
                         f"({self.fetched.drift[ArtifactKind.VLLM_COMPILE_CACHE]})")
        skipped = f"; {self.result.jit_skipped}" if self.result.jit_skipped else ""
        log.info("tunecache: warm state of run %s installed for %s in %.1f s: %s%s%s", self.fetched.run.id,
                 self.key.model if self.key else "?", took, ", ".join(parts), skipped, note)


def use_staged_aot_dir() -> Path | None:
    """In a worker, before its model loads: point its FlashInfer at the AOT directory its
    engine's main process made (:attr:`Handoff.flashinfer_aot_dir`; each hook calls it, the
    same each time); the directory, or
    ``None`` when there is none (or FlashInfer is not importable). Never raises."""
    staged = Handoff.from_environment().flashinfer_aot_dir
    if staged is None:
        return None
    try:
        return staged if use_aot_dir(staged) else None
    except Exception as exc:
        log.warning("tunecache: FlashInfer JIT modules not pointed at: %s: %s", type(exc).__name__, exc)
        return None


@dataclass(frozen=True)
class _Staged:
    warm_state: dict[ArtifactKind, bytes]



#: ``EngineArgs`` fields never reported: the key's own, where the model and its files live, and
#: what changes no compiled kernel of the engine (ports, logging, seeds).
_NOT_VARIANT_ARGS = frozenset({
    "model", "served_model_name", "tokenizer", "download_dir", "load_format", "skip_tokenizer_init", "hf_config_path",
    "max_num_batched_tokens", "tensor_parallel_size", "data_parallel_size", "enable_expert_parallel", "dtype",
    "quantization", "seed", "revision", "code_revision", "tokenizer_revision", "hf_token", "trust_remote_code",
    "disable_log_stats", "enable_log_requests", "worker_cls", "worker_extension_cls", "allowed_local_media_path",
})


def _plain(value: Any) -> Any:
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


def engine_args_of(engine_args: Any, nested: bool = True) -> dict[str, Any]:
    """A vLLM ``EngineArgs``' fields whose value differs from the field's default, as plain
    JSON, but :data:`_NOT_VARIANT_ARGS` and paths: the arguments that name the pod's engine
    variant, as ``tune --engine-args`` (``vllm.LLM``) takes them. A field that holds a config
    object (``compilation_config``: vLLM's ``CompilationConfig``) becomes the object of its own
    non-default plain fields, as ``vllm.LLM`` takes it too. At most
    :data:`tunecache.contract.identity.MAX_ENGINE_ARGS`, each at most
    :data:`~tunecache.contract.identity.MAX_ENGINE_ARG_CHARS` characters of JSON, by name."""
    import dataclasses
    import json

    from tunecache.contract.identity import MAX_ENGINE_ARG_CHARS, MAX_ENGINE_ARGS

    if not dataclasses.is_dataclass(engine_args):
        return {}
    found: dict[str, Any] = {}
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
        text = json.dumps(plain, sort_keys=True)
        if len(text) <= MAX_ENGINE_ARG_CHARS and len(found) < MAX_ENGINE_ARGS:
            found[field.name] = plain
    return found


@dataclass
class _VariantSeen:
    """What this worker found of its engine variant (sent with its reports)."""

    variant: str | None = None
    missing: bool = False


_variant_seen = _VariantSeen()


def variant_report_fields() -> dict[str, Any]:
    """The report fields of this worker's engine variant: ``variant`` (when its compile-cache
    install computed it), ``variant_missing``, ``engine_args`` (:attr:`Handoff.engine_args`)."""
    fields: dict[str, Any] = {}
    if _variant_seen.variant:
        fields["variant"] = _variant_seen.variant
        fields["variant_missing"] = _variant_seen.missing
    args = Handoff.from_environment().engine_args
    if args:
        fields["engine_args"] = args
    return fields


#: Fetches an engine variant's compile cache: ``(run id, tarball)``, or ``None`` when the
#: service has no run of that variant (:func:`fetch_variant_compile_cache`).
VariantFetch = Callable[[str], "tuple[int, bytes] | None"]


def fetch_variant_compile_cache(settings: Any, key: TuningKey, environment: EnvironmentMetadata,
                                variant: str) -> tuple[int, bytes] | None:
    """The compile cache of engine variant ``variant``'s current run, as :func:`fetch_tuning`
    fetches a run (the lookup with the variant, the signature over this pod's key and
    environment, the variant's own rollback memory, the sha256), its kinds that are ``of_variant``
    (:data:`tunecache.contract.KINDS`: Triton's cache) merged into this pod's (the kernels the
    key's run lacks): ``(run id, tarball)``;
    ``None`` when the service has no run of the variant (it answered the key's, of another
    variant), or the run has no compile cache.

    Raises:
        whatever :func:`fetch_tuning` raises; ``UntrustedRun`` when no trusted keys are set
        (a compile cache is code the pod loads).
    """
    from tunecache.client.installed import remember_installed
    from tunecache.signing import UntrustedRun

    if not settings.trusted_keys:
        raise UntrustedRun("a compile cache installs only from a run signed by a trusted key, and no trusted keys "
                           "are set (TUNECACHE_TRUSTED_KEYS)")
    with TunecacheClient.from_settings(settings) as client:
        fetched = fetch_tuning(client, key, environment, trusted_keys=load_trusted_keys(settings.trusted_keys),
                               deadline_s=install_deadline(settings), warm_state=True, variant=variant,
                               warm_state_kinds=(ArtifactKind.VLLM_COMPILE_CACHE, *kinds_where(of_variant=True)))
    data = fetched.warm_state.get(ArtifactKind.VLLM_COMPILE_CACHE)
    if fetched.run.variant != variant or data is None or fetched.executable_refused:
        return None
    for kind in kinds_where(of_variant=True):  # the variant's own (Triton's kernels) beside the key's run's
        if kind in fetched.warm_state:
            destinations_of(kind)[0]().stage(fetched)()
    remember_installed(key, environment, fetched.run.signature.signed_at if fetched.run.signature else None, variant)
    return fetched.run.id, data


#: How long a worker waits for its engine's main process to unpack the staged compile cache
#: (:func:`unpack_staged`) before it unpacks the tarball itself.
UNPACK_WAIT_S = 30.0


def unpacked_dir(staged: Path) -> Path:
    """Where :func:`unpack_staged` unpacks the staged tarball ``staged``: beside it, named by
    this boot (:func:`tunecache.client.report.boot_id`, which the engine's workers inherit)."""
    from tunecache.client.report import boot_id

    return staged.with_name(staged.name.removesuffix(".tar.gz") + f"-{boot_id()}")


def unpack_staged(staged: Path, data: bytes) -> None:
    """In the engine's main process, on a thread: unpack ``data`` (checked as every warm-state
    tarball is) into :func:`unpacked_dir`, staged beside it and renamed when whole; on a
    failure, ``<dir>.failed`` says why (the workers then unpack the tarball themselves).
    What earlier boots left there is removed first (:func:`_remove_stale`). Never raises."""
    import tempfile

    from tunecache.client.warm_state import _open_checked

    target = unpacked_dir(staged)
    try:
        _remove_stale(staged.parent.glob(staged.name.removesuffix(".tar.gz") + "-*"))
        staging = Path(tempfile.mkdtemp(prefix=".unpack-", dir=staged.parent))
        with _open_checked(data, "vllm_compile_cache") as tar:
            tar.extractall(staging, filter="data")
        staging.rename(target)
    except Exception as exc:  # the workers unpack it themselves
        try:
            write_atomically(target.with_name(target.name + ".failed"), f"{type(exc).__name__}: {exc}".encode())
        except OSError:
            pass


#: What an earlier boot left beside the staged compile cache (unpacked directories, a variant's
#: tarball) is removed once it is this old: another engine on the same cache root may still be
#: booting from a newer one.
STALE_AFTER_S = 3600.0


def _remove_stale(paths) -> None:
    """Remove each of ``paths`` (files or directories) last changed over :data:`STALE_AFTER_S` ago."""
    import shutil

    now = time.time()
    for path in paths:
        try:
            if now - path.lstat().st_mtime < STALE_AFTER_S:
                continue
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        except OSError:
            continue


def _wait_unpacked(staged: Path) -> Path | None:
    """The directory the engine's main process unpacked ``staged`` into, once it is there
    (at most :data:`UNPACK_WAIT_S`); ``None`` when it failed, took too long, or is none."""
    target = unpacked_dir(staged)
    failed = target.with_name(target.name + ".failed")
    give_up = time.monotonic() + UNPACK_WAIT_S
    while time.monotonic() < give_up:
        if target.is_dir():
            return target
        if failed.exists():
            return None
        time.sleep(0.01)
    return None


def _rename_unpacked(unpacked: Path, destination: Path, renames: dict[str, str]) -> list[str]:
    """Rename each of ``renames``' directories (path in ``unpacked`` -> path under
    ``destination``) that ``destination`` lacks into place, its Triton group files pointed at
    their final place (as :func:`tunecache.client.warm_state.merge_entries` does from a tarball)."""
    from tunecache.client.warm_state import fix_triton_groups

    installed = []
    for source, target in sorted(renames.items()):
        found, final = unpacked / source, destination / target
        if not found.exists() or final.exists():
            continue
        if found.is_dir():
            fix_triton_groups(found, final)
        final.parent.mkdir(parents=True, exist_ok=True)
        try:
            found.rename(final)
        except OSError:
            if not final.exists():
                raise
            continue
        installed.append(target)
    return installed


def _variant_cache(staged: Path, variant: str, fetch: VariantFetch | None) -> tuple[int, bytes] | None:
    """The compile cache of ``variant`` for this engine: fetched once per boot (by the first
    worker, under the staged cache's lock) and kept beside the staged one for the boot's other
    workers (named by the boot: a later boot asks the service again); ``None`` when the service
    has none (remembered for the boot too)."""
    import glob

    from tunecache.client.report import boot_id

    prefix = f"compile-cache-variant-{variant}-{boot_id()}-run-"
    for found in sorted(glob.glob(os.path.join(glob.escape(str(staged.parent)), glob.escape(prefix) + "*.tar.gz"))):
        run = Path(found).name[len(prefix):-len(".tar.gz")]
        if run.isdigit():
            return int(run), Path(found).read_bytes()
    missing = staged.parent / f"compile-cache-variant-{variant}-{boot_id()}.missing"
    if missing.exists() or fetch is None:
        return None
    _remove_stale(staged.parent.glob(f"compile-cache-variant-{variant}-*"))  # earlier boots'
    got = fetch(variant)
    if got is None:
        write_atomically(missing, b"")
        return None
    write_atomically(staged.parent / f"{prefix}{got[0]}.tar.gz", got[1])
    return got


def install_staged_compile_cache(pod_factors: Callable[[CompileFactors], PodCompileFactors], rank: int,
                                 fetch_variant: VariantFetch | None = None) -> InstallResult | None:
    """In a worker, right before its vLLM compiles: install the compile cache its engine's
    main process staged (:attr:`Handoff.compile_cache`) under the directory names
    ``pod_factors`` (this worker's factors, from its own ``VllmConfig``) give, or name each
    factor that differs; the workers of one engine take turns under a lock (the first
    installs, the others find the directories in place).

    When this worker's engine variant is not the staged run's (another ``max_model_len``,
    compilation setting, ...), the variant's own compile cache is fetched (``fetch_variant``,
    once per engine) and installed instead; when the service has none, the line names how the
    variants differ and the reports say the variant is missing (vLLM compiles; the rest of the
    warm state is installed all the same). Logs one line; never raises."""
    handoff = Handoff.from_environment()
    if handoff.compile_cache is None:
        return None
    started = time.monotonic()
    try:
        path = handoff.compile_cache
        unpacked = _wait_unpacked(path)
        if unpacked is not None and (unpacked / FACTORS_FILE).is_file():
            data = None
            node = CompileFactors.model_validate_json((unpacked / FACTORS_FILE).read_bytes())
        else:
            unpacked, data = None, path.read_bytes()
            node = read_compile_factors(data)
        if node is None:
            raise ValueError("the run's compile cache records no factors")
        factors = pod_factors(node)
        run = handoff.warm_state_run or "?"
        mine = factors.variant_factors.variant if factors.variant_factors else None
        theirs = node.variant_factors.variant if node.variant_factors else None
        _variant_seen.variant, _variant_seen.missing = mine, False
        with file_lock(path.with_suffix(".lock"), DEFAULT_INSTALL_DEADLINE_S):
            if mine and theirs and mine != theirs:
                found = _variant_cache(path, mine, fetch_variant)
                if found is None:
                    _variant_seen.missing = True
                    named = "; ".join(variant_differences(node.variant_factors, factors.variant_factors))
                    skipped = (f"compile cache not installed, vLLM will compile: no warm state is stored for this "
                               f"engine variant ({mine}; run {run} is variant {theirs}, which differs in: {named}); "
                               f"reported to the service as missing")
                    log.info("tunecache: %s (rank %s)", skipped, rank)
                    return InstallResult(outcome=ReportOutcome.INSTALLED, compile_cache_skipped=skipped)
                run, data, unpacked = str(found[0]), found[1], None
                node = read_compile_factors(data)
                if node is None:
                    raise ValueError(f"run {run}'s compile cache records no factors")
                factors = pod_factors(node)
            if unpacked is not None:  # unpacked by the main process: renamed into place
                lines = differences(node, factors)
                renames = {} if lines else pod_dir_names(node, factors)
                dirs = _rename_unpacked(unpacked, path.parent.parent / "torch_compile_cache", renames)
                removed = relocate_compile_dirs(path.parent.parent / "torch_compile_cache", dirs)
                written = {"warm_state": (f"compile cache ({len(dirs)} of {len(renames)} directories)",) if renames else (),
                           "compile_cache_skipped": ("compile cache not installed, vLLM would not use it: "
                                                     + "; ".join(lines)) if lines else removed}
            else:
                written = VllmCacheRoot(path.parent.parent, factors, modelinfos=False).stage(
                    _Staged({ArtifactKind.VLLM_COMPILE_CACHE: data}))()
        result = InstallResult(outcome=ReportOutcome.INSTALLED, **written)
        if result.compile_cache_skipped:
            log.info("tunecache: %s (rank %s)", result.compile_cache_skipped, rank)
        else:
            variant = f" (engine variant {mine})" if mine and mine != theirs else ""
            log.info("tunecache: %s from run %s%s, under the names this worker's vLLM config gives (rank %s, %.2f s)",
                     ", ".join(result.warm_state) or "compile cache already in place", run, variant, rank,
                     time.monotonic() - started)
        return result
    except Exception as exc:
        log.warning("tunecache: compile cache not installed, vLLM will compile: %s: %s", type(exc).__name__, exc)
        return InstallResult.of_failure(exc)
