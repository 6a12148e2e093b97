"""Who may use the dashboard, and how a browser says who it is.

Browsers send no ``Authorization`` header, so the dashboard's policies take the token
where a browser can hold it, and check it exactly as the API's policies do
(:mod:`tunecache.service.policy`):

* :data:`PAGE_READ` (every page): the API's ``read`` policy. Open unless
  ``TUNECACHE_READ_TOKEN_REQUIRED``; then the token comes from an ``Authorization: Bearer``
  header (``curl``) or, in a browser, from the sign-in cookie :data:`SESSION_COOKIE`, set
  by ``POST /sign-in`` from a pasted **read** token (a token that can write is refused
  there: a browser cookie never holds one). The cookie is ``HttpOnly`` (no script reads
  it), ``SameSite=Strict`` (no other site's page or form sends it), ``Secure`` over
  HTTPS, and lasts :data:`SESSION_SECONDS`; it is checked like a bearer token (the same
  per-process token cache, so a revoked token stops within ``TUNECACHE_TOKEN_CACHE_SECONDS``).
* :data:`FORM_ADMIN` (the re-tune button): the API's ``admin`` write policy with the
  token taken from the form's ``token`` field, pasted for each request and never stored;
  checked against the database every time and audited in the request's transaction, as
  ``POST /v1/tuning-jobs`` is.

Every form also carries a CSRF token (:func:`csrf_field`): an HMAC of the form's name keyed
with a random secret the browser holds in the cookie :data:`CSRF_COOKIE` (``HttpOnly``,
``SameSite=Strict``), so a page of another site can neither read the field's value nor make
the browser send the cookie, and a token made for one form is refused by another. A
``POST`` also needs its ``Origin`` (when the browser sends one) to be this service's, and a
``Sec-Fetch-Site`` (when sent) of ``same-origin``. Stateless: any process or replica of the
service checks it, with no shared secret and no table.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Iterator
from typing import Annotated
from urllib.parse import parse_qsl, urlsplit

from fastapi import Depends, HTTPException, Request, Response
from fastapi.security import HTTPAuthorizationCredentials

from tunecache.contract import Scope
from tunecache.service import policy, tokens
from tunecache.service.deps import SessionDep
from tunecache.service.policy import CallerPolicy, Credentials
from tunecache.service.tokens import Caller
from tunecache.service.state import state_of

#: The sign-in cookie: a read token, pasted on ``/sign-in``.
SESSION_COOKIE = "tunecache_session"
#: How long a sign-in lasts in the browser (seconds): a working day.
SESSION_SECONDS = 12 * 3600
#: The browser's CSRF secret (random, URL-safe base64).
CSRF_COOKIE = "tunecache_csrf"
#: Form fields of a dashboard ``POST``, at most (a re-tune form has about a dozen).
MAX_FORM_FIELDS = 32
_CSRF_SECRET = re.compile(r"^[A-Za-z0-9_-]{32,64}$")
_URLENCODED = "application/x-www-form-urlencoded"


def _secure(request: Request) -> bool:
    return request.url.scheme == "https"


def csrf_secret(request: Request) -> str | None:
    """The browser's CSRF secret from its cookie, when it is one this service makes."""
    value = request.cookies.get(CSRF_COOKIE, "")
    return value if _CSRF_SECRET.match(value) else None


def form_csrf(secret: str, form: str) -> str:
    """The CSRF field of the form named ``form`` for the browser secret ``secret``."""
    return hmac.new(secret.encode(), f"tunecache dashboard form {form}".encode(), hashlib.sha256).hexdigest()


class CsrfIssuer:
    """Makes the CSRF fields of one page: the browser's secret (a new one when it has none)
    and, for each form, the HMAC of the form's name with it. :meth:`apply` sets the cookie
    on the page's response when a new secret was made."""

    def __init__(self, request: Request):
        self._request = request
        self._existing = csrf_secret(request)
        self.secret = self._existing or secrets.token_urlsafe(32)

    def field(self, form: str) -> str:
        """The value of the hidden ``csrf`` field of the form named ``form``."""
        return form_csrf(self.secret, form)

    def apply(self, response: Response) -> None:
        """Set the CSRF cookie on ``response`` when this page made a new secret."""
        if self._existing is None:
            response.set_cookie(CSRF_COOKIE, self.secret, httponly=True, samesite="strict", secure=_secure(self._request),
                                path="/")


def _same_origin(request: Request) -> bool:
    """Whether the browser says the request comes from one of this service's own pages
    (a header it does not send says nothing either way)."""
    fetch_site = request.headers.get("sec-fetch-site")
    if fetch_site is not None and fetch_site != "same-origin":
        return False
    origin = request.headers.get("origin")
    if origin is None:
        return True
    # host and port only: behind a proxy that ends TLS the service itself sees http://
    return urlsplit(origin).netloc == request.headers.get("host", request.url.netloc)


async def form_fields(request: Request) -> dict[str, str]:
    """The fields of a form ``POST`` (``application/x-www-form-urlencoded``, UTF-8; the
    body's size is bounded by ``TUNECACHE_MAX_JSON_BYTES`` like every body). 415 for
    another body type, 422 for one that is not such a form or holds a field twice."""
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type != _URLENCODED:
        raise HTTPException(415, detail=f"a dashboard form is sent as {_URLENCODED}, not {media_type or 'no content type'}")
    try:
        pairs = parse_qsl((await request.body()).decode("utf-8"), keep_blank_values=True, strict_parsing=False,
                          max_num_fields=MAX_FORM_FIELDS)
    except (UnicodeDecodeError, ValueError) as exc:
        raise HTTPException(422, detail=f"the form cannot be read: {exc}") from None
    fields: dict[str, str] = {}
    for name, value in pairs:
        if name in fields:
            raise HTTPException(422, detail=f"the form has the field {name[:64]!r} twice")
        fields[name] = value
    return fields


