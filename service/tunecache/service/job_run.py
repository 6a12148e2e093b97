"""One job's run: from a job the job worker claimed (:mod:`tunecache.service.worker`) to its end.

A :class:`JobRun` builds the job's tuner spec (a job it cannot build one for fails at once),
runs the tuner (:func:`tunecache.service.tuner.process.run_tuner`: a child process with a
timeout) in a locked work directory of its own, and meanwhile beats the job's heartbeat: the
lease is renewed, the progress stored, a cancellation seen (the tuner's child is then
terminated and the job recorded ``cancelled``, with no run). If the lease is lost, the result
is dropped. At the end the run the tuning made and the job's end are recorded in one
transaction (:class:`JobEnd`), so a worker that dies between them leaves neither and its job
is tuned again, with one run in the end. A vLLM warmup's verification boot follows.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from pydantic import ValidationError
from sqlalchemy.orm import Session, sessionmaker

from tunecache.contract import (
    JobOptions,
    RunTrigger,
    RunVerification,
    StageChanged,
    StageProgress,
    TunerError,
    TunerEvent,
    TuningKey,
    TuningRunCreate,
    TuningRunRead,
)
from tunecache.service import jobs, metrics, publishing
from tunecache.service.store import SqlTuningStore
from tunecache.service.tuner.model_config import ModelConfigUnavailable, load_job_model_config
from tunecache.service.tuner.process import TunerCancelled, TunerFailed, TunerResult
from tunecache.service.tuner.stages import TuneSpec
from tunecache.service.work_dirs import job_work_dir

log = logging.getLogger("tunecache.worker")

#: Seconds within which a running job's progress is written to the database.
PROGRESS_FLUSH_S = 1.0

#: Lines of the tuner's progress kept on a running job (``log_tail``).
PROGRESS_LINES = 50

#: run_tuner's signature: (spec, work_dir, timeout_s, on_event, cancel=threading.Event) -> TunerResult.
Tuner = Callable[..., TunerResult]

#: A run's verification boot: ``verify(spec, scratch)``.
Verifier = Callable[[TuneSpec, Path], RunVerification]


@dataclass(frozen=True)
class RunSettings:
    """What every job run of one job worker shares (:class:`tunecache.service.worker.JobWorker`'s
    arguments of the same names say what each is)."""

    sessions: sessionmaker[Session]
    worker: str
    lease_s: float
    job_timeout_s: float
    tuner: Tuner
    work_root: Path | None = None
    model_config_dir: Path | None = None
    signing_key: Ed25519PrivateKey | None = None
    trusted_keys: Mapping[str, Any] | None = None
    verify: Verifier | None = None


class LeaseLost(RuntimeError):
    """The worker no longer holds its job (its lease expired and another worker claimed it)
    when it came to record the job's end: nothing of its result is recorded."""


class JobEnd:
    """How a job's result is recorded: the :class:`~tunecache.store.TuningStore` the tuning
    records through (:meth:`TunerResult.record <tunecache.service.tuner.process.TunerResult.record>`),
    whose :meth:`record_run` records the run and marks the job finished with it (succeeded,
    or failed with ``error``) in one transaction. A worker that dies between the two thus
    leaves neither: its job is claimed again and ends with the run of its next tuning, never
    with a run recorded beside it.

    Args:
        store: the database's store (the artifacts' bytes are uploaded through it, each in a
            transaction of its own, before the run is recorded).
        job_id, worker: the job and the worker that holds it.
        error: the job's error (a failed tuning), ``None`` for a succeeded one.
        log_tail: the tuner's last lines, kept on the job.
    """

    def __init__(self, store: SqlTuningStore, job_id: int, worker: str, *, error: str | None = None,
                 log_tail: str | None = None):
        self.store = store
        self.job_id = job_id
        self.worker = worker
        self.error = error
        self.log_tail = log_tail

    def upload_file(self, path: Path, again: bool = False) -> str:
        return self.store.upload_file(path, again)

    def record_run(self, run: TuningRunCreate) -> TuningRunRead:
        """Record ``run`` (:func:`tunecache.service.publishing.record_run`) and the job's end
        with it, in one transaction.

        Raises:
            LeaseLost: the worker no longer holds the job (nothing is recorded).
            ArtifactsMissing, IndeterminateEnvironment: as ``record_run`` (nothing is recorded).
        """
        with self.store.sessions.begin() as session:
            recorded = publishing.record_run(session, run, trusted_keys=self.store.trusted_keys)
            self._finish(session, recorded.id)
        return recorded

    def without_run(self) -> None:
        """Record the job's end with no run (a tuner that failed before it knew its GPU, a job
        that could not be tuned).

        Raises:
            LeaseLost: the worker no longer holds the job.
        """
        with self.store.sessions.begin() as session:
            self._finish(session, None)

    def _finish(self, session: Session, run_id: int | None) -> None:
        if not jobs.finish(session, self.job_id, self.worker, run_id=run_id, error=self.error, log_tail=self.log_tail):
            raise LeaseLost(f"job {self.job_id} is no longer held by {self.worker}")


