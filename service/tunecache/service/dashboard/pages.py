"""The dashboard's routes: HTML pages rendered on the server, outside the OpenAPI document.

Each page reads through the functions the API's routes use, in one transaction, and
shows one bounded page of its list:

=========================  ======================  =============================================
route                      policy                  page
=========================  ======================  =============================================
``GET /``                  read (page)             fleet matrix, wanted list (``reports.fleet_view``) and pictures
``GET /history``           read (page)             run history, filtered like ``GET /v1/tunings``, and its charts
``GET /reports``           read (page)             pod install reports, newest first
``GET /jobs``              read (page)             tuning jobs, newest first (``jobs.list_jobs``); a job: operations.py
``GET /runs/{run_id}``     read (page)             one run
``GET /diff``              read (page)             ``?a=&b=``: the run diff (``run_diff.diff_stored_runs``)
``GET /retune``            read (page)             a key's re-tune form and its ``tunecache retune`` command
``POST /retune``           admin (form token)      queue the job (``jobs.enqueue``), audited
``GET /sign-in``           anyone                  the sign-in form (when reads need a token)
``POST /sign-in``          anyone (read token)     sign the browser in with a read token
``POST /sign-out``         anyone                  sign the browser out
``GET /static/{name}``     anyone                  the stylesheet
=========================  ======================  =============================================

"read (page)" is :data:`~tunecache.service.dashboard.security.PAGE_READ`, "admin (form
token)" :data:`~tunecache.service.dashboard.security.FORM_ADMIN`, "anyone" the API's
:data:`~tunecache.service.policy.PUBLIC`.

Every page shows its rows as the API's reads do (:mod:`tunecache.service.redaction`): token
names and the host names of nodes, pods and workers only to an admin token (a bearer header:
the sign-in cookie holds a read token), unless ``TUNECACHE_READS_SHOW_IDENTITIES``.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from typing import Annotated, Any

from fastapi import HTTPException, Path, Query, Request
from fastapi.responses import RedirectResponse, Response
from pydantic import ValidationError
from sqlalchemy.orm import Session

from tunecache.contract import (
    KEY_FIELDS,
    MAX_ID,
    EntryChange,
    JobStatus,
    ReportOutcome,
    RunStatus,
    RunTrigger,
    Scope,
    TuningJobCreate,
    TuningKey,
    TuningRunQuery,
    decode_run_cursor,
)
from tunecache.service import jobs, publishing, redaction, reports, repository, run_diff, tokens
from tunecache.service.dashboard import operations  # noqa: F401  (a job's page and the audit log: its routes)
from tunecache.service.dashboard.chart import stage_chart
from tunecache.service.dashboard.figures import fleet_figures, history_figures
from tunecache.service.dashboard.queries import reports_page
from tunecache.service.dashboard.render import STATIC, page, router
from tunecache.service.dashboard.security import (
    FormAdminCaller,
    PromoteFormCaller,
    FormFields,
    PageCaller,
    check_csrf,
    clear_session,
    safe_next,
    set_session,
)
from tunecache.service.deps import SessionDep
from tunecache.service.policy import PublicCaller
from tunecache.service.state import state_of
from tunecache.service.tokens import Caller


#: Rows of the fleet matrix, and of the wanted list, per page.
FLEET_PAGE = 100
#: Rows per page of the history, the reports and the jobs.
LIST_PAGE = 50
#: Entries of a run diff per page.
DIFF_PAGE = 200
#: Runs of one key the history's chart draws at most (the newest).
CHART_RUNS = 100

Page = Annotated[int, Query(ge=1, le=100_000, description="page number, from 1")]


def _validation_error(exc: ValidationError) -> HTTPException:
    """422 naming each invalid field, as the API's answers do."""
    return HTTPException(422, detail=[{"loc": list(e["loc"]), "msg": e["msg"]} for e in exc.errors()[:20]])


def _single_params(request: Request, allowed: tuple[str, ...]) -> dict[str, str]:
    """The page's query parameters that have a value (an HTML form sends empty fields);
    422 for one it does not know or one given twice."""
    found: dict[str, str] = {}
    for name, value in request.query_params.multi_items():
        if name not in allowed:
            raise HTTPException(422, detail=f"unknown parameter {name[:64]!r} (this page takes {', '.join(allowed)})")
        if name in found:
            raise HTTPException(422, detail=f"parameter {name!r} given twice")
        if value != "":
            found[name] = value
    return found


