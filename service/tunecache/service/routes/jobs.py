"""``/v1/tuning-jobs``: HTTP-triggered (re-)tuning, single-flight per key."""

from __future__ import annotations

import math
import time
from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Query, Request

from tunecache.contract import MAX_ID, ErrorBody, JobStatus, TuningJobCreate, TuningJobPage, TuningJobRead
from tunecache.service import jobs
from tunecache.service.deps import SessionDep
from tunecache.service.policy import AdminCaller, ReadCaller

router = APIRouter(prefix="/tuning-jobs", tags=["tuning-jobs"])


@router.post("", response_model=TuningJobRead, status_code=202,
             responses={429: {"model": ErrorBody, "description": "Too many job requests with this token (Retry-After)"}})
def create_job(body: TuningJobCreate, session: SessionDep, request: Request, caller: AdminCaller) -> TuningJobRead:
    """Queue a tuning of ``key`` (its ``gpu_name``/``arch`` choose which GPU nodes may take it).
    Needs an ``admin`` token.

    Single-flight: when a job for the same key is already queued or running, that job is
    returned (202 either way; compare ids). Poll ``GET /v1/tuning-jobs/{id}``. A
    succeeded job's ``run_id`` is the new current tuning; a failed job leaves the previous
    tuning current. 429 with ``Retry-After`` past ``TUNECACHE_JOB_REQUEST_RATE`` requests
    with one token (each may carry a 1 MiB model config).
    """
    limiter, rate = request.app.state.job_rate_limiter, request.app.state.job_rate
    if not limiter.hit(rate, caller.name):
        reset = limiter.get_window_stats(rate, caller.name).reset_time
        wait = max(1, math.ceil(reset - time.time()))
        raise HTTPException(429, detail=f"too many tuning-job requests with token {caller.name!r}: at most "
                                        f"{request.app.state.settings.job_request_rate}", headers={"Retry-After": str(wait)})
    job, created = jobs.enqueue(session, body, requested_by=caller.name)
    request.state.audit_detail = f"job {job.id} for {job.key.model} ({'queued' if created else 'already queued'})"
    return job


@router.get("/{job_id:int}", response_model=TuningJobRead, responses={404: {"model": ErrorBody, "description": "no such job"}})
def get_job(job_id: Annotated[int, Path(ge=1, le=MAX_ID)], session: SessionDep, _caller: ReadCaller) -> TuningJobRead:
    """Status, stage, step/total, log tail and timings of a job. 404 if there is none."""
    job = jobs.get_job(session, job_id)
    if job is None:
        raise HTTPException(404, detail=f"no tuning job {job_id}")
    return job


@router.get("", response_model=TuningJobPage)
def list_jobs(
    session: SessionDep,
    _caller: ReadCaller,
    status: JobStatus | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_ID)] = 0,
) -> TuningJobPage:
    """Jobs, newest first."""
    return jobs.list_jobs(session, status=status, limit=limit, offset=offset)
