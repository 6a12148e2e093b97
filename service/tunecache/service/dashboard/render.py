"""HTML of the dashboard: the Jinja2 environment (autoescape on: model names, pod names and
reports come from pods), the page response with its security headers, and error pages.

Errors of a dashboard route are the API's own answers rendered as HTML:
:class:`DashboardRoute` has each of the app's exception handlers (``errors.py``: 401/403
naming the scope, 404, 409, 422 naming the field, 429, 503 with ``Retry-After``) make its
answer as for the API, and turns that answer's ``detail`` into a page with the same status
and headers. The exception still reaches the route's dependencies first, so the request's
transaction rolls back and nothing is audited, as with the API.
"""

from __future__ import annotations

import datetime as dt
import inspect
import json
import math
from http import HTTPStatus
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import jinja2
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response
from fastapi.routing import APIRoute
from starlette.types import Receive, Scope, Send

from tunecache.service.dashboard.security import SESSION_COOKIE, CsrfIssuer, clear_session
from tunecache.service.state import state_of

TEMPLATES = Path(__file__).parent / "templates"
STATIC = Path(__file__).parent / "static"

#: Headers of every dashboard page: no script may run (there is none), styles and forms
#: only from this service, never framed, never cached (pages hold CSRF fields).
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
                               "frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def when(value: dt.datetime | None) -> str:
    """``2026-11-30 12:34:56 UTC`` (``—`` for none)."""
    if value is None:
        return "—"
    return value.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def age(seconds: float | None) -> str:
    """A duration in its two largest units: ``42 s``, ``5 min 3 s``, ``3 h 12 min``, ``2 d 4 h``."""
    if seconds is None or not math.isfinite(seconds):
        return "—"
    seconds = max(0, int(seconds))
    for unit, size, sub, sub_size in (("d", 86400, "h", 3600), ("h", 3600, "min", 60), ("min", 60, "s", 1)):
        if seconds >= size:
            rest = (seconds % size) // sub_size
            return f"{seconds // size} {unit}" + (f" {rest} {sub}" if rest else "")
    return f"{seconds} s"


def percent(value: float | None, digits: int = 1) -> str:
    """``97.5 %`` (``—`` for none)."""
    return "—" if value is None else f"{value * 100:.{digits}f} %"


def number(value: Any, digits: int = 3) -> str:
    """A measured number with ``digits`` significant digits (``—`` for none)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return "—"
    return f"{value:.{digits}g}"


def as_json(value: Any) -> str:
    """A tactic or other JSON value as compact JSON text (escaped by the template)."""
    return "—" if value is None else json.dumps(value, separators=(",", ":"), default=str)


def with_query(request: Request, **changes: Any) -> str:
    """This page's path with its query parameters changed (``None``: removed)."""
    params = dict(request.query_params)
    for name, value in changes.items():
        if value is None or value == "":
            params.pop(name, None)
        else:
            params[name] = str(value)
    return request.url.path + ("?" + urlencode(params) if params else "")


def url(path: str, **params: Any) -> str:
    """``path`` with the given query parameters (those ``None`` or empty left out)."""
    kept = {k: v for k, v in params.items() if v is not None and v != ""}
    return path + ("?" + urlencode(kept) if kept else "")


environment = jinja2.Environment(
    loader=jinja2.FileSystemLoader(TEMPLATES),
    autoescape=True,  # every template, whatever its name: everything shown is escaped
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
environment.filters.update(when=when, age=age, percent=percent, number=number, as_json=as_json)
environment.globals.update(with_query=with_query, url=url)


def page(request: Request, template: str, http_status: int = 200, headers: dict[str, str] | None = None,
         **context: Any) -> HTMLResponse:
    """Render ``template`` as the answer: the security headers, and the CSRF cookie when
    this browser had none (see :mod:`~tunecache.service.dashboard.security`)."""
    csrf = CsrfIssuer(request)
    settings = state_of(request.app).settings
    html = environment.get_template(template).render(
        request=request, csrf=csrf, reads_need_token=settings.read_token_required,
        signed_in=bool(request.cookies.get(SESSION_COOKIE)), **context)
    response = HTMLResponse(html, status_code=http_status, headers={**SECURITY_HEADERS, **(headers or {})})
    csrf.apply(response)
    return response


#: Headers of an API error answer that an error page keeps.
_KEPT_HEADERS = ("www-authenticate", "retry-after", "allow")


def _detail_lines(detail: Any) -> list[str]:
    """An error's ``detail`` as lines: a string, or a 422's list of ``{loc, msg}``."""
    if isinstance(detail, str):
        return [detail]
    if isinstance(detail, list):
        lines = []
        for error in detail:
            if isinstance(error, dict):
                where = ".".join(str(part) for part in error.get("loc", ()) if part not in ("query", "body"))
                lines.append(f"{where}: {error.get('msg', '')}" if where else str(error.get("msg", "")))
            else:
                lines.append(str(error))
        return lines
    return [] if detail is None else [json.dumps(detail, default=str)]


def error_page(request: Request, status: int, detail: Any, headers: dict[str, str] | None = None,
               body: dict[str, Any] | None = None) -> HTMLResponse:
    """An error as a page. A 401 on a page (``GET``) shows the sign-in form and forgets a
    sign-in cookie that did not work."""
    try:
        title = HTTPStatus(status).phrase
    except ValueError:
        title = "Error"
    response = page(request, "error.html", http_status=status, headers=headers, status_code=status, title=title,
                    lines=_detail_lines(detail), body=body or {},
                    sign_in=status == 401 and request.method == "GET",
                    next=request.url.path + (f"?{request.url.query}" if request.url.query else ""))
    if status == 401 and request.cookies.get(SESSION_COOKIE):
        clear_session(request, response)
    return response


def _as_html(handler):
    """An exception handler of the app, answering with a page instead of JSON."""

    async def html(request: Request, exc: Exception) -> Response:
        answer = handler(request, exc)
        if inspect.isawaitable(answer):
            answer = await answer
        try:
            body = json.loads(answer.body)
        except (AttributeError, ValueError):
            body = {}
        body = body if isinstance(body, dict) else {}
        headers = {k: v for k, v in answer.headers.items() if k.lower() in _KEPT_HEADERS}
        return error_page(request, answer.status_code, body.get("detail"), headers, body)

    return html


def _html_handlers(app, handlers: tuple[dict, dict]) -> tuple[dict, dict]:
    """The app's exception handlers wrapped by :func:`_as_html`, made once per app."""
    cached = state_of(app).dashboard_error_handlers
    if cached is not None and cached[0] is handlers[0] and cached[1] is handlers[1]:
        return cached[2]
    wrapped = ({cls: _as_html(h) for cls, h in handlers[0].items()}, {code: _as_html(h) for code, h in handlers[1].items()})
    state_of(app).dashboard_error_handlers = (handlers[0], handlers[1], wrapped)
    return wrapped


class DashboardRoute(APIRoute):
    """A dashboard route: errors are answered as pages (see the module)."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        handlers = scope.get("starlette.exception_handlers")
        if handlers is not None and "app" in scope:
            scope["starlette.exception_handlers"] = _html_handlers(scope["app"], handlers)
        await super().handle(scope, receive, send)


#: The dashboard's routes (:mod:`~tunecache.service.dashboard.pages` and
#: :mod:`~tunecache.service.dashboard.operations` add theirs), outside the OpenAPI document.
router = APIRouter(route_class=DashboardRoute, include_in_schema=False)