class Progress:
    """A running job's progress as the tuner's events tell it (``stage``, ``step``, ``total``,
    ``log_tail``: what :func:`tunecache.service.jobs.heartbeat` stores); stage timings go to
    the metrics (``tunecache_stage_duration_seconds``)."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.lines: list[str] = []

    def on_event(self, event: TunerEvent) -> None:
        if isinstance(event, StageChanged):
            self.values.update(stage=event.stage.value, step=None, total=None)
            self.lines.append(f"stage {event.stage}: {event.status}" + (f" ({event.reason})" if event.reason else ""))
            if event.status == "done" and event.seconds is not None:
                metrics.observe_stage(event.stage.value, event.seconds)
        elif isinstance(event, StageProgress):
            self.values.update(stage=event.stage.value, step=event.step, total=event.total)
            self.lines.append(f"{event.stage} {event.step}/{event.total} {event.detail}")
        elif isinstance(event, TunerError):
            self.lines.append(f"error: {event.message}")
        self.values["log_tail"] = "\n".join(self.lines[-PROGRESS_LINES:])

    def snapshot(self) -> dict[str, Any]:
        return dict(self.values)

    @property
    def log_tail(self) -> str | None:
        return self.values.get("log_tail")


class JobRun:
    """One claimed job, run to its end by :meth:`run` (never raises for the job's own failures:
    they are recorded on the job)."""

    def __init__(self, settings: RunSettings, job_id: int):
        self.settings = settings
        self.job_id = job_id
        self.progress = Progress()
        self.cancel = threading.Event()  # set when the job is cancelled: the tuner stops its child
        self.lease_lost = threading.Event()
        self._tuned = threading.Event()

    def run(self, key: TuningKey, hf_config: dict[str, Any] | None, stored_options: dict[str, Any]) -> None:
        """Tune the job's ``key`` with its stored ``hf_config`` (the node's model config
        directory's when ``None``) and options (:class:`~tunecache.contract.JobOptions` as
        stored), and record its end."""
        spec = self._spec(key, hf_config, stored_options)
        if spec is not None:
            self._tune(spec)

    def _fail(self, error: str, detail: str = "") -> None:
        """The job failed before anything ran: its end, with ``error`` (``detail`` goes to
        this log only)."""
        log.warning("worker %s: job %d failed: %s%s", self.settings.worker, self.job_id, error,
                    f" ({detail})" if detail else "")
        try:
            JobEnd(self._store(), self.job_id, self.settings.worker, error=error).without_run()
        except LeaseLost as exc:
            log.warning("worker %s: %s", self.settings.worker, exc)

    def _spec(self, key: TuningKey, hf_config: dict[str, Any] | None,
              stored_options: dict[str, Any]) -> TuneSpec | None:
        """The job's tuner spec, or ``None`` when it has none (the job is then failed)."""
        settings = self.settings
        try:
            config = hf_config if hf_config is not None else load_job_model_config(settings.model_config_dir, key.model)
        except ModelConfigUnavailable as exc:
            # the job (and GET /v1/tuning-jobs) gets the public message; paths and OS errors stay in this log
            self._fail(str(exc), exc.detail if exc.detail != str(exc) else "")
            return None
        try:
            options = JobOptions.model_validate(stored_options)
            return TuneSpec(deployment=key.deployment(), hf_config=config, gemm_backends=options.gemm_backends,
                            stages=options.stages, warmup=options.warmup, engine_args=options.engine_args or {})
        except ValidationError as exc:
            # a row stored before a rule of the contract (an engine argument the allow-list now
            # refuses: tunecache.contract.engine_args; an option it does not know) or written
            # past the API: nothing runs
            problem = exc.errors()[0]
            message, where = str(problem["msg"]).removeprefix("Value error, "), ".".join(map(str, problem["loc"]))
            self._fail(message if not where or message.startswith(where) else f"{where}: {message}")
            return None

    def _store(self) -> SqlTuningStore:
        return SqlTuningStore(self.settings.sessions, trusted_keys=self.settings.trusted_keys)

    def _heartbeat(self) -> None:
        """Progress reaches the database within :data:`PROGRESS_FLUSH_S`; the lease is renewed
        at least every third of its length; a cancellation is seen within :data:`PROGRESS_FLUSH_S`."""
        settings = self.settings
        written: dict[str, Any] = {}
        renewed = time.monotonic()
        while not self._tuned.wait(min(settings.lease_s / 3, PROGRESS_FLUSH_S)):
            if not self.cancel.is_set():
                with settings.sessions.begin() as session:
                    if jobs.cancel_requested(session, self.job_id):
                        self.cancel.set()
            snapshot = self.progress.snapshot()
            if snapshot == written and time.monotonic() - renewed < settings.lease_s / 3:
                continue
            with settings.sessions.begin() as session:
                held = jobs.heartbeat(session, self.job_id, settings.worker, settings.lease_s, snapshot)
            if not held:
                self.lease_lost.set()
                return
            written, renewed = snapshot, time.monotonic()

    def _tune(self, spec: TuneSpec) -> None:
        settings = self.settings
        started = time.monotonic()  # for tunecache_job_duration_seconds
        beat = threading.Thread(target=self._heartbeat, daemon=True)
        beat.start()
        with job_work_dir(settings.work_root, self.job_id) as work:
            result: TunerResult | None = None
            failure: TunerFailed | None = None
            try:
                result = settings.tuner(spec, work, settings.job_timeout_s, self.progress.on_event, cancel=self.cancel)
            except TunerCancelled:
                self.cancel.set()
            except TunerFailed as exc:
                failure = exc
            finally:
                self._tuned.set()
                beat.join()
            outcome, run = self._end(spec, result, failure)
            metrics.observe_job(outcome, time.monotonic() - started)
            if run is not None and spec.warmup == "vllm" and settings.verify is not None:
                self._verify(run.id, spec, work / "verification")

    def _end(self, spec: TuneSpec, result: TunerResult | None,
             failure: TunerFailed | None) -> tuple[str, TuningRunRead | None]:
        """Record the job's end (and its run); returns the outcome for the metrics
        (``lost``, ``cancelled``, ``failed`` or ``succeeded``) and a succeeded job's run."""
        settings, job_id = self.settings, self.job_id
        if self.lease_lost.is_set():
            log.warning("worker %s: lease of job %d was lost; its result is dropped", settings.worker, job_id)
            return "lost", None
        if not self.cancel.is_set():  # a last look: a cancel may have come after the heartbeat's
            with settings.sessions.begin() as session:
                if jobs.cancel_requested(session, job_id):
                    self.cancel.set()
        if self.cancel.is_set():
            log.info("worker %s: job %d cancelled; tuner stopped, nothing recorded", settings.worker, job_id)
            with settings.sessions.begin() as session:
                jobs.finish_cancelled(session, job_id, settings.worker, log_tail=self.progress.log_tail)
            return "cancelled", None
        try:
            if failure is not None:
                record = failure.run_record(spec, RunTrigger.HTTP, settings.worker)
                tail = "\n".join([self.progress.log_tail or "", failure.log_tail]).strip()
                end = JobEnd(self._store(), job_id, settings.worker, error=failure.message, log_tail=tail)
                end.record_run(record) if record is not None else end.without_run()
                return "failed", None
            assert result is not None
            end = JobEnd(self._store(), job_id, settings.worker, log_tail=self.progress.log_tail)
            return "succeeded", result.record(end, spec, RunTrigger.HTTP, settings.worker, settings.signing_key)
        except LeaseLost as exc:
            log.warning("worker %s: %s; its result is dropped", settings.worker, exc)
            return "lost", None

    def _verify(self, run_id: int, spec: TuneSpec, scratch: Path) -> None:
        """The recorded vLLM warmup's verification boot, stored with its run. Never raises: a
        boot that failed is the verification's finding, a verifier that failed is logged."""
        from tunecache.service.tuner.verification import shown

        settings = self.settings
        assert settings.verify is not None
        try:
            verification = settings.verify(spec, scratch)
            self._store().record_verification(run_id, verification)
            log.info("worker %s: run %d: %s", settings.worker, run_id, shown(verification))
        except Exception as exc:
            log.warning("worker %s: run %d not verified: %s: %s", settings.worker, run_id, type(exc).__name__, exc)