def _identities(request: Request, caller: Caller) -> bool:
    """Whether the page shows token and host names to ``caller`` (:mod:`tunecache.service.redaction`)."""
    return redaction.shows_identities(caller, state_of(request.app).settings)


def _key_params(key: TuningKey) -> dict[str, Any]:
    """A key as query parameters (links to its history, reports and re-tune form)."""
    return key.model_dump()


# ------------------------------------------------------------------------------ fleet


@router.get("/")
def fleet_page(
    request: Request,
    session: SessionDep,
    _caller: PageCaller,
    hours: Annotated[float, Query(gt=0, le=24 * 3650)] = 24,
    q: Annotated[str, Query(max_length=200)] = "",
    page_number: Annotated[int, Query(alias="page", ge=1, le=100_000)] = 1,
    wanted_page: Page = 1,
) -> Response:
    """The fleet matrix (each key: GPU, arch, model, max_num_batched_tokens, parallel sizes,
    current run per environment, its age, the hit rate over the window) and the wanted
    list (keys and environments pods asked for with no tuning, how many pods, the closest
    run's differences), from ``GET /v1/fleet``'s function; ``q`` keeps rows whose model or
    GPU holds it. Page ``page`` of the matrix and ``wanted_page`` of the wanted list,
    :data:`FLEET_PAGE` rows each: only those rows are read into the page."""
    view = redaction.fleet_for_readers(reports.fleet_view(
        session, hours, limit=FLEET_PAGE, offset=(page_number - 1) * FLEET_PAGE, wanted_limit=FLEET_PAGE,
        wanted_offset=(wanted_page - 1) * FLEET_PAGE, contains=q))
    return page(request, "fleet.html", view=view, q=q, hours=hours, figures=fleet_figures(session, view),
                keys=view.keys, keys_total=view.total_keys,
                keys_page=page_number, keys_pages=max(1, -(-view.total_keys // FLEET_PAGE)),
                wanted=view.wanted, wanted_total=view.total_wanted,
                wanted_page=wanted_page, wanted_pages=max(1, -(-view.total_wanted // FLEET_PAGE)), key_params=_key_params)


# ---------------------------------------------------------------------------- history

#: The filters of the history form, in its order (every one is a ``GET /v1/tunings`` filter).
HISTORY_FILTERS = (*KEY_FIELDS, "flashinfer_version", "cuda_version", "status", "trigger", "since", "until", "current_only")


@router.get("/history")
def history_page(request: Request, session: SessionDep, caller: PageCaller) -> Response:
    """The tuning history, newest first, filtered like ``GET /v1/tunings`` (every filter
    of :class:`~tunecache.contract.TuningRunQuery`; empty form fields are no filter) and
    paged by its cursor; above it, the chart of tuning time per stage over time for the key
    of the newest matching run (its newest :data:`CHART_RUNS` runs matching the filters)."""
    params = _single_params(request, tuple(f for f in TuningRunQuery.model_fields if f not in ("format", "offset")))
    params.setdefault("limit", str(LIST_PAGE))
    try:
        filters = TuningRunQuery.model_validate(params)
    except ValidationError as exc:
        raise _validation_error(exc) from None
    history = redaction.runs_page_for_readers(repository.list_runs(session, filters), _identities(request, caller))
    chart_filters = filters.model_copy(update={"cursor": None, "offset": 0})
    chart_runs, _ = repository.runs_page(session, chart_filters, None, CHART_RUNS)
    chart_key = chart_runs[0].key if chart_runs else None
    if chart_key is not None and any(run.key != chart_key for run in chart_runs):
        chart_filters = chart_filters.model_copy(update=chart_key.model_dump())
        chart_runs, _ = repository.runs_page(session, chart_filters, None, CHART_RUNS)
    csv_params = {k: v for k, v in params.items() if k not in ("limit", "cursor")}
    return page(request, "history.html", history=history, filters=filters, params=params, fields=HISTORY_FILTERS,
                statuses=[s.value for s in RunStatus], triggers=[t.value for t in RunTrigger],
                chart=stage_chart(chart_runs), chart_key=chart_key, chart_limit=CHART_RUNS, csv_params=csv_params,
                key_params=_key_params, **history_figures(chart_runs))


# ---------------------------------------------------------------------------- reports


@router.get("/reports")
def reports_list_page(
    request: Request,
    session: SessionDep,
    caller: PageCaller,
    outcome: ReportOutcome | None = None,
    key: Annotated[str | None, Query(pattern=r"^[0-9a-f]{64}$", description="a key's key_hash")] = None,
    cursor: Annotated[str | None, Query(max_length=200, pattern=r"^[A-Za-z0-9_-]+$")] = None,
) -> Response:
    """Pod install reports (``POST /v1/reports``), newest first, :data:`LIST_PAGE` per page
    (``cursor``: the next page's), optionally of one ``outcome`` and one key (its hash, as
    the fleet matrix links it)."""
    try:
        after = decode_run_cursor(cursor) if cursor else None
    except ValueError as exc:
        raise HTTPException(422, detail=f"cursor: {exc}") from None
    found = reports_page(session, after=after, limit=LIST_PAGE, outcome=outcome.value if outcome else None, key_hash=key)
    identities = _identities(request, caller)
    found.items = [dataclasses.replace(r, pod=redaction.pod_for_readers(r.pod, identities)) for r in found.items]
    return page(request, "reports.html", reports=found, outcome=outcome.value if outcome else "", key=key,
                outcomes=[o.value for o in ReportOutcome], first_page=cursor is None, key_params=_key_params)


# ------------------------------------------------------------------------------- jobs


@router.get("/jobs")
def jobs_page(request: Request, session: SessionDep, caller: PageCaller, status: JobStatus | None = None,
              page_number: Annotated[int, Query(alias="page", ge=1, le=100_000)] = 1) -> Response:
    """Tuning jobs, newest first (``GET /v1/tuning-jobs``'s function), :data:`LIST_PAGE` per page."""
    found = redaction.jobs_page_for_readers(
        jobs.list_jobs(session, status=status, limit=LIST_PAGE, offset=(page_number - 1) * LIST_PAGE),
        _identities(request, caller))
    return page(request, "jobs.html", jobs=found, status=status.value if status else "", statuses=[s.value for s in JobStatus],
                page_number=page_number, pages=max(1, -(-found.total // LIST_PAGE)), key_params=_key_params)


# ------------------------------------------------------------------------- run, diff

RunId = Annotated[int, Path(ge=1, le=MAX_ID)]


@router.get("/runs/{run_id:int}")
def run_page(run_id: RunId, request: Request, session: SessionDep, caller: PageCaller) -> Response:
    """One run: key, environment, status, what the tuner measured per stage, artifacts,
    signature, and a diff against the key's previous succeeded run. 404 if there is none."""
    run = repository.get_run(session, run_id)
    if run is None:
        raise HTTPException(404, detail=f"no tuning run {run_id}")
    run = redaction.run_for_readers(run, _identities(request, caller))
    before = TuningRunQuery(**run.key.model_dump(), status=RunStatus.SUCCEEDED)
    previous, _ = repository.runs_page(session, before, (run.created_at, run.id), 1)
    stages = run.summary.get("stages") if isinstance(run.summary.get("stages"), dict) else {}
    return page(request, "run.html", run=run, previous=previous[0] if previous else None, stages=stages,
                key_params=_key_params)


@router.post("/runs/{run_id:int}/promote")
def promote(run_id: RunId, request: Request, session: SessionDep, caller: PromoteFormCaller) -> Response:
    """Make the run current (roll back to it, or take a held run): as the API's
    ``POST /v1/tunings/{id}/promote`` (:func:`tunecache.service.publishing.promote_run`: the
    same checks, 409 naming why not), audited with the pasted admin token's name. The run's
    page again, now current."""
    run, previous = publishing.promote_run(session, run_id, state_of(request.app).trusted_keys)  # 404, 409: errors.py
    request.state.audit_detail = (f"promoted run {run.id} of {run.key.model} (current before: "
                                  f"{previous if previous is not None else 'none'}) from the dashboard")
    return run_page(run_id, request, session, caller)


@router.get("/diff")
def diff_page(request: Request, _caller: PageCaller, a: Annotated[int, Query(ge=1, le=MAX_ID)],
              b: Annotated[int, Query(ge=1, le=MAX_ID)], show: EntryChange | None = None,
              regressions: bool = False, page_number: Annotated[int, Query(alias="page", ge=1, le=100_000)] = 1) -> Response:
    """Which entries of FlashInfer's file changed from run ``a`` to run ``b``: the API's
    diff (``GET /v1/tunings/{a}/diff/{b}``: :func:`tunecache.service.run_diff.diff_stored_runs`,
    the same errors: 404 naming a missing run, 422 for a run without a readable file, 503
    while the process computes another), as a table with ``REGRESSION`` marks; ``show``
    keeps one kind of change, ``regressions`` only regressions; :data:`DIFF_PAGE` entries
    per page."""
    diff = run_diff.diff_stored_runs(state_of(request.app).sessions, state_of(request.app).diff_slots, a, b)
    entries = [e for e in diff.entries if (show is None or e.status == show) and (not regressions or e.regression)]
    return page(request, "diff.html", diff=diff, entries=entries[(page_number - 1) * DIFF_PAGE:page_number * DIFF_PAGE],
                shown=len(entries), show=show.value if show else "", regressions=regressions, page_number=page_number,
                pages=max(1, -(-len(entries) // DIFF_PAGE)), changes=[c.value for c in EntryChange])


# ----------------------------------------------------------------------------- retune


#: The key's whole-number fields (a form sends them as text).
_KEY_NUMBERS = tuple(f for f, info in TuningKey.model_fields.items() if info.annotation is int)


def _key_from(values: dict[str, str]) -> TuningKey:
    """The key named by form or query fields; 422 naming each invalid field."""
    given: dict[str, Any] = {f: values[f] for f in KEY_FIELDS if values.get(f, "") != ""}
    for name in _KEY_NUMBERS:
        if name in given and given[name].isdecimal() and len(given[name]) <= 12:
            given[name] = int(given[name])
    try:
        return TuningKey.model_validate(given)
    except ValidationError as exc:
        raise _validation_error(exc) from None


def retune_command(base_url: str, key: TuningKey) -> str:
    """The ``tunecache retune`` command that asks for the same job (with the GPU node's own
    model config, ``--node-config``), each argument quoted for a POSIX shell."""
    args = ["tunecache", "retune", "--server", base_url, "--model", key.model, "--max-num-batched-tokens",
            str(key.max_num_batched_tokens), "--gpu-name", key.gpu_name, "--arch", key.arch]
    if key.dtype != "auto":
        args += ["--dtype", key.dtype]
    if key.quantization != "auto":
        args += ["--quantization", key.quantization]
    if key.tensor_parallel_size != 1:
        args += ["-tp", str(key.tensor_parallel_size)]
    if key.data_parallel_size != 1:
        args += ["-dp", str(key.data_parallel_size)]
    if key.expert_parallel_size != 1:
        args.append("--enable-expert-parallel")
    return " ".join(shlex.quote(a) for a in [*args, "--node-config"])


def _retune_context(request: Request, session: Session, key: TuningKey, caller: Caller) -> dict[str, Any]:
    workers = redaction.workers_for_readers(jobs.list_workers(session, gpu_name=key.gpu_name, arch=key.arch),
                                            _identities(request, caller))
    ranks = key.tensor_parallel_size * key.data_parallel_size
    return {"key": key, "live_workers": workers.live_for(key.gpu_name, key.arch), "live_window_s": workers.live_window_s,
            "command": retune_command(str(request.base_url).rstrip("/"), key),
            "command_exact": key.expert_parallel_size in (1, ranks), "key_params": _key_params}


@router.get("/retune")
def retune_form(request: Request, session: SessionDep, caller: PageCaller) -> Response:
    """The re-tune form of a key (its fields as query parameters, as the fleet matrix links
    it): the ``tunecache retune`` command that does the same, whether a live GPU worker
    for the key's GPU has been seen, and the button, which needs an admin token pasted into
    the form (never stored)."""
    key = _key_from(_single_params(request, KEY_FIELDS))
    return page(request, "retune.html", **_retune_context(request, session, key, caller), hf_config="")


@router.post("/retune")
def retune(request: Request, session: SessionDep, fields: FormFields, caller: FormAdminCaller) -> Response:
    """Queue a tuning job for the form's key: as the API's ``POST /v1/tuning-jobs`` (the same
    rate limit per token, single-flight per key: :func:`tunecache.service.jobs.enqueue`, 409
    naming a job with other options), audited in the same transaction with the pasted admin
    token's name.
    ``hf_config``: the model's config.json pasted (empty: the GPU node's own config). 202
    with the job."""
    key = _key_from(fields)
    hf_config = None
    if fields.get("hf_config", "").strip():
        try:
            hf_config = json.loads(fields["hf_config"])
        except ValueError as exc:
            raise HTTPException(422, detail=f"hf_config: not JSON ({exc})") from None
    try:
        body = TuningJobCreate(key=key, hf_config=hf_config)
    except ValidationError as exc:
        raise _validation_error(exc) from None
    state_of(request.app).job_requests.check(caller.name)
    job, created = jobs.enqueue(session, body, requested_by=caller.name)
    request.state.audit_detail = (f"job {job.id} for {job.key.model} ({'queued' if created else 'already queued'}) "
                                  "from the dashboard")
    return page(request, "retune_done.html", http_status=202, job=job, **_retune_context(request, session, key, caller))


# ---------------------------------------------------------------------------- sign-in


@router.get("/sign-in")
def sign_in_form(request: Request, _caller: PublicCaller,
                 next_page: Annotated[str, Query(alias="next", max_length=2000)] = "/") -> Response:
    """The sign-in form: paste a read token (needed when ``TUNECACHE_READ_TOKEN_REQUIRED``)."""
    return page(request, "sign_in.html", next=safe_next(next_page))


@router.post("/sign-in")
def sign_in(request: Request, session: SessionDep, fields: FormFields, _caller: PublicCaller) -> Response:
    """Sign the browser in with the pasted token: 303 back to ``next`` with the sign-in
    cookie. 401 for a token that is unknown, revoked or malformed; 403 for one whose scope
    is above ``read`` (a token that can write never goes into a cookie)."""
    check_csrf(request, fields, "sign-in")
    caller = tokens.authenticate(session, fields.get("token", "").strip())
    if caller is None:
        raise HTTPException(401, detail="that token is not valid (unknown, revoked or malformed): sign in with a token "
                                        "of scope read", headers={"WWW-Authenticate": "Bearer"})
    if caller.scope is not Scope.READ:
        raise HTTPException(403, detail=f"token {caller.name!r} has scope {caller.scope}; signing in needs a token of "
                                        f"scope read, exactly: the browser keeps it in a cookie, and a token that can "
                                        f"write is never kept so (create one: tunecache token create --name dashboard "
                                        f"--scope read)")
    response = RedirectResponse(safe_next(fields.get("next")), status_code=303)
    set_session(request, response, fields["token"].strip())
    return response


@router.post("/sign-out")
def sign_out(request: Request, fields: FormFields, _caller: PublicCaller) -> Response:
    """Sign the browser out (the cookie is deleted): 303 to the sign-in form."""
    check_csrf(request, fields, "sign-out")
    response = RedirectResponse("/sign-in", status_code=303)
    clear_session(request, response)
    return response


# ----------------------------------------------------------------------------- static

#: The files under ``static/`` by name, read once: ``(bytes, media type)``.
_MEDIA_TYPES = {".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
STATIC_FILES = {p.name: (p.read_bytes(), _MEDIA_TYPES[p.suffix]) for p in sorted(STATIC.iterdir()) if p.suffix in _MEDIA_TYPES}


@router.get("/static/{name}")
def static_file(name: Annotated[str, Path(max_length=64)], _caller: PublicCaller) -> Response:
    """One of the dashboard's static files (the stylesheet); 404 for any other name."""
    found = STATIC_FILES.get(name)
    if found is None:
        raise HTTPException(404, detail=f"no static file {name[:64]!r}")
    return Response(found[0], media_type=found[1],
                    headers={"Cache-Control": "public, max-age=3600", "X-Content-Type-Options": "nosniff"})
