"""The job worker: claims tuning jobs for this node's GPU and runs them, one at a time.

It runs as a thread of the service process on a GPU node. The tuning itself runs in a
child process (:func:`tunecache.service.tuner.process.run_tuner`) with a timeout, so the
API keeps serving whatever the tuner does. While it runs, a heartbeat renews the job's
lease and stores its progress; if the lease is lost the result is dropped; if the job is
cancelled (``DELETE /v1/tuning-jobs/{id}``) the tuner's child is terminated and the job
recorded ``cancelled``, with no run. The worker itself beats too (the ``workers`` table),
so that clients can tell whether any live worker will take a job for its GPU. Each step
(claim, heartbeat, the job's end) is one transaction of its own; the run a job made and the
job's end are one transaction (:class:`JobEnd`), so a worker that dies between them leaves
neither and its job is tuned again, with one run in the end.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from pydantic import ValidationError
from sqlalchemy.orm import Session, sessionmaker

from tunecache.contract import (
    RunTrigger,
    RunVerification,
    StageChanged,
    StageProgress,
    TunerError,
    TunerEvent,
    TuningRunCreate,
    TuningRunRead,
)
from tunecache.service import jobs, publishing
from tunecache.service import metrics
from tunecache.service.store import SqlTuningStore
from tunecache.service.tuner.model_config import ModelConfigUnavailable, load_job_model_config
from tunecache.service.tuner.process import TunerCancelled, TunerFailed, TunerResult, run_tuner
from tunecache.service.tuner.stages import TuneSpec

log = logging.getLogger("tunecache.worker")

#: Seconds within which a running job's progress is written to the database.
PROGRESS_FLUSH_S = 1.0

#: Seconds between a worker's heartbeats (``workers.last_seen``), by default.
WORKER_HEARTBEAT_S = 15.0

#: run_tuner's signature: (spec, work_dir, timeout_s, on_event, cancel=threading.Event) -> TunerResult.
Tuner = Callable[..., TunerResult]


@dataclass(frozen=True)
class GpuIdentity:
    """This node's GPU as torch names it: ``("NVIDIA H200", "sm90")``."""

    gpu_name: str
    arch: str


def detect_gpu() -> tuple[GpuIdentity | None, str]:
    """The GPU of device 0, asked in a child process so the service never holds a CUDA context.

    Returns ``(identity, "")`` or ``(None, reason)`` (no torch, no CUDA device, ...).
    """
    code = (
        "import torch\n"
        "if not torch.cuda.is_available(): raise SystemExit('no CUDA device')\n"
        "major, minor = torch.cuda.get_device_capability(0)\n"
        "print(torch.cuda.get_device_name(0)); print(f'sm{major}{minor}')\n"
    )
    try:
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return None, "GPU detection timed out"
    if result.returncode != 0:
        reason = (result.stderr.strip().splitlines() or ["unknown error"])[-1]
        return None, reason
    name, arch = result.stdout.strip().splitlines()[-2:]
    return GpuIdentity(name, arch), ""


#: In each job's work directory: the file its worker holds an exclusive ``flock`` on while
#: the job runs; a directory whose lock can be taken was left by a worker that died.
WORK_DIR_LOCK = ".tunecache-worker.lock"


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        return True
    return True


