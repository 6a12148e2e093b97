"""What the service builds from its settings (:class:`~tunecache.service.settings.Settings`,
which only holds values): the trusted keys, the retention policy, the job worker with its
verification boot, and the report intake's auto-tuning of engine variants.

:func:`tunecache.service.app.create_app` assembles a server process from these; the
commands (``tunecache serve``'s checks, ``prune``, ``tune --database``) build the parts they
need with the same functions.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import logging
import os
import socket
from collections.abc import Callable
from typing import IO, Any

from sqlalchemy.orm import Session, sessionmaker

from tunecache.contract import WorkerStatus
from tunecache.service.retention import RetentionPolicy
from tunecache.service.settings import Settings, variable_name

log = logging.getLogger("tunecache")


def server_trusted_keys(settings: Settings) -> dict | None:
    """The service's trusted keys (``TUNECACHE_TRUSTED_KEYS``, read by
    :func:`tunecache.signing.load_trusted_keys`), or ``None`` when unset.

    Raises:
        tunecache.signing.SigningError: the setting names no usable keys (one line).
    """
    if not settings.trusted_keys:
        return None
    from tunecache.signing import load_trusted_keys

    return load_trusted_keys(settings.trusted_keys)


def retention_policy(settings: Settings) -> RetentionPolicy:
    """What the retention pass keeps (``TUNECACHE_RUN_RETENTION``,
    ``TUNECACHE_RETENTION_GRACE_SECONDS``, ``TUNECACHE_MIRROR_MAX_BYTES``)."""
    return RetentionPolicy(keep=settings.run_retention, grace=dt.timedelta(seconds=settings.retention_grace_seconds),
                           mirror_max_bytes=settings.mirror_max_bytes)


def auto_tune_variants(settings: Settings) -> Callable[[Session, list[dict[str, Any]]], list[int]] | None:
    """What the report intake does after each batch when ``TUNECACHE_AUTO_TUNE_VARIANTS`` is on
    (:func:`tunecache.service.variant_autotune.queue_wanted_variants` with the
    ``TUNECACHE_AUTO_TUNE_*`` settings); ``None`` when it is off."""
    if not settings.auto_tune_variants:
        return None
    from tunecache.contract import Scope
    from tunecache.service.variant_autotune import AutoTunePolicy, queue_wanted_variants

    policy = AutoTunePolicy(min_tokens=settings.auto_tune_variants, hours=settings.auto_tune_variant_hours,
                            token_scope=Scope(settings.auto_tune_token_scope),
                            jobs_per_key_hour=settings.auto_tune_jobs_per_key,
                            jobs_per_hour=settings.auto_tune_jobs_per_hour, jobs_queued=settings.auto_tune_jobs_queued)
    return lambda session, rows: queue_wanted_variants(session, rows, policy)


def worker_lock(settings: Settings) -> IO | None:
    """An exclusive lock on ``<data dir>/worker.lock`` (``fcntl.flock``) held for this
    process's life, or ``None`` when another process of the node holds it (one job worker per
    node: one tuning at a time on its GPU, however many server processes run)."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    handle = open(settings.data_dir / "worker.lock", "a")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


def start_worker(settings: Settings, sessions: sessionmaker[Session], trusted_keys: dict | None,
                 lock: IO | None) -> tuple[Any, WorkerStatus]:
    """Start the GPU job worker (:class:`tunecache.service.worker.JobWorker`) as
    ``settings.job_worker`` says, when this process holds the node's ``lock``
    (:func:`worker_lock`). Returns it (``None``: not started) and its status for
    ``/v1/health``, which says why not.

    Raises:
        RuntimeError: ``job_worker == "on"`` and this node has no usable GPU.
        SigningError (:mod:`tunecache.signing`): ``TUNECACHE_SIGNING_KEY`` is not a usable key.
    """
    from tunecache.service.worker import JobWorker, detect_gpu
    from tunecache.signing import load_signing_key

    if settings.job_worker == "off":
        return None, WorkerStatus(enabled=False, reason=f"disabled ({variable_name('job_worker')}=off)")
    if lock is None:
        # the process holding the lock runs the worker, or found no GPU: only it knows which
        return None, WorkerStatus(enabled=False, reason="another process of this node holds the job worker's lock (it "
                                                        "runs the worker, or found no GPU; its /v1/health says which)")
    gpu, reason = detect_gpu()
    if gpu is None:
        if settings.job_worker == "on":
            raise RuntimeError(f"{variable_name('job_worker')}=on but this node cannot tune: {reason}")
        log.warning("no GPU job worker on this node (%s); serving lookups only", reason)
        return None, WorkerStatus(enabled=False, reason=f"no GPU: {reason}")
    worker = JobWorker(
        sessions,
        gpu,
        f"{socket.gethostname()}:{os.getpid()}",
        lease_s=settings.lease_seconds,
        job_timeout_s=settings.job_timeout_seconds,
        max_attempts=settings.job_max_attempts,
        poll_s=settings.worker_poll_seconds,
        work_root=settings.data_dir / "work",
        model_config_dir=settings.model_config_dir,
        signing_key=load_signing_key(settings.signing_key) if settings.signing_key else None,
        trusted_keys=trusted_keys,
        verify=verifier(settings),
    )
    (settings.data_dir / "work").mkdir(parents=True, exist_ok=True)
    worker.start()
    return worker, WorkerStatus(enabled=True, gpu_name=gpu.gpu_name, arch=gpu.arch, name=worker.name)


def verifier(settings: Settings):
    """The job worker's verification boot of a recorded vLLM warmup: against the service's own
    URL (``TUNECACHE_VERIFY_URL``), trusting the node's own signing key; ``None`` when it is
    ``off`` or unknown."""
    url = settings.verify_url
    if not url or url == "off":
        return None
    from tunecache.service.tuner.verification import verify_run
    from tunecache.signing import format_public_key, load_signing_key

    trusted = (format_public_key(load_signing_key(settings.signing_key).public_key())
               if settings.signing_key else None)
    return lambda spec, scratch: verify_run(spec, url, scratch, settings.job_timeout_seconds, trusted_keys=trusted)
