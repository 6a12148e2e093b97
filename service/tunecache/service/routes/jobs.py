"""``/v1/tuning-jobs``: HTTP-triggered (re-)tuning, single-flight per key, cancellable;
``/v1/workers``: the GPU workers that take the jobs, from their heartbeats."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Query, Request, Response

from tunecache.contract import (
    MAX_ID,
    ErrorBody,
    JobConflict,
    JobStatus,
    TuningJobCreate,
    TuningJobPage,
    TuningJobRead,
    WorkerList,
)
from tunecache.service import jobs, redaction
from tunecache.service.deps import SessionDep, SettingsDep
from tunecache.service.policy import AdminCaller, ReadCaller
from tunecache.service.state import state_of

router = APIRouter(prefix="/tuning-jobs", tags=["tuning-jobs"])


@router.post("", response_model=TuningJobRead, status_code=202,
             responses={409: {"model": JobConflict, "description": "A job for the key is already queued or running "
                                                                   "with other options (named, with the job's id)"},
                        429: {"model": ErrorBody, "description": "Too many job requests with this token (Retry-After)"}})
def create_job(body: TuningJobCreate, session: SessionDep, request: Request, caller: AdminCaller) -> TuningJobRead:
    """Queue a tuning of ``key`` (its ``gpu_name``/``arch`` choose which GPU nodes may take it).
    Needs an ``admin`` token.

    Single-flight: when a job for the same key is already queued or running with the same
    options (``hf_config``, ``gemm_backends``, ``stages``), that job is returned (202
    either way; compare ids). With other options the answer is 409 with a
    :class:`~tunecache.contract.JobConflict` body (``job_id``, ``job_status`` and each
    differing option; configs shown as digests): wait for that job, or cancel it
    (``DELETE /v1/tuning-jobs/{id}``) and ask again. Poll ``GET /v1/tuning-jobs/{id}``. A
    succeeded job's ``run_id`` is the new current tuning; a failed or cancelled job leaves
    the previous tuning current. 429 with ``Retry-After`` past ``TUNECACHE_JOB_REQUEST_RATE``
    requests with one token (each may carry a 1 MiB model config).
    """
    state_of(request.app).job_requests.check(caller.name)
    # a JobOptionsConflict propagates: 409 with its body (tunecache.service.errors), nothing written or audited
    job, created = jobs.enqueue(session, body, requested_by=caller.name)
    request.state.audit_detail = f"job {job.id} for {job.key.model} ({'queued' if created else 'already queued'})"
    return job


@router.get("/{job_id:int}", response_model=TuningJobRead, responses={404: {"model": ErrorBody, "description": "no such job"}})
def get_job(job_id: Annotated[int, Path(ge=1, le=MAX_ID)], session: SessionDep, caller: ReadCaller,
            settings: SettingsDep) -> TuningJobRead:
    """Status, stage, step/total, log tail and timings of a job, as
    :func:`~tunecache.service.redaction.job_for_readers` shows it (its worker, who cancelled
    it and its log tail to an admin token only, unless ``TUNECACHE_READS_SHOW_IDENTITIES``).
    404 if there is none."""
    job = jobs.get_job(session, job_id)
    if job is None:
        raise HTTPException(404, detail=f"no tuning job {job_id}")
    return redaction.job_for_readers(job, redaction.shows_identities(caller, settings))


@router.delete("/{job_id:int}", response_model=TuningJobRead,
               responses={202: {"model": TuningJobRead, "description": "the job is running: its worker was asked to "
                                                                        "stop it (it becomes cancelled within seconds)"},
                          404: {"model": ErrorBody, "description": "no such job"},
                          409: {"model": ErrorBody, "description": "the job already succeeded or failed (named)"}})
def cancel_job(job_id: Annotated[int, Path(ge=1, le=MAX_ID)], session: SessionDep, request: Request, response: Response,
               caller: AdminCaller) -> TuningJobRead:
    """Cancel a job. Needs an ``admin`` token; audited.

    * queued (or running on a worker that is gone: its lease expired): 200, the job is
      ``cancelled`` at once;
    * running: 202, the job is marked (``cancel_requested_at``); its worker terminates the
      tuner's child process within seconds and records the job ``cancelled``. No run is
      recorded and the previous tuning stays current;
    * already cancelled, or already marked: the job as it is (200 or 202), nothing changes;
    * succeeded or failed: 409 naming its state; no such job: 404.

    A cancelled job frees its key: the next ``POST /v1/tuning-jobs`` for it queues a new job.
    """
    try:
        outcome = jobs.cancel(session, job_id, cancelled_by=caller.name)
    except jobs.JobAlreadyFinished as exc:
        raise HTTPException(409, detail=str(exc)) from None
    if outcome is None:
        raise HTTPException(404, detail=f"no tuning job {job_id}")
    job, changed = outcome
    if job.status is JobStatus.RUNNING:
        response.status_code = 202
    what = {JobStatus.CANCELLED: "cancelled", JobStatus.RUNNING: "cancellation requested (running)"}[job.status]
    request.state.audit_detail = f"job {job.id} for {job.key.model}: {what}" + ("" if changed else ", already")
    return job


@router.get("", response_model=TuningJobPage)
def list_jobs(
    session: SessionDep,
    caller: ReadCaller,
    settings: SettingsDep,
    status: JobStatus | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_ID)] = 0,
) -> TuningJobPage:
    """Jobs, newest first, each as :func:`~tunecache.service.redaction.job_for_readers` shows it."""
    page = jobs.list_jobs(session, status=status, limit=limit, offset=offset)
    return redaction.jobs_page_for_readers(page, redaction.shows_identities(caller, settings))


workers_router = APIRouter(prefix="/workers", tags=["tuning-jobs"])


@workers_router.get("", response_model=WorkerList)
def list_workers(
    session: SessionDep,
    caller: ReadCaller,
    settings: SettingsDep,
    gpu_name: Annotated[str | None, Query(min_length=1, max_length=128, description="only workers of this GPU")] = None,
    arch: Annotated[str | None, Query(min_length=1, max_length=16, description="only workers of this arch, e.g. sm90")] = None,
) -> WorkerList:
    """The GPU job workers seen in the last day, latest heartbeat first: name, GPU, arch,
    whether the node has a model config directory, ``last_seen`` and ``seen_s_ago``
    (seconds), and ``live``: it beat within ``live_window_s`` seconds (60, or three of its
    heartbeats if it beats more slowly) and has not stopped. A job is taken only by a live
    worker of its key's ``gpu_name`` and ``arch``; with none it stays queued. Names
    (``host:pid``) are shown to an admin token only (``(hidden)`` for others), unless
    ``TUNECACHE_READS_SHOW_IDENTITIES``.
    """
    found = jobs.list_workers(session, gpu_name=gpu_name, arch=arch)
    return redaction.workers_for_readers(found, redaction.shows_identities(caller, settings))
