"""Pod coordination: the workers of one engine install a run's tactics once per boot, as one.

The boot's last phase, in each worker's first warmup hook (:mod:`tunecache.client.boot.hooks`,
whose :class:`~tunecache.client.boot.engine.VllmWorker` tells each worker's :class:`Pod` from
vLLM's own functions). Under an exclusive lock on ``<root>/.tunecache/<hash>.lock``
(:attr:`Pod.lock`), the first worker of the boot (no :class:`PodRecord` of its instance in
``<root>/.tunecache/<hash>.json``, :attr:`Pod.marker`) looks up the current tuning for the
pod's key and its FlashInfer environment, fetches and verifies it within the install
deadline (``TUNECACHE_INSTALL_DEADLINE``, counted from its hook), installs it for every rank
(:func:`tunecache.client.install.install`) and records what it came to for its instance.
The other workers wait for the lock (never longer than the install deadline plus
:data:`INSTALL_WAIT_MARGIN_S`), read that record and look nothing up: every worker of the pod
gets the same run, or the same miss or error. A record of another instance (an earlier boot
on a persistent volume) means a fresh lookup. A worker that gives up waiting marks the boot
abandoned, and the first then puts nothing in place (:func:`_commit_window`, vllm#57423).

When the engine's main process installed the rest of the warm state already
(:mod:`tunecache.client.boot.main_process`), the workers install the tactics only, of that run,
fetched by the id it handed over (:attr:`tunecache.client.boot.handoff.Handoff.warm_state_run`):
never what became current meanwhile. When that run cannot be fetched or verified, nothing is
installed and the reports say why (:class:`HandedRunUnavailable`): a boot keeps to one run.

Each worker logs one line (under vLLM's ``vllm`` logger) and reports its own outcome
(:func:`tunecache.client.boot.reporting.report_install`, in the background); nothing here raises.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from pydantic import BaseModel, ValidationError

from tunecache.client.atomic import file_lock, remove_stale, write_atomically
from tunecache.client.boot.handoff import Handoff
from tunecache.client.boot.reporting import report_install
from tunecache.store.http import TunecacheClient
from tunecache.client.install import InstallResult, fetch_tuning, install
from tunecache.client.layouts import FlashInferV2Store, VllmRankFiles
from tunecache.client.pipeline import InstallTarget
from tunecache.engines.vllm.paths import deep_gemm_cache_dir
from tunecache.contract import ENVIRONMENT_FIELDS, ArtifactKind, EnvironmentMetadata, ReportOutcome, TuningKey
from tunecache.formats.autotune_file import check_loadable
from tunecache.signing import load_trusted_keys
from tunecache.store import ServerUnreachable, TunecacheError

if TYPE_CHECKING:  # the pod's settings, imported only where it is booted (not with the plugin)
    from collections.abc import Mapping

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from tunecache.client.install import FetchedTuning
    from tunecache.client.settings import ClientSettings

#: Under vLLM's own ``vllm`` logger, so these lines appear in vLLM's log, in its format.
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
    settings: ClientSettings | None = None
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
    shared_names: tuple[str, ...] = ()
    """Files under ``root/config_hash`` every worker's vLLM reads besides its own, written with
    the run's file as the rank files are (:func:`tunecache.engines.vllm.paths.shared_autotune_file_names`)."""

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


def install_deadline(settings: ClientSettings) -> float:
    """Seconds from a worker's first hook within which its pod's install must have fetched
    everything: ``TUNECACHE_INSTALL_DEADLINE`` where the settings have it, else 30."""
    value = getattr(settings, "install_deadline", None)
    try:
        return float(value) if value is not None and float(value) > 0 else DEFAULT_INSTALL_DEADLINE_S
    except (TypeError, ValueError):
        return DEFAULT_INSTALL_DEADLINE_S


def install_for_pod(worker: Worker, settings: ClientSettings) -> PodInstall:
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


def _give_up(pod: Pod, settings: ClientSettings, started: float, deadline: float) -> PodInstall:
    """After this worker's wait for the pod's first worker ran out: under the commit lock,
    follow the first worker's record if it put the run in place meanwhile; else mark the boot
    abandoned (:attr:`Pod.abandoned`), so that the first installs nothing either: every rank
    sees the same state, never one rank's run and another's nothing (vllm#57423)."""
    with file_lock(pod.commit_lock, COMMIT_WAIT_S):
        record = _read_record(pod)
        if record is not None:
            return _follow(pod, record, settings, started)
        remove_stale(pod.abandoned.parent.glob(f"{pod.config_hash}.abandoned-*"))
        write_atomically(pod.abandoned, pod.instance.encode())
    log.warning("tunecache: no tuning installed, vLLM will tune: this pod's first worker was still installing after "
                "%.0f s (the install deadline, %g s, plus %g s); it will install nothing either, so every rank boots "
                "alike", time.monotonic() - started, deadline, INSTALL_WAIT_MARGIN_S)
    return PodInstall(ReportOutcome.ERROR, pod.rank, settings)


def _in_place(pod: Pod, worker: Worker, settings: ClientSettings, unwritable: OSError) -> PodInstall:
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
            environment = pod_environment(settings)
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