FormFields = Annotated[dict[str, str], Depends(form_fields)]


def check_csrf(request: Request, fields: dict[str, str], form: str) -> None:
    """403 unless the form ``form`` was posted from this service's page that made it (see
    the module): same origin, and its ``csrf`` field is the HMAC of ``form`` with the
    browser's CSRF secret."""
    if not _same_origin(request):
        raise HTTPException(403, detail="this form was sent from another site's page; open the dashboard and send it "
                                        "from there")
    secret = csrf_secret(request)
    if secret is None or not hmac.compare_digest(fields.get("csrf", ""), form_csrf(secret, form)):
        raise HTTPException(403, detail="the form's CSRF token is missing or not this browser's (the page is old, or "
                                        "the form was not made by this dashboard): reload the page and send it again")


class _PageRead(CallerPolicy):
    """Dashboard pages: the API's ``read`` policy (:data:`tunecache.service.policy.READ`)
    applied to the bearer header, else, when reads need a token, to the sign-in cookie."""

    scope = Scope.READ

    async def __call__(self, request: Request, credentials: Credentials) -> Caller:
        if credentials is None and state_of(request.app).settings.read_token_required:
            cookie = request.cookies.get(SESSION_COOKIE)
            if cookie:
                credentials = HTTPAuthorizationCredentials(scheme="Bearer", credentials=cookie)
        try:
            return await policy.READ(request, credentials)
        except HTTPException as exc:
            if credentials is None:  # say how a browser signs in (the page shows the form)
                raise HTTPException(401, detail="reads on this service need a token with scope read or above: sign in "
                                                "with a read token (tunecache token create --name dashboard --scope read)",
                                    headers=exc.headers) from None
            raise


class _FormAdmin(CallerPolicy):
    """The re-tune form: the CSRF check of the form ``form``, then the API's ``admin``
    write policy (:func:`tunecache.service.policy.requires`) on the token pasted in the
    form's ``token`` field: checked against the database, and the write audited in the
    request's transaction when the route returns without an error."""

    scope = Scope.ADMIN

    def __init__(self, form: str):
        self.form = form

    def __call__(self, request: Request, session: SessionDep, fields: FormFields) -> Iterator[Caller]:
        check_csrf(request, fields, self.form)
        token = fields.get("token", "").strip()
        if not token:
            raise HTTPException(401, detail=f"{request.method} {request.url.path} needs a token with scope admin: paste "
                                            f"one in the form's token field", headers={"WWW-Authenticate": "Bearer"})
        credentials = HTTPAuthorizationCredentials(scheme="Bearer", credentials=token)
        yield from policy.requires(Scope.ADMIN)(request, session, credentials)


class _FormAdminRead(CallerPolicy):
    """A page only an admin reads (the audit log) asked for with a form: the CSRF check of
    the form ``form``, then the admin token pasted in its ``token`` field, checked against the
    database as the API's ``admin`` policy does. Nothing is written, so nothing is audited
    (as ``GET /v1/audit``: reading the log is not logged)."""

    scope = Scope.ADMIN

    def __init__(self, form: str):
        self.form = form

    def __call__(self, request: Request, fields: FormFields) -> Caller:
        check_csrf(request, fields, self.form)
        token = fields.get("token", "").strip()
        if not token:
            raise HTTPException(401, detail=f"{request.url.path} needs a token with scope admin: paste one in the "
                                            f"form's token field", headers={"WWW-Authenticate": "Bearer"})
        with state_of(request.app).sessions.begin() as session:
            caller = tokens.authenticate(session, token)
        if caller is None:
            raise HTTPException(401, detail="that token is not valid (unknown, revoked or malformed); this page needs a "
                                            "token with scope admin", headers={"WWW-Authenticate": "Bearer"})
        if caller.scope is None or not caller.scope.includes(Scope.ADMIN):
            raise HTTPException(403, detail=f"token {caller.name!r} has scope {caller.scope}; {request.url.path} "
                                            f"needs admin")
        return caller


PAGE_READ = _PageRead()
AUDIT_FORM_ADMIN = _FormAdminRead("audit")
FORM_ADMIN = _FormAdmin("retune")
PROMOTE_FORM_ADMIN = _FormAdmin("promote")

PageCaller = Annotated[Caller, Depends(PAGE_READ)]
FormAdminCaller = Annotated[Caller, Depends(FORM_ADMIN, scope="function")]
PromoteFormCaller = Annotated[Caller, Depends(PROMOTE_FORM_ADMIN, scope="function")]
AuditFormCaller = Annotated[Caller, Depends(AUDIT_FORM_ADMIN)]


def set_session(request: Request, response: Response, token: str) -> None:
    """Sign the browser in: the read token in the sign-in cookie (see the module)."""
    response.set_cookie(SESSION_COOKIE, token, max_age=SESSION_SECONDS, httponly=True, samesite="strict",
                        secure=_secure(request), path="/")


def clear_session(request: Request, response: Response) -> None:
    """Sign the browser out (the cookie is deleted)."""
    response.delete_cookie(SESSION_COOKIE, httponly=True, samesite="strict", secure=_secure(request), path="/")


def safe_next(target: str | None) -> str:
    """A place on this service to go back to after signing in: a path of it, else ``/``
    (never another site: ``//host`` and ``/\\host`` are refused)."""
    if not target or not target.startswith("/") or target.startswith(("//", "/\\")) or any(c in target for c in "\r\n\\"):
        return "/"
    return target
