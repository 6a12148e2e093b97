"""Tuning jobs (``/v1/tuning-jobs``): queue a tuning, follow it, list them, cancel one."""

from __future__ import annotations

from pydantic import ValidationError

from tunecache.store.http.answers import answer_detail
from tunecache.store.http import routes
from tunecache.store.http.routes import calls
from tunecache.store.http.transport import Transport
from tunecache.contract import JobConflict, JobStatus, TuningJobCreate, TuningJobPage, TuningJobRead
from tunecache.store import JobConflictError, ServerError


class JobsClient(Transport):
    """The tuning jobs of a tunecache server (:mod:`tunecache.service.routes.jobs`)."""

    @calls(routes.CREATE_JOB)
    def create_job(self, job: TuningJobCreate) -> TuningJobRead:
        """``POST /v1/tuning-jobs``: queue a tuning of ``job.key`` (or get the one already
        queued or running for it with the same options).

        Raises:
            JobConflictError: 409, the key's active job has other options (named).
            ServerUnreachable, ServerError.
        """
        response = self._request(*routes.CREATE_JOB.call(), content=job.model_dump_json(exclude_none=True),
                                 headers={"Content-Type": "application/json"})
        if response.status_code == 409:
            try:
                conflict = JobConflict.model_validate_json(response.content)
            except ValidationError:
                raise ServerError(409, answer_detail(response)) from None
            raise JobConflictError(conflict)
        return self._answer(response, TuningJobRead)

    @calls(routes.GET_JOB)
    def get_job(self, job_id: int) -> TuningJobRead:
        """``GET /v1/tuning-jobs/{id}``: status, stage, step/total, log tail, timings."""
        return self._answer(self._request(*routes.GET_JOB.call(job_id=job_id)), TuningJobRead)

    @calls(routes.LIST_JOBS)
    def list_jobs(self, status: JobStatus | None = None, limit: int = 50, offset: int = 0) -> TuningJobPage:
        """``GET /v1/tuning-jobs``: one page of jobs, newest first (of ``status`` only, when given),
        as the caller's scope may see them (the service redacts identities for readers)."""
        params: dict[str, str | int] = {"limit": limit, "offset": offset}
        if status is not None:
            params["status"] = str(status)
        return self._answer(self._request(*routes.LIST_JOBS.call(), params=params), TuningJobPage)

    @calls(routes.CANCEL_JOB)
    def cancel_job(self, job_id: int) -> TuningJobRead:
        """``DELETE /v1/tuning-jobs/{id}`` (admin): cancel a job. Returns it: ``cancelled``
        (it was queued), or ``running`` with ``cancel_requested_at`` set (its worker stops
        the tuner within seconds). Cancelling a cancelled job returns it unchanged.

        Raises:
            ServerError: 404 no such job; 409 it already succeeded or failed (the detail
                names its state); 401/403 without an admin token.
            ServerUnreachable.
        """
        return self._answer(self._request(*routes.CANCEL_JOB.call(job_id=job_id)), TuningJobRead)