def _install_as_first(pod: Pod, worker: Worker, settings: ClientSettings, started: float, deadline: float) -> PodInstall:
    """Look up once for the pod, fetch, install every rank's file (all or none), the JIT
    modules and the DeepGEMM cache; record the outcome for the pod's other workers. Call it
    holding the pod's lock. Never raises."""
    key = environment = client = None
    v2 = False
    commit = contextlib.ExitStack()
    try:
        environment = pod_environment(settings)
        key = worker.key(environment)
        trusted = load_trusted_keys(settings.trusted_keys) if settings.trusted_keys else None
        v2 = worker.uses_v2()
        # TUNECACHE_JIT: FlashInfer JIT modules and the DeepGEMM cache, unless the engine's main
        # process installed them with the rest of the warm state (WarmBoot): then that run's tactics
        handed = Handoff.from_environment().warm_state_run
        executable = settings.jit and handed is None
        target = InstallTarget.of(  # into this pod's own FlashInfer workspace and DeepGEMM cache directory
            (ArtifactKind.FLASHINFER_JIT_MODULE, ArtifactKind.DEEP_GEMM_JIT_CACHE) if executable else (),
            FlashInferV2Store() if v2 else VllmRankFiles(pod.config_hash, pod.file_names + pod.shared_names, pod.root),
        )
        client = TunecacheClient.from_settings(settings)
        with client:
            left = started + deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"the install deadline ({deadline:g} s) passed while this worker waited for the "
                                   "pod's lock; nothing was installed")
            # every request within the seconds left of the deadline counted from the hook
            fetched = _fetch(client, key, environment, trusted, left, target, handed)
        took = time.monotonic() - started
        if took > deadline:  # the other workers stop waiting soon: write nothing they would not expect
            raise TimeoutError(f"fetching run {fetched.run.id} took {took:.1f} s, more than the install deadline "
                               f"({deadline:g} s); nothing was installed")
        # put in place only while no worker of this boot gave up waiting; the record below is
        # written in the same window, so a worker that gives up later finds it and follows
        commit.enter_context(_commit_window(pod))
        result = install(fetched, target)
        if handed == fetched.run.id:  # its warm state: the main process's
            result = result.model_copy(update={"missing_kinds": fetched.drifted(fetched_only=False)})
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
    report_install(record.key, record.environment, settings, client, started, pod.rank, True, result)
    return PodInstall(result.outcome, pod.rank, settings)


class HandedRunUnavailable(TunecacheError):
    """The run whose warm state this boot's engine installed (:attr:`Handoff.warm_state_run`)
    cannot be installed here (gone, retired, no longer trusted, another key's): the workers
    install nothing, so that the boot never holds one run's warm state and another's tactics."""


def _fetch(client: TunecacheClient, key: TuningKey, environment: EnvironmentMetadata,
           trusted: Mapping[str, Ed25519PublicKey] | None, left: float, target: InstallTarget,
           handed: int | None) -> FetchedTuning:
    """The pod's run: the one the engine's main process installed the warm state of, by its id
    (``handed``), else the current one (:func:`fetch_tuning`).

    Raises:
        HandedRunUnavailable: ``handed`` could not be fetched or verified (why is named);
        as :func:`fetch_tuning` (ServerUnreachable also with ``handed``)."""
    try:
        return fetch_tuning(client, key, environment, trusted_keys=trusted, deadline_s=left, run_id=handed,
                            **target.fetch_options())
    except Exception as exc:
        if handed is None or isinstance(exc, ServerUnreachable):
            raise
        raise HandedRunUnavailable(f"run {handed}, whose warm state this boot's engine installed, could not be "
                                   f"fetched: {exc}; nothing was installed, so that the boot keeps to one run") from None


def _follow(pod: Pod, record: PodRecord, settings: ClientSettings, started: float | None = None) -> PodInstall:
    """Take what the pod's first worker recorded: check this rank's file holds the run's
    bytes and put the run's DeepGEMM cache on this process's ``DG_JIT_CACHE_DIR``; no
    lookup. Reports this worker's own outcome (``looked_up`` false). Never raises."""
    by, recorded = record.rank, record.result
    if recorded.outcome is not ReportOutcome.INSTALLED:
        level = logging.INFO if recorded.outcome is ReportOutcome.MISS else logging.WARNING
        log.log(level, "tunecache: no tuning installed, vLLM will tune: %s (found for this pod by rank %s)",
                recorded.reason, by)
        report_install(record.key, record.environment, settings, None, started, pod.rank, False, recorded)
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
        report_install(record.key, record.environment, settings, None, started, pod.rank, False, recorded)
        return PodInstall(ReportOutcome.INSTALLED, pod.rank, settings)
    except Exception as exc:
        log.warning("tunecache: no tuning installed, vLLM will tune: %s: %s", type(exc).__name__, exc)
        failed = InstallResult.of_failure(exc)
        report_install(record.key, record.environment, settings, None, started, pod.rank, False, failed)
        return PodInstall(failed.outcome, pod.rank, settings)


def pod_environment(settings: ClientSettings) -> EnvironmentMetadata:
    """This pod's FlashInfer environment: ``TUNECACHE_ENVIRONMENT_FILE`` when set (for pods whose
    FlashInfer cannot detect its own), else FlashInfer's (:func:`tunecache.client.environment.detect_environment`)."""
    from tunecache.client.environment import detect_environment, environment_from_file

    return environment_from_file(settings.environment_file) if settings.environment_file else detect_environment()




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



