"""The tuning-job queue, kept in the service's database (no broker).

* :func:`enqueue` is single-flight: a partial unique index allows one queued-or-running
  job per key, so concurrent requests for a key all get the same job.
* :func:`claim` hands the oldest claimable job whose GPU matches the worker's to exactly
  one worker (PostgreSQL ``FOR UPDATE SKIP LOCKED``; SQLite one writer), as a lease.
* A worker renews its lease (:func:`heartbeat`) while the tuner runs; a job whose lease
  expired (its worker died) is claimable again, up to ``max_attempts`` claims.

Like :mod:`tunecache.service.repository`, functions take a session whose transaction
the caller owns (the request's unit of work, or one ``with sessions.begin()`` per worker
step: claim, heartbeat, finish) and return the contract's read models; none commits.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.orm import Session, defer

from tunecache.contract import ACTIVE_JOB_STATUSES, JobStatus, TuningJobCreate, TuningJobPage, TuningJobRead, TuningKey
from tunecache.service import dialect, repository
from tunecache.service.models import ACTIVE_JOB_CONDITION, TuningJob, TuningKeyRow, utcnow

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
    )


def _active_job(session: Session, key_id: int) -> TuningJob | None:
    return session.scalars(
        select(TuningJob).options(defer(TuningJob.hf_config)).where(TuningJob.key_id == key_id, TuningJob.status.in_(ACTIVE_JOB_STATUSES))
    ).first()


def enqueue(session: Session, request: TuningJobCreate, requested_by: str | None = None) -> tuple[TuningJobRead, bool]:
    """Queue a job for the key, or return the one already queued or running.

    Returns ``(job, created)``. Safe under concurrency without a retry: the insert is
    ``ON CONFLICT DO NOTHING`` on the partial unique index of active jobs, so the loser
    of a race inserts nothing (PostgreSQL waits for the winner's commit) and reads the
    winner's job.
    """
    key_row = repository.get_or_create_key(session, request.key)
    values = {
        "key_id": key_row.id,
        "status": JobStatus.QUEUED.value,
        "hf_config": request.hf_config,
        "options": {"gemm_backends": request.gemm_backends, "stages": request.stages},
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
        return _to_read(existing), False
    return job, True


def _claimable(now: dt.datetime, max_attempts: int):
    expired = and_(TuningJob.status == JobStatus.RUNNING.value, TuningJob.lease_expires_at < now, TuningJob.attempts < max_attempts)
    return or_(TuningJob.status == JobStatus.QUEUED.value, expired)


def fail_exhausted(session: Session, max_attempts: int) -> int:
    """Fail running jobs whose lease expired after ``max_attempts`` claims. Returns how many."""
    now = utcnow()
    result = session.execute(
        update(TuningJob)
        .where(TuningJob.status == JobStatus.RUNNING.value, TuningJob.lease_expires_at < now, TuningJob.attempts >= max_attempts)
        .values(status=JobStatus.FAILED.value, finished_at=now, error=f"worker lost the job {max_attempts} times (lease expired)")
    )
    return result.rowcount


def claim(
    session: Session, worker: str, gpu_name: str, arch: str, lease_s: float, max_attempts: int = 3
) -> TuningJobRead | None:
    """Claim the oldest job this worker's GPU can serve; ``None`` if there is none.

    Call it in a transaction of its own (the claim holds the job's row lock on PostgreSQL
    until that commits).

    Claimable: queued, or running with an expired lease and fewer than ``max_attempts``
    claims so far (its worker died; the job is requeued). The claim sets ``status =
    'running'``, the worker, a lease of ``lease_s`` seconds and ``attempts + 1``.
    """
    fail_exhausted(session, max_attempts)
    now = utcnow()
    candidate = dialect.lock_for_claim(
        session,
        select(TuningJob.id)
        .join(TuningKeyRow, TuningKeyRow.id == TuningJob.key_id)
        .where(_claimable(now, max_attempts), TuningKeyRow.gpu_name == gpu_name, TuningKeyRow.arch == arch)
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


def get_job(session: Session, job_id: int) -> TuningJobRead | None:
    """One job, or ``None`` (its model config is not loaded)."""
    job = session.get(TuningJob, job_id, populate_existing=True, options=[defer(TuningJob.hf_config)])
    return None if job is None else _to_read(job)


def job_spec_inputs(session: Session, job_id: int) -> tuple[TuningKey, dict[str, Any] | None, dict[str, Any]]:
    """What a worker needs to build the tuner spec of a job: key, HF config, tuner options."""
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
