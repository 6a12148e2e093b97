"""The tuning-job queue, kept in the service's database (no broker).

* :func:`enqueue` is single-flight: a partial unique index allows one queued-or-running
  job per key, so concurrent requests for a key all get the same job.
* :func:`claim` hands the oldest claimable job whose GPU matches the worker's to exactly
  one worker (PostgreSQL ``FOR UPDATE SKIP LOCKED``; SQLite one writer), as a lease.
* A worker renews its lease (:func:`heartbeat`) while the tuner runs; a job whose lease
  expired (its worker died) is claimable again, up to ``max_attempts`` claims.
* :func:`cancel` cancels a queued job at once and marks a running one; its worker sees
  the mark (:func:`cancel_requested`), stops the tuner and records it
  (:func:`finish_cancelled`).
* Job workers announce themselves (:func:`announce_worker`, the ``workers`` table), so
  :func:`list_workers` tells whether any live worker will take a job.

Like :mod:`tunecache.service.repository`, functions take a session whose transaction
the caller owns (the request's transaction, or one ``with sessions.begin()`` per job-worker
step: claim, heartbeat, and the job's end, which :func:`finish` records in the transaction
that records its run) and return the contract's read models; none commits.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Callable
from typing import Any

from sqlalchemy import and_, delete, func, or_, select, update
from sqlalchemy.orm import Session, defer

from tunecache.contract import (
    ACTIVE_JOB_STATUSES,
    JobConflict,
    JobOptionDifference,
    JobStatus,
    TuningJobCreate,
    TuningJobPage,
    TuningJobRead,
    TuningKey,
    WorkerList,
    WorkerRead,
)
from tunecache.service import dialect, repository
from tunecache.service.models import ACTIVE_JOB_CONDITION, TuningJob, TuningKeyRow, Worker, utcnow

#: Characters of tuner output kept on a job for ``GET /v1/tuning-jobs/{id}``.
LOG_TAIL_CHARS = 4000


def _to_read(job: TuningJob) -> TuningJobRead:
    duration = None
    if job.started_at is not None and job.finished_at is not None:
        duration = (job.finished_at - job.started_at).total_seconds()
    return TuningJobRead(
        id=job.id,
        key=repository.key_of(job.key),
        status=job.status,
        stage=job.stage,
        step=job.step,
        total=job.total,
        log_tail=job.log_tail,
        worker=job.worker,
        attempts=job.attempts,
        error=job.error,
        run_id=job.run_id,
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        lease_expires_at=job.lease_expires_at,
        duration_s=duration,
        cancel_requested_at=job.cancel_requested_at,
        cancelled_by=job.cancelled_by,
        warmup=(job.options or {}).get("warmup") or "stages",
        engine_args=(job.options or {}).get("engine_args") or None,
        vllm_version=(job.options or {}).get("vllm_version"),
    )


class JobOptionsConflict(Exception):
    """A job for the key is already queued or running with other options; ``conflict`` is
    the 409 body naming it and each differing option."""

    def __init__(self, conflict: JobConflict):
        super().__init__(conflict.detail)
        self.conflict = conflict


class JobAlreadyFinished(Exception):
    """The job to cancel has already succeeded or failed; ``job`` is it as it is."""

    def __init__(self, job: TuningJobRead):
        what = f"succeeded (run {job.run_id})" if job.status is JobStatus.SUCCEEDED else str(job.status)
        super().__init__(f"job {job.id} already {what}; there is nothing to cancel")
        self.job = job


def config_digest(config: dict[str, Any] | None) -> str | None:
    """``"sha256:<16 hex digits>"`` of a model config's canonical JSON (keys sorted), or
    ``None``: how a 409 names a config without sending it back."""
    if config is None:
        return None
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _option_values(hf_config: dict[str, Any] | None, options: dict[str, Any] | None) -> dict[str, Any]:
    """A job's options as compared for single-flight: the config's digest, and the
    backends and stages as sorted lists (order and repeats do not change a tuning)."""
    options = options or {}

    def as_set(values: list[str] | None) -> list[str] | None:
        return None if values is None else sorted(set(values))

    return {"hf_config": config_digest(hf_config), "gemm_backends": as_set(options.get("gemm_backends")),
            "stages": as_set(options.get("stages")), "warmup": options.get("warmup") or "stages",
            "engine_args": options.get("engine_args") or None, "vllm_version": options.get("vllm_version")}


def _options(request: TuningJobCreate) -> dict[str, Any]:
    """The tuner options a job keeps (``tuning_jobs.options``: :class:`~tunecache.contract.JobOptions`
    as JSON; its worker validates them again, :func:`job_spec_inputs`)."""
    return request.options().model_dump(mode="json")


def _conflict(active: TuningJob, request: TuningJobCreate) -> JobConflict | None:
    """The 409 body when ``request`` asks for other options than the ``active`` job has, else ``None``."""
    had = _option_values(active.hf_config, active.options)
    asked = _option_values(request.hf_config, _options(request))
    differences = [JobOptionDifference(field=f, active=had[f], requested=asked[f]) for f in had if had[f] != asked[f]]
    if not differences:
        return None
    return JobConflict(
        detail=(f"job {active.id} is already {active.status} for this key with other options "
                f"({'; '.join(str(d) for d in differences)}); wait for it, or cancel it "
                f"(DELETE /v1/tuning-jobs/{active.id}) and ask again"),
        job_id=active.id,
        job_status=JobStatus(active.status),
        differences=differences,
    )


def _active_job(session: Session, key_id: int) -> TuningJob | None:
    return session.scalars(
        select(TuningJob).options(defer(TuningJob.hf_config)).where(TuningJob.key_id == key_id, TuningJob.status.in_(ACTIVE_JOB_STATUSES))
    ).first()


def enqueue(session: Session, request: TuningJobCreate, requested_by: str | None = None) -> tuple[TuningJobRead, bool]:
    """Queue a job for the key, or return the one already queued or running when it has
    the same options (single-flight).

    Returns ``(job, created)``. Safe under concurrency without a retry: the insert is
    ``ON CONFLICT DO NOTHING`` on the partial unique index of active jobs, so the loser
    of a race inserts nothing (PostgreSQL waits for the winner's commit) and reads the
    winner's job.

    Raises:
        JobOptionsConflict: the active job of the key has another ``hf_config`` (compared
            as canonical JSON), ``gemm_backends`` or ``stages`` (compared as sets);
            its ``conflict`` names the job and each difference.
    """
    key_row = repository.get_or_create_key(session, request.key)
    values = {
        "key_id": key_row.id,
        "status": JobStatus.QUEUED.value,
        "hf_config": request.hf_config,
        "options": _options(request),
        "requested_by": requested_by,
        "attempts": 0,
        "created_at": utcnow(),
    }
    created_id = dialect.insert_or_ignore(
        session, TuningJob.__table__, values, conflict=["key_id"], index_where=ACTIVE_JOB_CONDITION, returning="id"
    )
    job = get_job(session, created_id) if created_id is not None else None
    if job is None:
        existing = _active_job(session, key_row.id)
        if existing is None:  # the active job finished between the insert and this read
            raise RuntimeError(f"job for key {key_row.id} neither created nor found; retry")
        conflict = _conflict(existing, request)
        if conflict is not None:
            raise JobOptionsConflict(conflict)
        return _to_read(existing), False
    return job, True


def _claimable(now: dt.datetime, max_attempts: int):
    expired = and_(TuningJob.status == JobStatus.RUNNING.value, TuningJob.lease_expires_at < now,
                   TuningJob.attempts < max_attempts, TuningJob.cancel_requested_at.is_(None))
    return or_(TuningJob.status == JobStatus.QUEUED.value, expired)


def settle_cancelled(session: Session) -> int:
    """Record ``cancelled`` the running jobs that were asked to stop and whose lease
    expired (their worker died before it could). Returns how many."""
    now = utcnow()
    return session.execute(
        update(TuningJob)
        .where(TuningJob.status == JobStatus.RUNNING.value, TuningJob.lease_expires_at < now,
               TuningJob.cancel_requested_at.is_not(None))
        .values(status=JobStatus.CANCELLED.value, finished_at=now, lease_expires_at=None)
    ).rowcount


def fail_exhausted(session: Session, max_attempts: int) -> int:
    """Fail running jobs whose lease expired after ``max_attempts`` claims. Returns how many."""
    now = utcnow()
    result = session.execute(
        update(TuningJob)
        .where(TuningJob.status == JobStatus.RUNNING.value, TuningJob.lease_expires_at < now, TuningJob.attempts >= max_attempts)
        .values(status=JobStatus.FAILED.value, finished_at=now, error=f"worker lost the job {max_attempts} times (lease expired)")
    )
    return result.rowcount


def release_jobs_of_dead_workers(session: Session, host: str, alive: Callable[[int], bool]) -> list[int]:
    """Make claimable at once the running jobs whose worker ran on ``host`` in a process that
    is gone (worker names ``<host>:<pid>``; ``alive(pid)`` says whether that process still
    exists): their lease is ended now rather than at its end, and the worker is recorded
    stopped. A service killed with ``kill -9`` and started again thus takes its job back
    within seconds, not at the end of the lease. Returns the jobs' ids."""
    prefix = f"{host}:"
    dead: dict[str, list[int]] = {}
    for job_id, worker in session.execute(
            select(TuningJob.id, TuningJob.worker).where(TuningJob.status == JobStatus.RUNNING.value,
                                                         TuningJob.worker.startswith(prefix, autoescape=True))):
        pid = worker[len(prefix):]
        if pid.isdigit() and not alive(int(pid)):
            dead.setdefault(worker, []).append(job_id)
    released = [job_id for ids in dead.values() for job_id in ids]
    if released:
        session.execute(update(TuningJob).where(TuningJob.id.in_(released))
                        .values(lease_expires_at=utcnow() - dt.timedelta(seconds=1)))
        session.execute(update(Worker).where(Worker.name.in_(list(dead)), Worker.stopped_at.is_(None))
                        .values(stopped_at=utcnow()))
    return released


def claim(
    session: Session, worker: str, gpu_name: str, arch: str, lease_s: float, max_attempts: int = 3,
    vllm_version: str | None = None,
) -> TuningJobRead | None:
    """Claim the oldest job this worker's GPU (and, for a job that names one, its image's vLLM,
    ``vllm_version``) can serve; ``None`` if there is none.

    Call it in a transaction of its own (the claim holds the job's row lock on PostgreSQL
    until that commits).

    Claimable: queued, or running with an expired lease and fewer than ``max_attempts``
    claims so far (its worker died; the job is requeued). The claim sets ``status =
    'running'``, the worker, a lease of ``lease_s`` seconds and ``attempts + 1``.
    """
    settle_cancelled(session)
    fail_exhausted(session, max_attempts)
    now = utcnow()
    candidate = dialect.lock_for_claim(
        session,
        select(TuningJob.id)
        .join(TuningKeyRow, TuningKeyRow.id == TuningJob.key_id)
        .where(_claimable(now, max_attempts), TuningKeyRow.gpu_name == gpu_name, TuningKeyRow.arch == arch,
               or_(TuningJob.options["vllm_version"].as_string().is_(None),
                   TuningJob.options["vllm_version"].as_string() == (vllm_version or "")))
        .order_by(TuningJob.created_at, TuningJob.id)
        .limit(1),
    )
    job_id = session.scalar(candidate)
    if job_id is None:
        return None
    claimed = session.execute(
        update(TuningJob)
        .where(TuningJob.id == job_id, _claimable(now, max_attempts))
        .values(
            status=JobStatus.RUNNING.value,
            worker=worker,
            lease_expires_at=now + dt.timedelta(seconds=lease_s),
            attempts=TuningJob.attempts + 1,
            started_at=now,
            stage=None,
            step=None,
            total=None,
            error=None,
        )
    ).rowcount
    if claimed != 1:  # lost a race (SQLite): someone else claimed it first
        return None
    return get_job(session, job_id)


def _held_by(job_id: int, worker: str) -> tuple:
    """Conditions of a job that ``worker`` still holds (running, claimed by it)."""
    return TuningJob.id == job_id, TuningJob.worker == worker, TuningJob.status == JobStatus.RUNNING.value


def heartbeat(
    session: Session, job_id: int, worker: str, lease_s: float, progress: dict[str, Any] | None = None
) -> bool:
    """Renew the lease and store progress (``stage``, ``step``, ``total``, ``log_tail``).

    Returns False when the worker no longer holds the job (its lease expired and another
    worker took it): the caller must stop working on it.
    """
    values: dict[str, Any] = {"lease_expires_at": utcnow() + dt.timedelta(seconds=lease_s)}
    for field in ("stage", "step", "total"):
        if progress and field in progress:
            values[field] = progress[field]
    if progress and progress.get("log_tail") is not None:
        values["log_tail"] = progress["log_tail"][-LOG_TAIL_CHARS:]
    held = session.execute(
        update(TuningJob).where(*_held_by(job_id, worker)).values(**values)
    ).rowcount
    return held == 1


def finish(
    session: Session, job_id: int, worker: str, *, run_id: int | None = None, error: str | None = None, log_tail: str | None = None
) -> bool:
    """Mark the job succeeded (``run_id``) or failed (``error``) if ``worker`` still holds it.
    Returns False when it no longer does."""
    values: dict[str, Any] = {
        "status": (JobStatus.FAILED if error is not None else JobStatus.SUCCEEDED).value,
        "finished_at": utcnow(),
        "run_id": run_id,
        "error": error,
        "lease_expires_at": None,
    }
    if log_tail is not None:
        values["log_tail"] = log_tail[-LOG_TAIL_CHARS:]
    done = session.execute(
        update(TuningJob).where(*_held_by(job_id, worker)).values(**values)
    ).rowcount
    return done == 1


def cancel(session: Session, job_id: int, cancelled_by: str | None = None) -> tuple[TuningJobRead, bool] | None:
    """Cancel a job: a queued one (or a running one whose lease expired: its worker is
    gone) becomes ``cancelled`` at once; a running one is marked (``cancel_requested_at``)
    and its worker stops the tuner and records it ``cancelled`` (:func:`finish_cancelled`).

    Returns ``(job, changed)``, or ``None`` when there is no such job. Cancelling a job
    that is already cancelled, or marked, changes nothing (``changed`` is False). Each
    step is a conditional ``UPDATE``, so a worker claiming the job at the same moment
    either finds it cancelled or is the one that gets the mark.

    Raises:
        JobAlreadyFinished: the job succeeded or failed.
    """
    now = utcnow()
    stop = {"status": JobStatus.CANCELLED.value, "finished_at": now, "lease_expires_at": None,
            "cancel_requested_at": now, "cancelled_by": cancelled_by}
    running = TuningJob.status == JobStatus.RUNNING.value
    for condition, values in (
        (TuningJob.status == JobStatus.QUEUED.value, stop),
        (and_(running, TuningJob.lease_expires_at < now), stop),
        (and_(running, TuningJob.cancel_requested_at.is_(None)), {"cancel_requested_at": now, "cancelled_by": cancelled_by}),
    ):
        if session.execute(update(TuningJob).where(TuningJob.id == job_id, condition).values(**values)).rowcount == 1:
            return get_job(session, job_id), True
    job = get_job(session, job_id)
    if job is None:
        return None
    if job.status in (JobStatus.SUCCEEDED, JobStatus.FAILED):
        raise JobAlreadyFinished(job)
    return job, False


def cancel_requested(session: Session, job_id: int) -> bool:
    """Whether the job has been asked to stop (a worker polls this while its tuner runs)."""
    return session.scalar(select(TuningJob.cancel_requested_at).where(TuningJob.id == job_id)) is not None


def finish_cancelled(session: Session, job_id: int, worker: str, log_tail: str | None = None) -> bool:
    """Record a running job ``cancelled`` once ``worker`` has stopped its tuner (no run is
    recorded). Returns False when ``worker`` no longer holds the job."""
    values: dict[str, Any] = {"status": JobStatus.CANCELLED.value, "finished_at": utcnow(), "lease_expires_at": None}
    if log_tail is not None:
        values["log_tail"] = log_tail[-LOG_TAIL_CHARS:]
    return session.execute(update(TuningJob).where(*_held_by(job_id, worker)).values(**values)).rowcount == 1


#: A worker is live while its last heartbeat is at most this many seconds old (or three of
#: its heartbeats, if it beats more slowly).
WORKER_LIVE_WINDOW_S = 60.0
#: Workers not seen for this long are left out of :func:`list_workers`; a week: deleted.
WORKER_LISTED_S = 24 * 3600.0
WORKER_KEPT_S = 7 * 24 * 3600.0


def announce_worker(
    session: Session, name: str, gpu_name: str, arch: str, *, model_config_dir: bool, heartbeat_s: float,
    started_at: dt.datetime, vllm_version: str | None = None,
) -> None:
    """Upsert ``name``'s heartbeat (``last_seen`` = now, ``stopped_at`` cleared) and forget
    workers not seen for a week. Called by the worker every ``heartbeat_s`` seconds."""
    now = utcnow()
    values = {"name": name, "gpu_name": gpu_name, "arch": arch, "model_config_dir": model_config_dir,
              "heartbeat_s": heartbeat_s, "started_at": started_at, "last_seen": now, "stopped_at": None,
              "vllm_version": vllm_version}
    dialect.upsert_if_newer(session, Worker.__table__, values, conflict=["name"], newer="last_seen")
    session.execute(delete(Worker).where(Worker.last_seen < now - dt.timedelta(seconds=WORKER_KEPT_S)))


def worker_stopped(session: Session, name: str) -> None:
    """Record that worker ``name`` stopped (a graceful shutdown): it is no longer live."""
    session.execute(update(Worker).where(Worker.name == name).values(stopped_at=utcnow()))


def list_workers(session: Session, gpu_name: str | None = None, arch: str | None = None) -> WorkerList:
    """The workers seen in the last day (of ``gpu_name`` and ``arch`` when given), latest
    heartbeat first, each with whether it is live (:data:`WORKER_LIVE_WINDOW_S`)."""
    now = utcnow()
    query = select(Worker).where(Worker.last_seen >= now - dt.timedelta(seconds=WORKER_LISTED_S))
    if gpu_name is not None:
        query = query.where(Worker.gpu_name == gpu_name)
    if arch is not None:
        query = query.where(Worker.arch == arch)
    items = []
    for row in session.scalars(query.order_by(Worker.last_seen.desc(), Worker.name)):
        ago = max(0.0, (now - row.last_seen).total_seconds())
        live = row.stopped_at is None and ago <= max(WORKER_LIVE_WINDOW_S, 3 * row.heartbeat_s)
        items.append(WorkerRead(name=row.name, gpu_name=row.gpu_name, arch=row.arch, model_config_dir=row.model_config_dir,
                                vllm_version=row.vllm_version,
                                heartbeat_s=row.heartbeat_s, started_at=row.started_at, last_seen=row.last_seen,
                                stopped_at=row.stopped_at, seen_s_ago=round(ago, 3), live=live))
    return WorkerList(live_window_s=WORKER_LIVE_WINDOW_S, items=items)


def get_job(session: Session, job_id: int) -> TuningJobRead | None:
    """One job, or ``None`` (its model config is not loaded)."""
    job = session.get(TuningJob, job_id, populate_existing=True, options=[defer(TuningJob.hf_config)])
    return None if job is None else _to_read(job)


def job_spec_inputs(session: Session, job_id: int) -> tuple[TuningKey, dict[str, Any] | None, dict[str, Any]]:
    """What a worker needs to build the tuner spec of a job: key, HF config, and the tuner
    options as stored (the worker validates them, :class:`~tunecache.contract.JobOptions`:
    a row that the contract refuses now fails its job, naming why, and runs nothing)."""
    job = session.get(TuningJob, job_id)
    if job is None:
        raise LookupError(f"no tuning job {job_id}")
    return repository.key_of(job.key), job.hf_config, job.options or {}


def list_jobs(session: Session, *, status: JobStatus | None = None, limit: int = 50, offset: int = 0) -> TuningJobPage:
    """Jobs, newest first (their model configs are not loaded)."""
    query = select(TuningJob).options(defer(TuningJob.hf_config))
    if status is not None:
        query = query.where(TuningJob.status == status)
    total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    jobs = session.scalars(query.order_by(TuningJob.id.desc()).limit(limit).offset(offset)).unique()
    return TuningJobPage(items=[_to_read(j) for j in jobs], total=total, limit=limit, offset=offset)
