"""HTTP client of the tunecache service (httpx): the HTTP implementation of
:class:`tunecache.store.TuningStore`. Answers are the contract's models
(:mod:`tunecache.contract`), never dicts; failures are typed errors a CLI maps to exit codes.

A pod must never hang or crash at boot because of tunecache, so every request has a
connect and a read timeout and a total deadline per attempt, and transient failures
(connection refused or reset, timeouts, truncated bodies, 429/502/503/504) are retried a
bounded number of times with jittered exponential backoff (tenacity), waiting at least
what a server's ``Retry-After`` asks (up to ``max_retry_after_s``), before the typed error
is raised.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import hashlib
import ipaddress
import json
import ssl
import time
from pathlib import Path
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError
from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_after_attempt, wait_random_exponential

from tunecache.client.settings import ClientSettings
from tunecache.contract import (
    ArtifactStored,
    AuditPage,
    Scope,
    TokenCreate,
    TokenCreated,
    TokenRead,
    EnvironmentMetadata,
    LookupMiss,
    LookupRequest,
    TuningJobCreate,
    TuningJobRead,
    TuningKey,
    TuningRunCreate,
    TuningRunPage,
    TuningRunQuery,
    TuningRunRead,
)
from tunecache.store import NoCompatibleTuning, TunecacheError, file_sha256

Answer = TypeVar("Answer", bound=BaseModel)

#: Seconds to connect, and to wait for each read, by default.
DEFAULT_CONNECT_TIMEOUT_S = 5.0
DEFAULT_READ_TIMEOUT_S = 30.0
#: Attempts per request (1 = no retry) and the backoff between them (0.5 s, 1 s, 2 s, ... at most 4 s).
DEFAULT_ATTEMPTS = 3
#: Seconds one attempt may take in all, however the server trickles its answer.
DEFAULT_TOTAL_TIMEOUT_S = 120.0
#: The most seconds a server's ``Retry-After`` is obeyed by default.
DEFAULT_MAX_RETRY_AFTER_S = 30.0
_RETRY_STATUSES = frozenset({429, 502, 503, 504})


class ServerUnreachable(TunecacheError):
    """No connection, or the server did not answer in time."""


class ServerError(TunecacheError):
    """The server answered with an error status (other than a lookup's 404)."""

    def __init__(self, status_code: int, detail: Any):
        shown = " ".join(str(detail).split())  # one line, however the server formats it
        super().__init__(f"server answered {status_code}: {shown[:300]}{'...' if len(shown) > 300 else ''}")
        self.status_code = status_code
        self.detail = detail


class ArtifactCorrupt(TunecacheError):
    """Downloaded bytes do not hash to the sha256 the server announced."""


class DownloadTruncated(ArtifactCorrupt):
    """The connection closed before the whole body arrived."""


class _Transient(Exception):
    """A failure worth another attempt; carries the error to raise when attempts run out,
    and the seconds the server asked to wait (``Retry-After``), if it did."""

    def __init__(self, error: TunecacheError, retry_after_s: float | None = None):
        super().__init__(str(error))
        self.error = error
        self.retry_after_s = retry_after_s


def retry_after_seconds(value: str | None, now: dt.datetime | None = None) -> float | None:
    """Seconds a ``Retry-After`` header asks for: delay-seconds or an HTTP date
    (RFC 9110, 10.2.3); ``None`` when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return max(0.0, (when - (now or dt.datetime.now(dt.timezone.utc))).total_seconds())


def _status_error(response: httpx.Response, detail: Any) -> "_Transient":
    return _Transient(ServerError(response.status_code, detail), retry_after_seconds(response.headers.get("retry-after")))


def _json_object(response: httpx.Response) -> dict[str, Any] | None:
    """The body as a JSON object, or ``None`` (not JSON, or not an object)."""
    try:
        body = response.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def _detail(response: httpx.Response) -> Any:
    body = _json_object(response)
    if body is not None and "detail" in body:
        return body["detail"]
    return response.text[:200] or response.reason_phrase


def _detail_of(body: bytes) -> Any:
    try:
        parsed = json.loads(body)
    except ValueError:
        return body[:200].decode(errors="replace")
    return parsed.get("detail", parsed) if isinstance(parsed, dict) else parsed


class InsecureTransport(ValueError):
    """A token would travel in clear text (``http://``) to a host that is not loopback."""


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class TunecacheClient:
    """Talks to one tunecache server; implements :class:`tunecache.store.TuningStore`.

    Args:
        base_url: e.g. ``http://tunecache:8321``.
        connect_timeout_s / read_timeout_s: httpx timeouts in seconds (5 s / 30 s).
        attempts: tries per request for transient failures (3).
        total_timeout_s: the most one attempt may take, end to end (120 s): a server that
            sends a byte now and then never trips a read timeout, so bodies are read
            against this deadline too.
        max_retry_after_s: the longest a server's ``Retry-After`` is obeyed (30 s).
        token: sent as ``Authorization: Bearer <token>`` on every request.
        ca_bundle: CA certificates (PEM file) to verify an https server with; TLS is always
            verified (default: the system's CAs).
        allow_insecure: allow ``token`` over plain ``http://`` to a host that is not loopback.
        transport: an httpx transport (tests).

    Raises:
        InsecureTransport: a token would travel in clear text to another machine
            (``http://`` to a non-loopback host without ``allow_insecure``).
        ValueError: ``base_url`` is not an http(s) URL with a host; ``ca_bundle`` is not a
            file of PEM certificates.
    """

    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
        attempts: int = DEFAULT_ATTEMPTS,
        total_timeout_s: float = DEFAULT_TOTAL_TIMEOUT_S,
        max_retry_after_s: float = DEFAULT_MAX_RETRY_AFTER_S,
        token: str | None = None,
        ca_bundle: Path | None = None,
        allow_insecure: bool = False,
        transport: httpx.BaseTransport | None = None,
    ):
        try:
            url = httpx.URL(base_url)
        except httpx.InvalidURL as exc:
            raise ValueError(f"server URL {base_url!r} is not a URL: {exc}") from None
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError(f"server URL {base_url!r} must look like http://host:port")
        if token and url.scheme == "http" and not _is_loopback(url.host) and not allow_insecure:
            raise InsecureTransport(f"refusing to send a token in clear text to {url.host}: use https:// "
                             f"(or set TUNECACHE_ALLOW_INSECURE=1 on a network you trust)")
        if ca_bundle is not None and not Path(ca_bundle).is_file():
            raise ValueError(f"TUNECACHE_CA_BUNDLE={str(ca_bundle)!r} is not a file")
        self.base_url = base_url.rstrip("/")
        self.attempts = max(1, attempts)
        self.read_timeout_s = read_timeout_s
        self.total_timeout_s = total_timeout_s
        self.max_retry_after_s = max_retry_after_s
        timeout = httpx.Timeout(read_timeout_s, connect=connect_timeout_s)
        headers = {"Authorization": f"Bearer {token}"} if token else None
        try:
            verify = ssl.create_default_context(cafile=str(ca_bundle)) if ca_bundle is not None else True
        except (ssl.SSLError, OSError) as exc:
            raise ValueError(f"TUNECACHE_CA_BUNDLE={str(ca_bundle)!r} holds no usable PEM certificates: {exc}") from None
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout, transport=transport, headers=headers,
                                  verify=verify)

    @classmethod
    def from_settings(cls, settings: ClientSettings, url: str | None = None, **kwargs: Any) -> "TunecacheClient":
        """A client for ``url`` (default ``settings.url``) with the settings' timeouts,
        attempts, token (:meth:`ClientSettings.resolved_token`) and TLS settings.

        Raises:
            ValueError: no URL given or set (``TUNECACHE_URL``), or a bad one; a token file
                that cannot be read; see the class.
        """
        base_url = url or settings.url
        if not base_url:
            raise ValueError("no tunecache server given: pass --server URL or set TUNECACHE_URL")
        return cls(
            base_url,
            connect_timeout_s=settings.connect_timeout,
            read_timeout_s=settings.read_timeout,
            total_timeout_s=settings.total_timeout,
            attempts=settings.attempts,
            max_retry_after_s=settings.max_retry_after,
            token=settings.resolved_token(),
            ca_bundle=settings.ca_bundle,
            allow_insecure=settings.allow_insecure,
            **kwargs,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "TunecacheClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _classify(self, exc: httpx.HTTPError) -> TunecacheError:
        """Name the failure a pod hit, in words an operator can act on."""
        where = f"tunecache server {self.base_url}"
        if isinstance(exc, httpx.ConnectTimeout):
            return ServerUnreachable(f"{where} unreachable: no connection within the connect timeout")
        if isinstance(exc, httpx.ConnectError):
            return ServerUnreachable(f"{where} unreachable: {exc}")
        if isinstance(exc, httpx.ReadTimeout):
            return ServerUnreachable(f"{where} accepted the connection but sent no answer within {self.read_timeout_s:g} s")
        if isinstance(exc, httpx.RemoteProtocolError):
            return DownloadTruncated(f"{where} closed the connection before the whole answer arrived: {exc}")
        return ServerUnreachable(f"{where} unreachable: {type(exc).__name__}: {exc}")

    def _wait(self, state: RetryCallState) -> float:
        """Seconds before the next attempt: full-jitter exponential backoff (up to 0.5 s,
        1 s, 2 s, ... at most 4 s), or the server's ``Retry-After`` when it asked for longer
        (capped at ``max_retry_after_s``)."""
        backoff = wait_random_exponential(multiplier=0.5, max=4)(state)
        failure = state.outcome.exception() if state.outcome is not None else None
        if isinstance(failure, _Transient) and failure.retry_after_s is not None:
            return max(backoff, min(failure.retry_after_s, self.max_retry_after_s))
        return backoff

    def _retrying(self, attempt_once):
        """Run ``attempt_once`` with retries for :class:`_Transient`; raise its error at the end."""
        try:
            for attempt in Retrying(
                stop=stop_after_attempt(self.attempts),
                wait=self._wait,
                retry=retry_if_exception_type(_Transient),
                reraise=True,
            ):
                with attempt:
                    return attempt_once()
        except _Transient as transient:
            error = transient.error
            if self.attempts > 1:
                error.args = (f"{error} (after {self.attempts} attempts)",)
            raise error from None

    def _read_body(self, response: httpx.Response, deadline: float, sink=None) -> bytes:
        """Read a streamed body before ``deadline`` (monotonic seconds); ``sink`` sees each part."""
        parts = []
        for part in response.iter_bytes():
            if time.monotonic() > deadline:
                raise _Transient(ServerUnreachable(
                    f"tunecache server {self.base_url} answered too slowly: no complete answer within {self.total_timeout_s:g} s"
                ))
            if sink is not None:
                sink(part)
            parts.append(part)
        return b"".join(parts)

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        def once() -> httpx.Response:
            deadline = time.monotonic() + self.total_timeout_s
            try:
                with self._http.stream(method, path, **kwargs) as response:
                    body = self._read_body(response, deadline)
            except httpx.HTTPError as exc:
                raise _Transient(self._classify(exc)) from None
            headers = [(k, v) for k, v in response.headers.items() if k.lower() not in ("content-encoding", "content-length")]
            response = httpx.Response(response.status_code, headers=headers, content=body, request=response.request)
            if response.status_code in _RETRY_STATUSES:
                raise _status_error(response, _detail(response))
            return response

        return self._retrying(once)

    def _answer(self, response: httpx.Response, model: type[Answer]) -> Answer:
        """The body of a successful answer as ``model``.

        Raises:
            ServerError: an error status, or a body that is not a ``model`` (not a tunecache server?).
        """
        if response.is_error:
            raise ServerError(response.status_code, _detail(response))
        try:
            return model.model_validate_json(response.content)
        except ValidationError:
            raise ServerError(response.status_code, f"not a tunecache answer: {response.text[:200]!r}") from None

    def lookup(self, key: TuningKey, environment: EnvironmentMetadata) -> TuningRunRead:
        """``POST /v1/tunings/lookup``: the current tuning run for this key and environment.

        Raises:
            NoCompatibleTuning: 404, with the closest stored tunings and their differences.
            ServerUnreachable, ServerError.
        """
        request = LookupRequest(key=key, environment=environment)
        response = self._request("POST", "/v1/tunings/lookup", content=request.model_dump_json(),
                                 headers={"Content-Type": "application/json"})
        if response.status_code == 404:
            try:
                miss = LookupMiss.model_validate_json(response.content)
            except ValidationError:
                raise ServerError(404, _detail(response)) from None
            raise NoCompatibleTuning(miss)
        return self._answer(response, TuningRunRead)

    def list_runs(self, query: TuningRunQuery = TuningRunQuery()) -> TuningRunPage:
        """``GET /v1/tunings``: tuning history, newest first, filtered by key fields and status."""
        params = query.model_dump(mode="json", exclude_defaults=True)
        return self._answer(self._request("GET", "/v1/tunings", params=params), TuningRunPage)

    def get_run(self, run_id: int) -> TuningRunRead:
        """``GET /v1/tunings/{id}``: one run. Raises ServerError (404 when there is none)."""
        return self._answer(self._request("GET", f"/v1/tunings/{run_id}"), TuningRunRead)

    def download_artifact(self, sha256: str) -> bytes:
        """``GET /v1/artifacts/{sha256}``, streamed and verified against ``sha256``.

        Raises:
            DownloadTruncated: the body stopped short (after retries).
            ArtifactCorrupt: the bytes hash to something else (nothing is returned).
            ServerUnreachable, ServerError.
        """

        def once() -> bytes:
            digest = hashlib.sha256()
            deadline = time.monotonic() + self.total_timeout_s
            try:
                with self._http.stream("GET", f"/v1/artifacts/{sha256}") as response:
                    if response.status_code in _RETRY_STATUSES:
                        raise _status_error(response, _detail_of(self._read_body(response, deadline)))
                    if response.is_error:
                        raise ServerError(response.status_code, _detail_of(self._read_body(response, deadline)))
                    expected = response.headers.get("content-length")
                    data = self._read_body(response, deadline, sink=digest.update)
            except httpx.HTTPError as exc:
                raise _Transient(self._classify(exc)) from None
            if expected is not None and len(data) != int(expected):
                raise _Transient(DownloadTruncated(f"artifact {sha256}: received {len(data)} of {expected} bytes"))
            if digest.hexdigest() != sha256:
                raise ArtifactCorrupt(f"artifact {sha256} arrived as {len(data)} bytes hashing to {digest.hexdigest()}")
            return data

        return self._retrying(once)

    def upload_file(self, path: Path) -> str:
        """Upload a file's bytes streamed from disk (never whole in memory), unless the
        server already has them (``HEAD``); returns the sha256.

        Raises:
            ServerUnreachable, ServerError.
        """
        sha256 = file_sha256(path)
        if self._request("HEAD", f"/v1/artifacts/{sha256}").status_code == 200:
            return sha256

        def once() -> httpx.Response:
            try:
                with path.open("rb") as f:
                    response = self._http.put(f"/v1/artifacts/{sha256}", content=f)
            except httpx.HTTPError as exc:
                raise _Transient(self._classify(exc)) from None
            if response.status_code in _RETRY_STATUSES:
                raise _status_error(response, _detail(response))
            return response

        self._answer(self._retrying(once), ArtifactStored)
        return sha256

    def upload_artifact(self, data: bytes) -> ArtifactStored:
        """``PUT /v1/artifacts/{sha256}`` of bytes in memory. Idempotent.

        Raises:
            ServerUnreachable, ServerError.
        """
        digest = hashlib.sha256(data).hexdigest()
        return self._answer(self._request("PUT", f"/v1/artifacts/{digest}", content=data), ArtifactStored)

    def record_run(self, run: TuningRunCreate) -> TuningRunRead:
        """``POST /v1/tunings``: record a run whose artifacts were uploaded first.

        Raises:
            ServerError: 422 naming the field, or the artifacts never uploaded; other errors.
            ServerUnreachable.
        """
        response = self._request("POST", "/v1/tunings", content=run.model_dump_json(),
                                 headers={"Content-Type": "application/json"})
        return self._answer(response, TuningRunRead)

    def create_job(self, job: TuningJobCreate) -> TuningJobRead:
        """``POST /v1/tuning-jobs``: queue a tuning of ``job.key`` (or get the one already
        queued or running for it).

        Raises:
            ServerUnreachable, ServerError.
        """
        response = self._request("POST", "/v1/tuning-jobs", content=job.model_dump_json(exclude_none=True),
                                 headers={"Content-Type": "application/json"})
        return self._answer(response, TuningJobRead)

    def create_token(self, name: str, scope: Scope) -> TokenCreated:
        """``POST /v1/tokens`` (admin): a new token; its secret is in the answer only.

        Raises:
            ServerError: 409 when the name is taken, 401/403 without an admin token.
            ServerUnreachable.
        """
        body = TokenCreate(name=name, scope=scope).model_dump_json()
        response = self._request("POST", "/v1/tokens", content=body, headers={"Content-Type": "application/json"})
        return self._answer(response, TokenCreated)

    def list_tokens(self) -> list[TokenRead]:
        """``GET /v1/tokens`` (admin): every token, without secrets."""
        response = self._request("GET", "/v1/tokens")
        if response.status_code != 200:
            raise ServerError(response.status_code, _detail(response))
        try:
            return [TokenRead.model_validate(item) for item in response.json()]
        except (ValueError, ValidationError) as exc:
            raise TunecacheError(f"unexpected answer from {self.base_url}: {str(exc).splitlines()[0]}") from None

    def revoke_token(self, name: str) -> TokenRead:
        """``DELETE /v1/tokens/{name}`` (admin). Raises ServerError (404: no such token)."""
        return self._answer(self._request("DELETE", f"/v1/tokens/{name}"), TokenRead)

    def list_audit_events(self, limit: int = 100, before: int | None = None) -> AuditPage:
        """``GET /v1/audit`` (admin): writes, newest first."""
        params = {"limit": limit} | ({"before": before} if before else {})
        return self._answer(self._request("GET", "/v1/audit", params=params), AuditPage)

    def get_job(self, job_id: int) -> TuningJobRead:
        """``GET /v1/tuning-jobs/{id}``: status, stage, step/total, log tail, timings."""
        return self._answer(self._request("GET", f"/v1/tuning-jobs/{job_id}"), TuningJobRead)
