"""The job worker: claims tuning jobs for this node's GPU and runs them, one at a time.

It runs as a thread of the service process on a GPU node: the claim loop. Each job it claims
is run to its end by a :class:`tunecache.service.job_run.JobRun` (the tuner in a child
process with a timeout, so the API keeps serving whatever the tuner does; the job's lease and
progress; a cancellation; the run and the job's end recorded in one transaction). The worker
itself beats too (the ``workers`` table), so that clients can tell whether any live worker
will take a job for its GPU. Each step (claim, heartbeat, the job's end) is one transaction
of its own.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy.orm import Session, sessionmaker

from tunecache.service import jobs
from tunecache.service.job_run import JobRun, RunSettings, Tuner, Verifier
from tunecache.service.tuner.process import run_tuner
from tunecache.service.work_dirs import process_alive, remove_abandoned_work_dirs

log = logging.getLogger("tunecache.worker")

#: Seconds between a worker's heartbeats (``workers.last_seen``), by default.
WORKER_HEARTBEAT_S = 15.0


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


def image_vllm_version() -> str | None:
    """The vLLM installed where this worker runs (its tuner's, ``importlib.metadata``; vLLM is
    not imported), or ``None``."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vllm")
    except PackageNotFoundError:
        return None


class JobWorker:
    """The claim loop of one GPU: claims its tuning jobs, one at a time, and runs each to its end
    (:class:`tunecache.service.job_run.JobRun`).

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
        trusted_keys: Mapping[str, Any] | None = None,
        tuner: Tuner = run_tuner,
        heartbeat_s: float = WORKER_HEARTBEAT_S,
        verify: Verifier | None = None,
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
        JobRun(self.run_settings(), job.id).run(key, hf_config, options)
        return True

    def run_settings(self) -> RunSettings:
        """What the runs of this worker's jobs share (its arguments as they are now)."""
        return RunSettings(sessions=self.sessions, worker=self.name, lease_s=self.lease_s,
                           job_timeout_s=self.job_timeout_s, tuner=self.tuner, work_root=self.work_root,
                           model_config_dir=self.model_config_dir, signing_key=self.signing_key,
                           trusted_keys=self.trusted_keys, verify=self.verify)
