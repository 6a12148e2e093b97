"""Tuning jobs (``/v1/tuning-jobs``): queue a tuning, follow it, cancel it."""

from __future__ import annotations

from pydantic import ValidationError

from tunecache.store.http.answers import answer_detail
from tunecache.store.http.transport import Transport
from tunecache.contract import JobConflict, TuningJobCreate, TuningJobRead
from tunecache.store import JobConflictError, ServerError


class JobsClient(Transport):
    """The tuning jobs of a tunecache server (:mod:`tunecache.service.routes.jobs`)."""

    def create_job(self, job: TuningJobCreate) -> TuningJobRead:
        """``POST /v1/tuning-jobs``: queue a tuning of ``job.key`` (or get the one already
        queued or running for it with the same options).

        Raises:
            JobConflictError: 409, the key's active job has other options (named).
            ServerUnreachable, ServerError.
        """
        response = self._request("POST", "/v1/tuning-jobs", content=job.model_dump_json(exclude_none=True),
                                 headers={"Content-Type": "application/json"})
        if response.status_code == 409:
            try:
                conflict = JobConflict.model_validate_json(response.content)
            except ValidationError:
                raise ServerError(409, answer_detail(response)) from None
            raise JobConflictError(conflict)
        return self._answer(response, TuningJobRead)

    def get_job(self, job_id: int) -> TuningJobRead:
        """``GET /v1/tuning-jobs/{id}``: status, stage, step/total, log tail, timings."""
        return self._answer(self._request("GET", f"/v1/tuning-jobs/{job_id}"), TuningJobRead)

    def cancel_job(self, job_id: int) -> TuningJobRead:
        """``DELETE /v1/tuning-jobs/{id}`` (admin): cancel a job. Returns it: ``cancelled``
        (it was queued), or ``running`` with ``cancel_requested_at`` set (its worker stops
        the tuner within seconds). Cancelling a cancelled job returns it unchanged.

        Raises:
            ServerError: 404 no such job; 409 it already succeeded or failed (the detail
                names its state); 401/403 without an admin token.
            ServerUnreachable.
        """
        return self._answer(self._request("DELETE", f"/v1/tuning-jobs/{job_id}"), TuningJobRead)
