"""The dashboard's pages of a tuning job and of the audit log.

=========================  ======================  =============================================
route                      policy                  page
=========================  ======================  =============================================
``GET /jobs/{job_id}``     read (page)             one job: state, progress, and its run's stages drawn
``GET /audit``             admin (bearer header)   the audit log, newest first (``audit.list_events``);
                                                   a browser without the header gets the form
``POST /audit``            admin (form token)      the same page, the admin token pasted in the form
=========================  ======================  =============================================

"admin (bearer header)" is the API's ``admin`` policy (:func:`tunecache.service.policy.requires`;
``GET``: nothing audited, as ``GET /v1/audit``); "admin (form token)"
:data:`~tunecache.service.dashboard.security.AUDIT_FORM_ADMIN` (CSRF checked, nothing written
or audited). A sign-in cookie holds a read token only, so it never opens the audit log.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import HTTPException, Path, Query, Request
from fastapi.responses import Response

from tunecache.contract import MAX_ID, TOKEN_NAME_PATTERN
from tunecache.service import audit, jobs, redaction, repository
from tunecache.service.dashboard.figures import job_figure
from tunecache.service.dashboard.render import page, router
from tunecache.service.dashboard.security import AuditFormCaller, FormFields, PageCaller
from tunecache.service.deps import SessionDep
from tunecache.service.policy import AdminCaller
from tunecache.service.state import state_of

#: Audit events per page.
AUDIT_PAGE = 100


@router.get("/jobs/{job_id:int}")
def job_page(job_id: Annotated[int, Path(ge=1, le=MAX_ID)], request: Request, session: SessionDep,
             caller: PageCaller) -> Response:
    """One tuning job (``GET /v1/tuning-jobs/{id}``'s function): its state and progress, and
    the seconds of each stage its run recorded, drawn. 404 if there is none."""
    job = jobs.get_job(session, job_id)
    if job is None:
        raise HTTPException(404, detail=f"no tuning job {job_id}")
    job = redaction.job_for_readers(job, redaction.shows_identities(caller, state_of(request.app).settings))
    run = repository.get_run(session, job.run_id) if job.run_id else None
    stages = run.summary.get("stages") if run is not None and isinstance(run.summary.get("stages"), dict) else {}
    return page(request, "job.html", job=job, run=run, stages=stages, chart=job_figure(run),
                key_params=lambda key: key.model_dump())


def _audit_page(request: Request, session, before: int | None, token_name: str | None, form: bool) -> Response:
    events = audit.list_events(session, limit=AUDIT_PAGE, before=before, token_name=token_name)
    return page(request, "audit.html", events=events, before=before, token_name=token_name or "", form=form)


@router.get("/audit")
def audit_page(request: Request, session: SessionDep, _caller: AdminCaller,
               before: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None,
               token_name: Annotated[str | None, Query(pattern=TOKEN_NAME_PATTERN)] = None) -> Response:
    """The audit log (``GET /v1/audit``'s function), newest first, :data:`AUDIT_PAGE` events
    a page (``before``: continue below this event id), optionally of one token."""
    return _audit_page(request, session, before, token_name, form=False)


@router.get("/audit/open")
def audit_form(request: Request, _caller: PageCaller) -> Response:
    """The form that opens the audit log with a pasted admin token (a browser sends no
    bearer header)."""
    return page(request, "audit_form.html")


@router.post("/audit")
def audit_page_by_form(request: Request, session: SessionDep, fields: FormFields, _caller: AuditFormCaller) -> Response:
    """The audit log for the admin token pasted in the form (nothing audited: a read)."""
    before = fields.get("before") or None
    if before is not None and (not before.isdecimal() or not 1 <= int(before) <= MAX_ID):
        raise HTTPException(422, detail="before: an event id (a whole number from 1)")
    return _audit_page(request, session, int(before) if before else None, None, form=True)