@contextlib.contextmanager
def job_work_dir(work_root: Path | None, job_id: int) -> Iterator[Path]:
    """A new work directory for ``job_id`` under ``work_root`` (the system's temporary
    directory by default), locked (:data:`WORK_DIR_LOCK`) while in use and removed after."""
    path = Path(tempfile.mkdtemp(prefix=f"tunecache-job-{job_id}-", dir=work_root))
    fd = os.open(path / WORK_DIR_LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        os.close(fd)


def remove_abandoned_work_dirs(work_root: Path | None) -> list[Path]:
    """Remove the job work directories under ``work_root`` whose worker process is gone
    (their :data:`WORK_DIR_LOCK` can be taken); those of live workers are left alone, and so
    is anything without the lock file. Returns what was removed."""
    removed = []
    for path in Path(work_root or tempfile.gettempdir()).glob("tunecache-job-*"):
        try:
            fd = os.open(path / WORK_DIR_LOCK, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:  # not one of ours, or already gone
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # a live worker's
            os.close(fd)
            continue
        try:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        finally:
            os.close(fd)
    if removed:
        log.warning("removed the work directories of dead workers: %s", ", ".join(str(p) for p in removed))
    return removed


def image_vllm_version() -> str | None:
    """The vLLM installed where this worker runs (its tuner's, ``importlib.metadata``; vLLM is
    not imported), or ``None``."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vllm")
    except PackageNotFoundError:
        return None


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
        """Record the job's end with no run (a tuner that failed before it knew its GPU).

        Raises:
            LeaseLost: the worker no longer holds the job.
        """
        with self.store.sessions.begin() as session:
            self._finish(session, None)

    def _finish(self, session: Session, run_id: int | None) -> None:
        if not jobs.finish(session, self.job_id, self.worker, run_id=run_id, error=self.error, log_tail=self.log_tail):
            raise LeaseLost(f"job {self.job_id} is no longer held by {self.worker}")


class JobWorker:
    """Claims and runs tuning jobs for one GPU.

    Args:
        sessions: session factory of the service's database.
        gpu: the GPU this worker serves (jobs for other GPUs are left to other nodes).
        name: worker name recorded on claimed jobs (host name and pid by default).
        lease_s: lease length in seconds; renewed every ``lease_s / 3``.
        job_timeout_s: the tuner child is killed after this many seconds.
        max_attempts: claims of one job before it is failed (its workers kept dying).
        poll_s: seconds between claim attempts when the queue is empty.
        work_root: where the tuner's per-job directories are made.
        model_config_dir: the node's model config directory (``TUNECACHE_MODEL_CONFIG_DIR``):
            a job without ``hf_config`` for model ``org/name`` is tuned with
            ``<dir>/org/name/config.json`` and fails without this directory
            (:func:`tunecache.service.tuner.model_config.load_job_model_config`).
        signing_key: the node's Ed25519 key (``TUNECACHE_SIGNING_KEY``): every run it records
            is signed (pods install JIT modules and DeepGEMM caches only from signed runs).
        verify: after a job's vLLM warmup was recorded (its job finished), the run's
            verification boot: ``verify(spec, scratch)`` returns a
            :class:`~tunecache.contract.RunVerification`, stored with the run (the service's:
            :func:`tunecache.service.tuner.verification.verify_run` against its own URL,
            ``TUNECACHE_VERIFY_URL``); ``None``: no verification boot.
        tuner: the function that tunes (the real child-process runner by default); it is
            called as ``tuner(spec, work_dir, timeout_s, on_event, cancel=event)`` and must
            stop (raising :class:`~tunecache.service.tuner.process.TunerCancelled`) once
            ``event`` is set.
        heartbeat_s: seconds between the worker's own heartbeats (``workers`` table),
            written from :meth:`start` to :meth:`stop`.
    """

    def __init__(
        self,
        sessions: sessionmaker[Session],
        gpu: GpuIdentity,
        name: str,
        *,
        lease_s: float = 60.0,
        job_timeout_s: float = 3600.0,
        max_attempts: int = 3,
        poll_s: float = 2.0,
        work_root: Path | None = None,
        model_config_dir: Path | None = None,
        signing_key: Ed25519PrivateKey | None = None,
        trusted_keys: dict | None = None,
        tuner: Tuner = run_tuner,
        heartbeat_s: float = WORKER_HEARTBEAT_S,
        verify: Callable[[TuneSpec, Path], RunVerification] | None = None,
    ):
        self.sessions = sessions
        self.gpu = gpu
        self.name = name
        self.lease_s = lease_s
        self.job_timeout_s = job_timeout_s
        self.max_attempts = max_attempts
        self.poll_s = poll_s
        self.work_root = work_root
        self.model_config_dir = model_config_dir
        self.signing_key = signing_key
        self.trusted_keys = trusted_keys
        self.tuner = tuner
        self.heartbeat_s = heartbeat_s
        self.verify = verify
        self.vllm_version = image_vllm_version()
        self.started_at = jobs.utcnow()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._beat: threading.Thread | None = None

    def start(self) -> None:
        """Run the claim loop and the worker's heartbeat, each on a daemon thread; the worker
        is announced (listed live) before this returns (the heartbeat retries if that fails).
        Work directories left by a worker process that died are removed first."""
        remove_abandoned_work_dirs(self.work_root)
        try:
            self.announce()
        except Exception as exc:  # the database is away: the heartbeat thread announces later
            log.warning("worker %s: not announced yet: %s: %s", self.name, type(exc).__name__, exc)
        self._beat = threading.Thread(target=self._beat_forever, name=f"tunecache-worker-beat-{self.name}", daemon=True)
        self._beat.start()
        self._thread = threading.Thread(target=self.run_forever, name=f"tunecache-worker-{self.name}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop claiming and beating; the worker is recorded stopped (no longer live)."""
        self._stop.set()
        for thread in (self._thread, self._beat):
            if thread is not None:
                thread.join(timeout)
        if self._beat is not None:
            try:
                with self.sessions.begin() as session:
                    jobs.worker_stopped(session, self.name)
            except Exception:  # the database may be gone at shutdown; the row then ages out
                log.warning("worker %s: could not record its stop", self.name, exc_info=True)

    def announce(self) -> None:
        """Write one heartbeat of this worker (its GPU, whether it has a model config dir)."""
        with self.sessions.begin() as session:
            jobs.announce_worker(session, self.name, self.gpu.gpu_name, self.gpu.arch,
                                 model_config_dir=self.model_config_dir is not None, heartbeat_s=self.heartbeat_s,
                                 started_at=self.started_at, vllm_version=self.vllm_version)

    def _beat_forever(self) -> None:
        while not self._stop.is_set():
            try:
                self.announce()
            except Exception:  # a database hiccup must not stop the heartbeat
                log.warning("worker %s: heartbeat not written", self.name, exc_info=True)
            self._stop.wait(self.heartbeat_s)

    def run_forever(self) -> None:
        while not self._stop.is_set():
            try:
                worked = self.run_once()
            except Exception:  # a database hiccup must not kill the worker thread
                log.exception("worker %s: claim or run failed", self.name)
                worked = False
            if not worked:
                self._stop.wait(self.poll_s)

    def run_once(self) -> bool:
        """Claim one job and run it to the end. Returns False when there was nothing to claim.

        Jobs that a worker of this host left running when its process died (``kill -9``)
        are taken back at once (:func:`tunecache.service.jobs.release_jobs_of_dead_workers`),
        and the work directories no live worker holds are removed."""
        host = self.name.rpartition(":")[0] if self.name.rpartition(":")[2].isdigit() else None
        with self.sessions.begin() as session:
            released = jobs.release_jobs_of_dead_workers(session, host, process_alive) if host else []
            if released:
                log.warning("worker %s: job(s) %s of a worker process of this host that died are claimable again",
                            self.name, ", ".join(map(str, released)))
                remove_abandoned_work_dirs(self.work_root)
            job = jobs.claim(session, self.name, self.gpu.gpu_name, self.gpu.arch, self.lease_s, self.max_attempts,
                             vllm_version=self.vllm_version)
            if job is None:
                return False
            key, hf_config, options = jobs.job_spec_inputs(session, job.id)
        log.info("worker %s: running job %d for %s", self.name, job.id, key.model)
        try:
            config = hf_config if hf_config is not None else load_job_model_config(self.model_config_dir, key.model)
        except ModelConfigUnavailable as exc:
            # the job (and GET /v1/tuning-jobs) gets the public message; paths and OS errors stay in this log
            log.warning("worker %s: job %d failed: %s%s", self.name, job.id, exc,
                        f" ({exc.detail})" if exc.detail != str(exc) else "")
            with self.sessions.begin() as session:
                jobs.finish(session, job.id, self.name, error=str(exc))
            return True
        try:
            spec = TuneSpec(
                deployment=key.deployment(),
                hf_config=config,
                gemm_backends=options.get("gemm_backends"),
                stages=options.get("stages"),
                warmup=options.get("warmup") or "stages",
                engine_args=options.get("engine_args") or {},
            )
        except ValidationError as exc:
            # a row stored before a rule of the contract (an engine argument the allow-list now
            # refuses: tunecache.contract.engine_args) or written past the API: nothing runs
            error = str(exc.errors()[0]["msg"]).removeprefix("Value error, ")
            log.warning("worker %s: job %d failed: %s", self.name, job.id, error)
            with self.sessions.begin() as session:
                jobs.finish(session, job.id, self.name, error=error)
            return True
        self._run_job(job.id, spec)
        return True

    def _run_job(self, job_id: int, spec: TuneSpec) -> None:
        started = time.monotonic()  # for tunecache_job_duration_seconds
        progress: dict[str, Any] = {}
        lines: list[str] = []
        lease_lost = threading.Event()
        cancel = threading.Event()  # set when the job is cancelled: the tuner stops its child
        done = threading.Event()

        def on_event(event: TunerEvent) -> None:
            if isinstance(event, StageChanged):
                progress.update(stage=event.stage.value, step=None, total=None)
                lines.append(f"stage {event.stage}: {event.status}" + (f" ({event.reason})" if event.reason else ""))
                if event.status == "done" and event.seconds is not None:
                    metrics.observe_stage(event.stage.value, event.seconds)
            elif isinstance(event, StageProgress):
                progress.update(stage=event.stage.value, step=event.step, total=event.total)
                lines.append(f"{event.stage} {event.step}/{event.total} {event.detail}")
            elif isinstance(event, TunerError):
                lines.append(f"error: {event.message}")
            progress["log_tail"] = "\n".join(lines[-50:])

        def heartbeat() -> None:
            # Progress reaches the database within PROGRESS_FLUSH_S; the lease is renewed
            # at least every third of its length; a cancellation is seen within PROGRESS_FLUSH_S.
            written: dict[str, Any] = {}
            renewed = time.monotonic()
            while not done.wait(min(self.lease_s / 3, PROGRESS_FLUSH_S)):
                if not cancel.is_set():
                    with self.sessions.begin() as session:
                        if jobs.cancel_requested(session, job_id):
                            cancel.set()
                snapshot = dict(progress)
                if snapshot == written and time.monotonic() - renewed < self.lease_s / 3:
                    continue
                with self.sessions.begin() as session:
                    held = jobs.heartbeat(session, job_id, self.name, self.lease_s, snapshot)
                if not held:
                    lease_lost.set()
                    return
                written, renewed = snapshot, time.monotonic()

        beat = threading.Thread(target=heartbeat, daemon=True)
        beat.start()
        with job_work_dir(self.work_root, job_id) as work:
            try:
                result = self.tuner(spec, work, self.job_timeout_s, on_event, cancel=cancel)
                failure = None
            except TunerCancelled:
                cancel.set()
                result = failure = None
            except TunerFailed as exc:
                result, failure = None, exc
            finally:
                done.set()
                beat.join()
            if lease_lost.is_set():
                log.warning("worker %s: lease of job %d was lost; its result is dropped", self.name, job_id)
                metrics.observe_job("lost", time.monotonic() - started)
                return
            if not cancel.is_set():  # a last look: a cancel may have come after the heartbeat's
                with self.sessions.begin() as session:
                    if jobs.cancel_requested(session, job_id):
                        cancel.set()
            if cancel.is_set():
                log.info("worker %s: job %d cancelled; tuner stopped, nothing recorded", self.name, job_id)
                with self.sessions.begin() as session:
                    jobs.finish_cancelled(session, job_id, self.name, log_tail=progress.get("log_tail"))
                metrics.observe_job("cancelled", time.monotonic() - started)
                return
            store = SqlTuningStore(self.sessions, trusted_keys=self.trusted_keys)
            try:
                if failure is not None:
                    record = failure.run_record(spec, RunTrigger.HTTP, self.name)
                    tail = "\n".join([progress.get("log_tail") or "", failure.log_tail]).strip()
                    end = JobEnd(store, job_id, self.name, error=failure.message, log_tail=tail)
                    end.record_run(record) if record is not None else end.without_run()
                    metrics.observe_job("failed", time.monotonic() - started)
                    return
                end = JobEnd(store, job_id, self.name, log_tail=progress.get("log_tail"))
                run = result.record(end, spec, RunTrigger.HTTP, self.name, self.signing_key)
            except LeaseLost as exc:
                log.warning("worker %s: %s; its result is dropped", self.name, exc)
                metrics.observe_job("lost", time.monotonic() - started)
                return
            metrics.observe_job("succeeded", time.monotonic() - started)
            if spec.warmup == "vllm" and self.verify is not None:
                self._verify(store, run.id, spec, work / "verification")

    def _verify(self, store: SqlTuningStore, run_id: int, spec: TuneSpec, scratch: Path) -> None:
        """The recorded vLLM warmup's verification boot, stored with its run. Never raises: a
        boot that failed is the verification's finding, a verifier that failed is logged."""
        from tunecache.service.tuner.verification import shown

        try:
            verification = self.verify(spec, scratch)
            store.record_verification(run_id, verification)
            log.info("worker %s: run %d: %s", self.name, run_id, shown(verification))
        except Exception as exc:
            log.warning("worker %s: run %d not verified: %s: %s", self.name, run_id, type(exc).__name__, exc)
