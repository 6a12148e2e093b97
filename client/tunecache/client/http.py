"""HTTP client of the tunecache service (httpx): the HTTP implementation of
:class:`tunecache.store.TuningStore`. Answers are the contract's models
(:mod:`tunecache.contract`), never dicts; failures are typed errors a CLI maps to exit codes.

A pod must never hang or crash at boot because of tunecache, so every request has a
connect and a read timeout and a total deadline per attempt, and transient failures
(connection refused or reset, timeouts, truncated bodies, 429/502/503/504) are retried a
bounded number of times with jittered exponential backoff (tenacity), waiting at least
what a server's ``Retry-After`` asks (up to ``max_retry_after_s``), before the typed error
is raised.

A pod's install (:func:`tunecache.client.install.fetch_tuning`: the lookup and every
artifact download) also has one deadline for the whole, ``install_deadline_s``
(``TUNECACHE_INSTALL_DEADLINE``, 30 s): every request in it shares that deadline
(:meth:`TunecacheClient.deadline_scope`), and when it passes the install gives up with
:class:`InstallDeadlineExceeded` before anything is written.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import contextlib
import hashlib
import ipaddress
import json
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, TypeAdapter, ValidationError
from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_after_attempt, wait_random_exponential

from tunecache.client.settings import ClientSettings
from tunecache.formats.tarball import max_unpack_bytes, positive_whole_setting
from tunecache.contract import (
    ArtifactStored,
    AuditPage,
    Scope,
    TokenCreate,
    TokenCreated,
    TokenRead,
    EnvironmentMetadata,
    FLEET_PAGE_DEFAULT,
    FLEET_PAGE_MAX,
    FleetView,
    JobConflict,
    LookupMiss,
    LookupRequest,
    TuningJobCreate,
    TuningJobRead,
    WorkerList,
    PodReportCreate,
    TuningKey,
    TuningRunCreate,
    TuningRunPage,
    TuningRunQuery,
    TuningRunRead,
    RunSignature,
    RunVerification,
    PromoteRequest,
    TuningRunDiff,
)
from tunecache.store import NoCompatibleTuning, TunecacheError, file_sha256

Answer = TypeVar("Answer", bound=BaseModel)

#: Seconds to connect, and to wait for each read, by default.
DEFAULT_CONNECT_TIMEOUT_S = 5.0
DEFAULT_READ_TIMEOUT_S = 30.0
#: Attempts per request (1 = no retry) and the backoff between them (0.5 s, 1 s, 2 s, ... at most 4 s).
DEFAULT_ATTEMPTS = 3
#: Seconds one request may take in all (every attempt, and the waits between them), however
#: the server trickles its answer or holds back its first byte.
DEFAULT_TOTAL_TIMEOUT_S = 120.0
#: The most seconds a server's ``Retry-After`` is obeyed by default.
DEFAULT_MAX_RETRY_AFTER_S = 30.0
#: Seconds an idle connection is kept for the next request: below the service's own
#: keep-alive (``TUNECACHE_KEEP_ALIVE_SECONDS``, 5 s by default), so that the client never
#: reuses a connection the service is closing at that moment (a reset, then a retry).
KEEPALIVE_EXPIRY_S = 2.0
#: Seconds one install (the lookup and every artifact download together) may take, by default.
DEFAULT_INSTALL_DEADLINE_S = 30.0
#: Seconds one install report may take in all (``TUNECACHE_REPORT_TIMEOUT``), by default.
DEFAULT_REPORT_TIMEOUT_S = 2.0
#: A failure this close to the install deadline (seconds) is the deadline's doing.
_DEADLINE_SLACK_S = 0.05
_RETRY_STATUSES = frozenset({429, 502, 503, 504})
#: Answers that send an artifact download elsewhere (the object store's presigned URL).
_REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})


class ServerUnreachable(TunecacheError):
    """No connection, or the server did not answer in time."""


class InstallDeadlineExceeded(ServerUnreachable):
    """The install deadline (``TUNECACHE_INSTALL_DEADLINE``) passed before the lookup and
    every download were done: the server did not answer, or answered too slowly. Raised
    before anything is written, never retried. A :class:`ServerUnreachable`, so whoever
    handles that handles this too (the CLI: exit 4)."""


class ServerError(TunecacheError):
    """The server answered with an error status (other than a lookup's 404)."""

    def __init__(self, status_code: int, detail: Any):
        shown = " ".join(str(detail).split())  # one line, however the server formats it
        super().__init__(f"server answered {status_code}: {shown[:300]}{'...' if len(shown) > 300 else ''}")
        self.status_code = status_code
        self.detail = detail
        #: A record's 422 for artifacts whose bytes are not stored: their sha256 (else empty).
        self.missing: list[str] = []


class JobConflictError(ServerError):
    """409 of ``POST /v1/tuning-jobs``: a job for the key is already queued or running with
    other options; ``conflict`` names the job and each difference."""

    def __init__(self, conflict: JobConflict):
        super().__init__(409, conflict.detail)
        self.conflict = conflict


class ArtifactCorrupt(TunecacheError):
    """Downloaded bytes do not hash to the sha256 the server announced."""


class DownloadTruncated(ArtifactCorrupt):
    """The connection closed before the whole body arrived."""


class AnswerTooLarge(ArtifactCorrupt):
    """An answer went past its byte bound (:func:`max_answer_bytes` for JSON answers,
    ``TUNECACHE_MAX_UNPACK_BYTES`` for an artifact); nothing of it is used."""


#: Default of ``TUNECACHE_MAX_ANSWER_BYTES``.
DEFAULT_MAX_ANSWER_BYTES = 16 << 20


def max_answer_bytes() -> int:
    """``TUNECACHE_MAX_ANSWER_BYTES`` (a positive whole number), else 16 MiB: the most a
    JSON answer (a lookup, a run, a page of runs) may take, as decoded."""
    return positive_whole_setting("TUNECACHE_MAX_ANSWER_BYTES", DEFAULT_MAX_ANSWER_BYTES)


class _Transient(Exception):
    """A failure worth another attempt; carries the error to raise when attempts run out,
    and the seconds the server asked to wait (``Retry-After``), if it did."""

    def __init__(self, error: TunecacheError, retry_after_s: float | None = None):
        super().__init__(str(error))
        self.error = error
        self.retry_after_s = retry_after_s


class _NoTimeToRetry(Exception):
    """The next attempt would start past the install deadline or the request's total
    timeout (``why`` names which): give up with ``transient``'s error after ``attempts``
    attempts."""

    def __init__(self, transient: _Transient, attempts: int, why: str):
        super().__init__(str(transient))
        self.transient = transient
        self.attempts = attempts
        self.why = why


def _shut_down(sock: socket.socket) -> None:
    """Shut a connection's socket down (from another thread: a blocked read returns at once)."""
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:  # already closed
        pass


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


def reports_enabled_by_environment() -> bool:
    """``TUNECACHE_REPORT`` as pydantic reads a boolean (unset: ``True``; a value that is not
    a boolean: ``False``), for clients not made from :class:`ClientSettings`."""
    value = next((v for k, v in os.environ.items() if k.upper() == "TUNECACHE_REPORT"), None)
    if value is None:
        return True
    try:
        return TypeAdapter(bool).validate_python(value)
    except ValidationError:
        return False


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
        total_timeout_s: the most one request may take, end to end, every attempt and the
            waits between them together (120 s): the wait for the first byte and each read
            are clipped to it, a body still arriving when it passes is cut off (a server
            that sends a byte now and then never trips a read timeout), and no retry is
            started that would begin after it.
        max_retry_after_s: the longest a server's ``Retry-After`` is obeyed (30 s).
        install_deadline_s: seconds one install may take in all, every request and wait
            of it together (30 s; ``None``: no such deadline); applies inside
            :meth:`deadline_scope`, which :func:`tunecache.client.install.fetch_tuning`
            opens. The per-attempt timeouts and attempts above still hold within it.
        token: sent as ``Authorization: Bearer <token>`` on every request.
        ca_bundle: CA certificates (PEM file) to verify an https server with; TLS is always
            verified (default: the system's CAs).
        allow_insecure: allow ``token`` over plain ``http://`` to a host that is not loopback.
        reports: whether installs made with this client report to the server (see
            :mod:`tunecache.client.report`); ``None``: as ``TUNECACHE_REPORT`` says.
        report_timeout_s: seconds one report may take in all (2 s).
        transport: an httpx transport (tests).

    Raises:
        InsecureTransport: a token would travel in clear text to another machine
            (``http://`` to a non-loopback host without ``allow_insecure``).
        ValueError: ``base_url`` is not an http(s) URL with a host; ``ca_bundle`` is not a
            file of PEM certificates; ``install_deadline_s`` is not above 0.
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
        install_deadline_s: float | None = DEFAULT_INSTALL_DEADLINE_S,
        token: str | None = None,
        ca_bundle: Path | None = None,
        allow_insecure: bool = False,
        reports: bool | None = None,
        report_timeout_s: float = DEFAULT_REPORT_TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
    ):
        if install_deadline_s is not None and not install_deadline_s > 0:
            raise ValueError(f"install deadline {install_deadline_s!r} s must be above 0")
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
        self.reports = reports_enabled_by_environment() if reports is None else reports
        self.report_timeout_s = report_timeout_s
        # what a reporting client (another thread's) is made with: the same server, token and TLS
        self._connection_options: dict[str, Any] = dict(token=token, ca_bundle=ca_bundle, allow_insecure=allow_insecure,
                                                        transport=transport)
        self.attempts = max(1, attempts)
        self.read_timeout_s = read_timeout_s
        self.total_timeout_s = total_timeout_s
        self.max_retry_after_s = max_retry_after_s
        self.install_deadline_s = install_deadline_s
        self._deadline: float | None = None  # monotonic seconds, inside a deadline_scope
        self._deadline_s: float | None = None  # the seconds that scope was opened with
        self._request_end: float | None = None  # monotonic seconds: the total timeout of the request under way
        timeout = self._timeout = httpx.Timeout(read_timeout_s, connect=connect_timeout_s)
        headers = {"Authorization": f"Bearer {token}"} if token else None
        try:
            verify = ssl.create_default_context(cafile=str(ca_bundle)) if ca_bundle is not None else True
        except (ssl.SSLError, OSError) as exc:
            raise ValueError(f"TUNECACHE_CA_BUNDLE={str(ca_bundle)!r} holds no usable PEM certificates: {exc}") from None
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout, transport=transport, headers=headers,
                                  verify=verify, limits=httpx.Limits(keepalive_expiry=KEEPALIVE_EXPIRY_S))

    @classmethod
    def from_settings(cls, settings: ClientSettings, url: str | None = None, **kwargs: Any) -> "TunecacheClient":
        """A client for ``url`` (default ``settings.url``) with the settings' timeouts,
        attempts, install deadline, token (:meth:`ClientSettings.resolved_token`) and TLS settings.

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
            install_deadline_s=settings.install_deadline,
            token=settings.resolved_token(),
            ca_bundle=settings.ca_bundle,
            allow_insecure=settings.allow_insecure,
            reports=settings.report,
            report_timeout_s=settings.report_timeout,
            **kwargs,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "TunecacheClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def deadline_scope(self, seconds: float | None = None) -> Iterator[None]:
        """One deadline for every request made in the ``with`` block: ``seconds`` from now
        (default ``install_deadline_s``; with both ``None``, no deadline).

        Each request's connect, read, write and pool timeouts are clipped to the seconds
        left, a body still arriving when the deadline comes is cut off (however the server
        trickles it), and no retry is started that would begin after it (a ``Retry-After``
        included: the last error is raised at once, naming the deadline). A scope opened
        inside another keeps the earlier deadline. A client is one thread's at a time.
        :func:`tunecache.client.install.fetch_tuning` opens one around each install.

        Raises:
            ValueError: ``seconds`` is not above 0.
            InstallDeadlineExceeded: (from a request inside) the deadline passed first.
        """
        seconds = self.install_deadline_s if seconds is None else seconds
        if seconds is not None and not seconds > 0:
            raise ValueError(f"install deadline {seconds!r} s must be above 0")
        outer = self._deadline, self._deadline_s
        if seconds is not None:
            end = time.monotonic() + seconds
            if self._deadline is None or end < self._deadline:
                self._deadline, self._deadline_s = end, seconds
        try:
            yield
        finally:
            self._deadline, self._deadline_s = outer

    def _deadline_passed(self) -> bool:
        return self._deadline is not None and time.monotonic() >= self._deadline - _DEADLINE_SLACK_S

    def _deadline_error(self, method: str, path: str, answered: bool) -> InstallDeadlineExceeded:
        what = "answered too slowly" if answered else "did not answer"
        return InstallDeadlineExceeded(f"gave up after {self._deadline_s:g} s (TUNECACHE_INSTALL_DEADLINE): "
                                       f"tunecache server {self.base_url} {what} ({method} {path})")

    def _total_timeout_error(self, answered: bool) -> ServerUnreachable:
        what = "answered too slowly: no complete answer" if answered else "sent no answer"
        return ServerUnreachable(f"tunecache server {self.base_url} {what} within {self.total_timeout_s:g} s "
                                 f"(TUNECACHE_TOTAL_TIMEOUT)")

    def _attempt_window(self, method: str, path: str) -> tuple[float, httpx.Timeout]:
        """When one attempt must be over (monotonic seconds: the request's total timeout,
        ``total_timeout_s`` after its first attempt began, or the install deadline if
        sooner) and its httpx timeouts, clipped to that."""
        now = time.monotonic()
        end = self._request_end if self._request_end is not None else now + self.total_timeout_s
        if self._deadline is not None and self._deadline <= end:
            end = self._deadline
            if end - now <= _DEADLINE_SLACK_S:  # the install's earlier requests used it up
                raise self._deadline_error(method, path, answered=True)
        left = end - now
        if left <= _DEADLINE_SLACK_S:  # the request's earlier attempts used it up
            raise self._total_timeout_error(answered=True)

        def clip(seconds: float | None) -> float:
            return left if seconds is None else min(seconds, left)

        t = self._timeout
        return end, httpx.Timeout(connect=clip(t.connect), read=clip(t.read), write=clip(t.write), pool=clip(t.pool))

    def _failed(self, exc: httpx.HTTPError, method: str, path: str, end: float, answered: bool,
                where: str | None = None) -> Exception:
        """What an attempt ending in ``exc`` raises: the install deadline's or the total
        timeout's error when ``end`` (the attempt's, from :meth:`_attempt_window`) has come,
        else a :class:`_Transient` worth another attempt."""
        if self._deadline_passed():
            return self._deadline_error(method, path, answered)
        if time.monotonic() >= end - _DEADLINE_SLACK_S:
            return self._total_timeout_error(answered)
        return _Transient(self._classify(exc, where))

    @contextlib.contextmanager
    def _cut_at_deadline(self, response: httpx.Response, end: float) -> Iterator[None]:
        """While a body is read, shut its connection down when ``end`` comes (the attempt's:
        the install deadline or the request's total timeout): httpx's read timeout counts
        per read, so a read begun before then could otherwise wait a whole read timeout past it."""
        stream = response.extensions.get("network_stream")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if not isinstance(sock, socket.socket):  # not a socket (test transports)
            yield
            return
        timer = threading.Timer(max(0.0, end - time.monotonic()), _shut_down, (sock,))
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()

    def _exchange(self, method: str, path: str, read: Callable[[httpx.Response, float], Any], *,
                  elsewhere: httpx.URL | None = None, **kwargs: Any) -> Any:
        """One attempt: send the request (timeouts clipped to the install deadline) and
        return ``read(response, end)`` of the streamed response, ``end`` being when the
        attempt must be over (monotonic seconds).

        ``elsewhere``: an absolute http(s) URL of another host (an object store's presigned
        URL) asked instead of ``path``, without the token: the ``Authorization`` header is
        the service's, never sent to anyone else.

        Raises:
            _Transient: an httpx error (classified), worth another attempt.
            InstallDeadlineExceeded: the install deadline passed first.
            ServerUnreachable: the request's total timeout passed first.
            Whatever ``read`` raises.
        """
        end, timeout = self._attempt_window(method, path)
        answered = False
        try:
            if elsewhere is None:
                streamed = self._http.stream(method, path, timeout=timeout, **kwargs)
            else:
                request = self._http.build_request(method, elsewhere, timeout=timeout, **kwargs)
                request.headers.pop("Authorization", None)
                streamed = contextlib.closing(self._http.send(request, stream=True))
            with streamed as response:
                answered = True
                with self._cut_at_deadline(response, end):
                    return read(response, end)
        except httpx.HTTPError as exc:
            where = f"artifact store {elsewhere.scheme}://{elsewhere.netloc.decode()}" if elsewhere is not None else None
            raise self._failed(exc, method, path, end, answered, where) from None

    def _classify(self, exc: httpx.HTTPError, where: str | None = None) -> TunecacheError:
        """Name the failure a pod hit, in words an operator can act on."""
        where = where or f"tunecache server {self.base_url}"
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
        (capped at ``max_retry_after_s``). Raises :class:`_NoTimeToRetry` when the next
        attempt would start past the install deadline or the request's total timeout."""
        backoff = wait_random_exponential(multiplier=0.5, max=4)(state)
        failure = state.outcome.exception() if state.outcome is not None else None
        wait = backoff
        if isinstance(failure, _Transient) and failure.retry_after_s is not None:
            wait = max(backoff, min(failure.retry_after_s, self.max_retry_after_s))
        limits = []
        if self._deadline is not None:
            limits.append((self._deadline, f"the {self._deadline_s:g} s TUNECACHE_INSTALL_DEADLINE"))
        if self._request_end is not None:
            limits.append((self._request_end, f"the {self.total_timeout_s:g} s TUNECACHE_TOTAL_TIMEOUT"))
        if isinstance(failure, _Transient) and limits and state.attempt_number < self.attempts:
            end, why = min(limits)
            if time.monotonic() + wait >= end - _DEADLINE_SLACK_S:
                raise _NoTimeToRetry(failure, state.attempt_number, why)
        return wait

    def _retrying(self, attempt_once):
        """Run ``attempt_once`` with retries for :class:`_Transient`, every attempt within
        the request's total timeout (``total_timeout_s`` from now); raise its error at the end."""
        outer = self._request_end
        if outer is None:
            self._request_end = time.monotonic() + self.total_timeout_s
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
        except _NoTimeToRetry as stop:
            error = stop.transient.error
            error.args = (f"{error} (after {stop.attempts} of {self.attempts} attempts: the next would start past "
                          f"{stop.why})",)
            raise error from None
        finally:
            self._request_end = outer

    def _read_body(self, response: httpx.Response, deadline: float, sink=None, max_bytes: int | None = None) -> bytes:
        """Read a streamed body before ``deadline`` (monotonic seconds: the attempt's end,
        the install deadline's if sooner); ``sink`` sees each part. At most ``max_bytes``
        (as decoded: a gzip'd answer is counted as it expands; default
        :func:`max_answer_bytes`) are read.

        Raises:
            InstallDeadlineExceeded: the install deadline came first.
            ServerUnreachable: the request's total timeout (``total_timeout_s``) did.
            AnswerTooLarge: the body went past ``max_bytes``.
        """
        limit = max_answer_bytes() if max_bytes is None else max_bytes
        parts, size = [], 0
        for part in response.iter_bytes():
            size += len(part)
            if size > limit:
                raise AnswerTooLarge(f"tunecache server {self.base_url} sent more than {limit:,} bytes for "
                                     f"{response.request.method} {response.request.url.path} "
                                     f"({'TUNECACHE_MAX_UNPACK_BYTES' if max_bytes is not None else 'TUNECACHE_MAX_ANSWER_BYTES'})")
            if time.monotonic() > deadline:
                if self._deadline_passed():
                    raise self._deadline_error(response.request.method, response.request.url.path, answered=True)
                raise self._total_timeout_error(answered=True)
            if sink is not None:
                sink(part)
            parts.append(part)
        return b"".join(parts)

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        def once() -> httpx.Response:
            response, body = self._exchange(method, path, lambda response, end: (response, self._read_body(response, end)),
                                            **kwargs)
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

    def lookup(self, key: TuningKey, environment: EnvironmentMetadata, variant: str | None = None) -> TuningRunRead:
        """``POST /v1/tunings/lookup``: the current tuning run for this key and environment
        (with ``variant``: that engine variant's current run where it has one, else the key's).

        Raises:
            NoCompatibleTuning: 404, with the closest stored tunings and their differences.
            InstallDeadlineExceeded: inside :meth:`deadline_scope`, the deadline passed first.
            ServerUnreachable, ServerError.
        """
        request = LookupRequest(key=key, environment=environment, variant=variant)
        response = self._request("POST", "/v1/tunings/lookup", content=request.model_dump_json(exclude_none=True),
                                 headers={"Content-Type": "application/json"})
        if response.status_code == 404:
            try:
                miss = LookupMiss.model_validate_json(response.content)
            except ValidationError:
                raise ServerError(404, _detail(response)) from None
            raise NoCompatibleTuning(miss)
        return self._answer(response, TuningRunRead)

    def list_runs(self, query: TuningRunQuery = TuningRunQuery()) -> TuningRunPage:
        """``GET /v1/tunings``: one page of the tuning history, newest first, filtered as
        ``query`` says (any key or environment field, status, trigger, ``since``/``until``,
        ``current_only``); from ``query.cursor`` (a page's ``next_cursor``) or ``offset``.

        Raises:
            ServerError: 422 naming an invalid parameter; ServerUnreachable.
        """
        params = query.model_dump(mode="json", exclude_defaults=True, exclude={"format"})
        return self._answer(self._request("GET", "/v1/tunings", params=params), TuningRunPage)

    def iter_runs(self, query: TuningRunQuery = TuningRunQuery()) -> Iterator[TuningRunRead]:
        """Every run matching ``query``'s filters, newest first, page after page
        (``query.limit`` per request) by cursor: each run once, also while runs are
        recorded meanwhile (those come before the first page and are not listed).

        Raises:
            as :meth:`list_runs`.
        """
        page = self.list_runs(query)
        while True:
            yield from page.items
            if page.next_cursor is None:
                return
            page = self.list_runs(query.model_copy(update={"cursor": page.next_cursor, "offset": 0}))

    def export_runs_csv(self, query: TuningRunQuery, write: Callable[[bytes], Any]) -> None:
        """``GET /v1/tunings?format=csv``: every run matching ``query``'s filters (from its
        cursor on) as CSV, header first, handed to ``write`` part by part as it arrives
        (never whole in memory). One attempt: a retry would repeat what was written.

        Raises:
            ServerError: 422 naming an invalid parameter, other error statuses;
            ServerUnreachable (also when the answer stops short).
        """
        params = query.model_dump(mode="json", exclude_defaults=True, exclude={"limit", "offset", "format"})
        params["format"] = "csv"

        def read(response: httpx.Response, deadline: float) -> None:
            if response.is_error:
                raise ServerError(response.status_code, _detail_of(self._read_body(response, deadline)))
            self._read_body(response, deadline, sink=write)

        try:
            self._exchange("GET", "/v1/tunings", read, params=params)
        except _Transient as transient:
            raise transient.error from None

    def fleet(self, hours: float = 24, *, limit: int = FLEET_PAGE_DEFAULT, offset: int = 0,
              wanted_limit: int = FLEET_PAGE_DEFAULT, wanted_offset: int = 0) -> FleetView:
        """``GET /v1/fleet``: one page of the fleet view over the last ``hours``: at most
        ``limit`` keys (1-1000) from ``offset`` (0-based) of ``total_keys``, with their
        current runs and hit rates, most reports first; at most ``wanted_limit`` tunings
        pods want (miss reports without a current tuning) from ``wanted_offset`` of
        ``total_wanted``, most pods first. :meth:`fleet_all` walks every page.

        Raises:
            ServerError: 422 naming a bad ``hours``, limit or offset; 404 from a server
                older than the route; ServerUnreachable.
        """
        params = {"hours": hours, "limit": limit, "offset": offset, "wanted_limit": wanted_limit,
                  "wanted_offset": wanted_offset}
        return self._answer(self._request("GET", "/v1/fleet", params=params), FleetView)

    def fleet_all(self, hours: float = 24, page_size: int = FLEET_PAGE_MAX) -> FleetView:
        """The whole fleet view over the last ``hours``: pages of ``page_size`` keys and
        ``page_size`` wanted tunings (both lists in the same requests), request after
        request until both are listed, put into one :class:`FleetView`: ``offset`` 0,
        ``limit`` and ``wanted_limit`` the rows asked for in all, ``since`` and
        ``generated_at`` of the first page, ``total_keys`` and ``total_wanted`` of the last.

        The pages are read one after another, not at one instant: a key whose report count
        changes meanwhile may move between pages; one seen twice is listed once (its first
        row), one that moved to a page already read is missed (then fewer rows than the
        totals).

        Raises:
            as :meth:`fleet`.
        """
        pages = [self.fleet(hours, limit=page_size, wanted_limit=page_size)]
        while (len(pages) * page_size < max(pages[-1].total_keys, pages[-1].total_wanted)
               and (pages[-1].keys or pages[-1].wanted)):
            start = len(pages) * page_size
            pages.append(self.fleet(hours, limit=page_size, offset=start, wanted_limit=page_size, wanted_offset=start))
        keys = {}
        wanted = {}
        for page in pages:
            for row in page.keys:
                keys.setdefault(row.key.key_hash(), row)
            for want in page.wanted:
                wanted.setdefault((want.key.key_hash(), want.environment_hash), want)
        first, last = pages[0], pages[-1]
        asked = len(pages) * page_size
        return FleetView(hours=first.hours, since=first.since, generated_at=first.generated_at,
                         total_keys=last.total_keys, limit=asked, offset=0, keys=list(keys.values()),
                         total_wanted=last.total_wanted, wanted_limit=asked, wanted_offset=0,
                         wanted=list(wanted.values()))

    def send_report(self, report: PodReportCreate) -> None:
        """``POST /v1/reports``: tell the server what an install came to (202: taken, stored
        in a batch within the server's ``TUNECACHE_REPORT_FLUSH_SECONDS``). Installs
        send it in the background (:mod:`tunecache.client.report`), through a
        :meth:`reporting_client`.

        Raises:
            ServerError: 422 naming the invalid field, 429 past the server's report rate,
                503 when the server holds too many reports not yet stored, other error
                statuses; ServerUnreachable.
        """
        response = self._request("POST", "/v1/reports", content=report.model_dump_json(exclude_none=True),
                                 headers={"Content-Type": "application/json"})
        if response.is_error:
            raise ServerError(response.status_code, _detail(response))

    def reporting_client(self) -> "TunecacheClient":
        """A client for sending one report from another thread: this client's server,
        token and TLS, one attempt, and every timeout (and its deadline) at
        ``report_timeout_s``. The caller closes it."""
        timeout = self.report_timeout_s
        return TunecacheClient(self.base_url, connect_timeout_s=timeout, read_timeout_s=timeout, total_timeout_s=timeout,
                               attempts=1, max_retry_after_s=0, install_deadline_s=timeout, reports=False,
                               report_timeout_s=timeout, **self._connection_options)

    def get_run(self, run_id: int) -> TuningRunRead:
        """``GET /v1/tunings/{id}``: one run. Raises ServerError (404 when there is none)."""
        return self._answer(self._request("GET", f"/v1/tunings/{run_id}"), TuningRunRead)

    def diff_runs(self, run_a: int, run_b: int) -> TuningRunDiff:
        """``GET /v1/tunings/{run_a}/diff/{run_b}``: which entries of FlashInfer's autotune
        file run ``run_b`` added, removed or changed tactic in against run ``run_a``, with
        the recorded times (ms), margins and regression flags, and the counts.

        Raises:
            ServerError: 404 naming the missing run; 422 when a run has no readable
                FlashInfer autotune file (the detail says which and why).
            ServerUnreachable.
        """
        return self._answer(self._request("GET", f"/v1/tunings/{run_a}/diff/{run_b}"), TuningRunDiff)

    def download_artifact(self, sha256: str) -> bytes:
        """``GET /v1/artifacts/{sha256}``, streamed and verified against ``sha256``.

        A service whose artifacts are in an object store may answer with a redirect to a
        presigned URL of the store (``TUNECACHE_ARTIFACT_REDIRECT``): it is followed (one
        hop, to an http(s) URL only, without the ``Authorization`` header), within the same
        attempt, timeouts and install deadline, and the bytes are checked the same way. A
        store that refuses the URL (expired) or fails is retried from the service, which
        signs a new one.

        Raises:
            DownloadTruncated: the body stopped short (after retries).
            ArtifactCorrupt: the bytes hash to something else (nothing is returned).
            InstallDeadlineExceeded: inside :meth:`deadline_scope`, the deadline passed first.
            ServerUnreachable, ServerError.
        """
        where = f"/v1/artifacts/{sha256}"

        def once() -> bytes:
            digest = hashlib.sha256()

            def read(response: httpx.Response, deadline: float) -> tuple[str | None, bytes]:
                if response.status_code in _RETRY_STATUSES:
                    raise _status_error(response, _detail_of(self._read_body(response, deadline)))
                if response.is_error:
                    raise ServerError(response.status_code, _detail_of(self._read_body(response, deadline)))
                return response.headers.get("content-length"), self._read_body(response, deadline, sink=digest.update,
                                                                               max_bytes=max_unpack_bytes())

            def read_or_redirect(response: httpx.Response, deadline: float) -> tuple[str | None, bytes] | httpx.URL:
                if response.status_code in _REDIRECT_STATUSES:
                    return self._redirect_target(response, sha256)
                return read(response, deadline)

            def read_from_store(response: httpx.Response, deadline: float) -> tuple[str | None, bytes]:
                if response.status_code in _REDIRECT_STATUSES:
                    raise ServerError(response.status_code, f"the artifact store redirected {sha256} again: not followed")
                if response.is_error:  # an expired URL (403), a store failing: the service signs a new one
                    body = self._read_body(response, deadline, max_bytes=64 * 1024)
                    raise _Transient(ServerError(response.status_code,
                                                 f"artifact store answered {response.status_code} for {sha256}: "
                                                 f"{body[:200].decode(errors='replace')}"))
                return read(response, deadline)

            answer = self._exchange("GET", where, read_or_redirect)
            if isinstance(answer, httpx.URL):
                answer = self._exchange("GET", where, read_from_store, elsewhere=answer)
            expected, data = answer
            if expected is not None and len(data) != int(expected):
                raise _Transient(DownloadTruncated(f"artifact {sha256}: received {len(data)} of {expected} bytes"))
            if digest.hexdigest() != sha256:
                raise ArtifactCorrupt(f"artifact {sha256} arrived as {len(data)} bytes hashing to {digest.hexdigest()}")
            return data

        return self._retrying(once)

    def _redirect_target(self, response: httpx.Response, sha256: str) -> httpx.URL:
        """Where a redirect of an artifact download points (resolved against the service's
        URL).

        Raises:
            ServerError: no ``Location``, or one that is not an http(s) URL (never followed).
        """
        location = response.headers.get("location")
        try:
            target = response.request.url.join(location) if location else None
        except httpx.InvalidURL:
            target = None
        if target is None or target.scheme not in ("http", "https") or not target.host:
            raise ServerError(response.status_code, f"artifact {sha256}: redirect to {location!r} not followed "
                                                    "(only to an http or https URL)")
        return target

    def upload_file(self, path: Path, again: bool = False) -> str:
        """Upload a file's bytes streamed from disk (never whole in memory), unless the
        server already has them (``HEAD``; ``again``: uploaded without asking, for bytes a
        record found missing); returns the sha256.

        Raises:
            ServerUnreachable, ServerError.
        """
        sha256 = file_sha256(path)
        if not again and self._request("HEAD", f"/v1/artifacts/{sha256}").status_code == 200:
            return sha256

        def once() -> httpx.Response:
            where = f"/v1/artifacts/{sha256}"
            end, timeout = self._attempt_window("PUT", where)
            try:
                with path.open("rb") as f:
                    response = self._http.put(where, content=f, timeout=timeout)
            except httpx.HTTPError as exc:
                raise self._failed(exc, "PUT", where, end, answered=False) from None
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

    def record_run(self, run: TuningRunCreate, force: bool = False) -> TuningRunRead:
        """``POST /v1/tunings``: record a run whose artifacts were uploaded first; ``force``
        (admin): past the service's promotion policy. The answer's ``held`` says why a run
        did not become current.

        Raises:
            ServerError: 422 naming the field, or the artifacts never uploaded; 403 ``force``
                without an admin token; other errors.
            ServerUnreachable.
        """
        response = self._request("POST", "/v1/tunings" + ("?force=true" if force else ""), content=run.model_dump_json(),
                                 headers={"Content-Type": "application/json"})
        if response.status_code == 422:
            body = _json_object(response) or {}
            if isinstance(body.get("missing"), list):
                error = ServerError(422, _detail(response))
                error.missing = [str(sha) for sha in body["missing"]]
                raise error
        return self._answer(response, TuningRunRead)

    def record_verification(self, run_id: int, verification: RunVerification) -> TuningRunRead:
        """``PUT /v1/tunings/{id}/verification`` (tune): store a run's verification boot.

        Raises:
            ServerError: 404 no such run; 409 it did not succeed; 401/403 without a tune token.
            ServerUnreachable.
        """
        response = self._request("PUT", f"/v1/tunings/{run_id}/verification", content=verification.model_dump_json(),
                                 headers={"Content-Type": "application/json"})
        return self._answer(response, TuningRunRead)

    def promote_run(self, run_id: int, signature: RunSignature | None = None) -> TuningRunRead:
        """``POST /v1/tunings/{id}/promote`` (admin): make the run current for its key and
        environment (roll back to it, or take a run the promotion policy held); with
        ``signature``, the run's manifest signed anew (pods then take it as the newest).

        Raises:
            ServerError: 404 no such run; 409 it cannot be current (the detail says why);
                401/403 without an admin token.
            ServerUnreachable.
        """
        body = PromoteRequest(signature=signature).model_dump_json() if signature is not None else None
        response = self._request("POST", f"/v1/tunings/{run_id}/promote", content=body,
                                 headers={"Content-Type": "application/json"} if body else None)
        return self._answer(response, TuningRunRead)

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
                raise ServerError(409, _detail(response)) from None
            raise JobConflictError(conflict)
        return self._answer(response, TuningJobRead)

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

    def workers(self, gpu_name: str | None = None, arch: str | None = None) -> WorkerList:
        """``GET /v1/workers``: the GPU job workers seen in the last day (of ``gpu_name`` and
        ``arch`` when given), each with ``live``; :meth:`WorkerList.live_for` picks those
        that would take a job of a key.

        Raises:
            ServerUnreachable, ServerError (404 from a server older than the route).
        """
        params = {k: v for k, v in {"gpu_name": gpu_name, "arch": arch}.items() if v is not None}
        return self._answer(self._request("GET", "/v1/workers", params=params), WorkerList)

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
