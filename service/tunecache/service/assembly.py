"""What the service builds from its settings (:class:`~tunecache.service.settings.Settings`,
which only holds values): a server process's whole state (:func:`build_state`), and its
parts: the trusted keys, the retention policy, the job worker with its verification boot,
and the report intake's auto-tuning of engine variants.

:func:`tunecache.service.app.create_app` runs :func:`build_state` for as long as its app
serves; the commands (``tunecache serve``'s checks, ``prune``, ``tune --database``) build the
parts they need with the same functions.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import gc
import logging
import os
import socket
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import IO, Any

import anyio
import anyio.to_thread
from cachetools import TTLCache
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from tunecache.contract import WorkerStatus
from tunecache.service import artifact_store, db, metrics, run_diff
from tunecache.service.artifact_files import ArtifactFiles
from tunecache.service.limits import RateLimit
from tunecache.service.lookup_cache import GenerationConnection, GenerationReader, LookupCache
from tunecache.service.report_bounds import ReportFilter, SourceGate
from tunecache.service.report_intake import ReportIntake
from tunecache.service.report_retention import Pruner
from tunecache.service.retention import Maintenance, RetentionPolicy
from tunecache.service.settings import Settings, variable_name
from tunecache.service.single_flight import SingleFlight
from tunecache.service.state import ServiceState

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


@asynccontextmanager
async def build_state(settings: Settings, engine: Engine | None = None) -> AsyncIterator[ServiceState]:
    """A server process's :class:`~tunecache.service.state.ServiceState`, built from
    ``settings`` on ``engine`` (one made from the settings, and disposed of after, when
    ``None``), and its background work (the report intake, the maintenance pass, the job worker
    per ``settings.job_worker``) stopped when the context ends.

    Raises:
        tunecache.service.db.SchemaOutOfDate: the database's schema is not at the head revision.
        RuntimeError, SigningError: as :func:`start_worker`.
    """
    own_engine = engine is None
    the_engine = engine or db.engine_for(settings)
    # Sync routes run on this many threads, each with a database connection of its own.
    anyio.to_thread.current_default_thread_limiter().total_tokens = settings.threads
    trusted_keys = server_trusted_keys(settings)
    worker = lock = generation_connection = report_intake = maintenance = None
    try:
        db.check_schema(the_engine)
        sessions = db.session_factory(the_engine)
        # every session carries the artifact stores (tunecache.service.artifact_store.stores_of)
        artifact_stores = artifact_store.stores_for_url(settings.artifact_store)
        sessions.configure(info={"artifact_stores": artifact_stores})
        report_intake = ReportIntake(
            sessions, settings.report_flush_seconds, settings.report_intake_max,
            ReportFilter(settings.report_boots_per_key, settings.report_new_keys),
            after_batch=auto_tune_variants(settings))
        report_intake.start()

        generation_connection = GenerationConnection(the_engine)
        # its one read at a time runs in a thread of its own, on a connection opened now (not
        # taken from the pool later, when the routes' threads may hold every connection)
        generation_reader = GenerationReader(generation_connection.read, limiter=anyio.CapacityLimiter(1))
        await anyio.to_thread.run_sync(generation_connection.read)
        gc.freeze()  # what startup allocated is never collected: shorter GC pauses under load
        lock = None if settings.job_worker == "off" else worker_lock(settings)
        worker, worker_status = start_worker(settings, sessions, trusted_keys, lock)
        metrics.set_job_worker(worker is not None)
        artifact_files = ArtifactFiles(settings.artifact_cache_dir)
        # runs past TUNECACHE_RUN_RETENTION, unreferenced blobs, the mirror past its cap: in a thread, never a request
        maintenance = Maintenance(sessions, artifact_files, retention_policy(settings),
                                  settings.retention_interval_seconds, lock_path=settings.data_dir / "retention.lock")
        maintenance.start()
        yield ServiceState(
            settings=settings,
            engine=the_engine,
            sessions=sessions,
            artifact_stores=artifact_stores,
            generation_reader=generation_reader,
            lookup_cache=LookupCache(settings.lookup_cache_entries),
            token_cache=TTLCache(maxsize=4096, ttl=settings.token_cache_seconds),
            trusted_keys=trusted_keys,
            artifact_files=artifact_files,
            artifact_mirrors=SingleFlight(),
            # Mirrored artifact files are read in threads of their own, never behind database work.
            file_threads=anyio.CapacityLimiter(settings.file_threads),
            diff_slots=threading.BoundedSemaphore(run_diff.DIFFS_AT_ONCE),
            job_requests=RateLimit(settings.job_request_rate, "tuning-job requests"),
            report_gate=SourceGate(settings.report_source_max),
            report_pruner=Pruner(),
            report_intake=report_intake,
            health_probes=SingleFlight(),
            health_threads=anyio.CapacityLimiter(1),  # the one probe in flight (routes/health.py)
            worker_status=worker_status,
            worker_lock=lock,
            maintenance=maintenance,
        )
    finally:
        if maintenance is not None:
            await anyio.to_thread.run_sync(maintenance.stop)
        if worker is not None:
            worker.stop()
        if report_intake is not None:
            await anyio.to_thread.run_sync(report_intake.stop)
        if generation_connection is not None:
            generation_connection.close()
        if lock is not None:
            lock.close()
        if own_engine:
            the_engine.dispose()
        metrics.process_exiting()
