"""The transport of the HTTP client (httpx): one connection pool to one tunecache server,
and what every request of every API resource shares (:mod:`tunecache.store.http` composes
the resources' clients over it). Errors are the stores' (:mod:`tunecache.store`).

A pod must never hang or crash at boot because of tunecache, so every request has a
connect and a read timeout and a total deadline per attempt, and transient failures
(connection refused or reset, timeouts, truncated bodies, 429/502/503/504) are retried a
bounded number of times with jittered exponential backoff (tenacity), waiting at least
what a server's ``Retry-After`` asks (up to ``max_retry_after_s``), before the typed error
is raised. Every body is read against a byte bound (:func:`max_answer_bytes`) and before
the attempt's end, however a server trickles it.

A pod's install (:func:`tunecache.client.install.fetch_tuning`: the lookup and every
artifact download) also has one deadline for the whole, ``install_deadline_s``
(``TUNECACHE_INSTALL_DEADLINE``, 30 s): every request in it shares that deadline
(:meth:`Transport.deadline_scope`), and when it passes the install gives up with
:class:`InstallDeadlineExceeded` before anything is written. The seconds an artifact's body
spends arriving are not counted against it: a body is held to a deadline that measures its
progress instead (:mod:`tunecache.store.http.stall`).
"""

from __future__ import annotations

import contextlib
import ipaddress
import ssl
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError
from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_after_attempt, wait_random_exponential

from tunecache.store.http.answers import answer_detail
from tunecache.store.http.failures import NoTimeToRetry, Transient, classified, transient_status
from tunecache.store.http.stall import DownloadStalled, StallWatch, cut_at_deadline
from tunecache.formats.tarball import positive_whole_setting
from tunecache.store import (
    InstallDeadlineExceeded,
    ServerError,
    ServerUnreachable,
    AnswerTooLarge,
)

Answer = TypeVar("Answer", bound=BaseModel)
_Client = TypeVar("_Client", bound="Transport")

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
#: Statuses worth another attempt (the server's ``Retry-After`` obeyed).
RETRY_STATUSES = frozenset({429, 502, 503, 504})


#: Default of ``TUNECACHE_MAX_ANSWER_BYTES``.
DEFAULT_MAX_ANSWER_BYTES = 16 << 20


def max_answer_bytes() -> int:
    """``TUNECACHE_MAX_ANSWER_BYTES`` (a positive whole number), else 16 MiB: the most a
    JSON answer (a lookup, a run, a page of runs) may take, as decoded."""
    return positive_whole_setting("TUNECACHE_MAX_ANSWER_BYTES", DEFAULT_MAX_ANSWER_BYTES)


#: What a client tells of one artifact transfer as it goes (:attr:`Transport.on_transfer`):
#: ``(bytes done, bytes in all)``, ``(0, total)`` when it starts; ``total`` is ``None`` where
#: the other side does not say. A retried transfer starts again at 0.
TransferCallback = Callable[[int, int | None], None]


def _content_length(response: httpx.Response) -> int | None:
    """The body's announced size (``None``: not announced, or not a number)."""
    value = response.headers.get("content-length", "")
    return int(value) if value.isdigit() else None


class InsecureTransport(ValueError):
    """A token would travel in clear text (``http://``) to a host that is not loopback."""


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class Transport:
    """One tunecache server's connection, and how every request to it is made: timeouts,
    the total timeout per request, the install deadline (:meth:`deadline_scope`), retries,
    body bounds and the classification of failures. The base of every resource's client.

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
        token_source: where ``token`` comes from (or why there is none), named in a 401 or
            403's error (:meth:`error_of`), e.g. ``TUNECACHE_TOKEN``.
        ca_bundle: CA certificates (PEM file) to verify an https server with; TLS is always
            verified (default: the system's CAs).
        allow_insecure: allow ``token`` over plain ``http://`` to a host that is not loopback.
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
        token_source: str | None = None,
        ca_bundle: Path | None = None,
        allow_insecure: bool = False,
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
        # what another client of the same server, token and TLS is made with (a reporting client)
        self._connection_options: dict[str, Any] = dict(token=token, token_source=token_source, ca_bundle=ca_bundle,
                                                        allow_insecure=allow_insecure, transport=transport)
        self.token_source = token_source or ("a token given" if token else "no token")
        #: Told of each artifact's bytes as they are received or sent (:data:`TransferCallback`);
        #: ``None``: nobody is. Set by whoever shows progress (``tunecache pull``, ``push``).
        self.on_transfer: TransferCallback | None = None
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

    def close(self) -> None:
        self._http.close()

    def __enter__(self: _Client) -> _Client:
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
        else a :class:`Transient` worth another attempt."""
        if self._deadline_passed():
            return self._deadline_error(method, path, answered)
        if time.monotonic() >= end - _DEADLINE_SLACK_S:
            return self._total_timeout_error(answered)
        return Transient(classified(exc, where or f"tunecache server {self.base_url}", self.read_timeout_s))

    def _exchange(self, method: str, path: str, read: Callable[[httpx.Response, float], Any], *,
                  elsewhere: httpx.URL | None = None, watch: StallWatch | None = None, **kwargs: Any) -> Any:
        """One attempt: send the request (timeouts clipped to the install deadline) and
        return ``read(response, end)`` of the streamed response, ``end`` being when the
        attempt must be over (monotonic seconds).

        ``elsewhere``: an absolute http(s) URL of another host (an object store's presigned
        URL) asked instead of ``path``, without the token: the ``Authorization`` header is
        the service's, never sent to anyone else.

        ``watch``: an artifact's body, read under a deadline that measures progress
        (:mod:`tunecache.store.http.stall`): the seconds it moves at the rate are given back
        to the install deadline and the request's total timeout (they bound the waiting, not
        the bytes moving); it is cut off when it stalls.

        Raises:
            Transient: an httpx error (classified), worth another attempt.
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
                if watch is None:
                    with cut_at_deadline(response, end):
                        return read(response, end)
                return self._read_watched(response, read, watch)
        except httpx.HTTPError as exc:
            if watch is not None and watch.stalled is not None:
                raise Transient(DownloadStalled(watch.stalled)) from None
            where = f"artifact store {elsewhere.scheme}://{elsewhere.netloc.decode()}" if elsewhere is not None else None
            raise self._failed(exc, method, path, end, answered, where) from None

    def _read_watched(self, response: httpx.Response, read: Callable[[httpx.Response, float], Any],
                      watch: StallWatch) -> Any:
        """``read(response, inf)`` under ``watch`` (:meth:`_exchange`): the time the body moves
        at the rate is given back to the install deadline and the request's total timeout; it
        is cut off when it stalls or the (moved) deadline comes."""
        timeouts = response.request.extensions.get("timeout")
        if isinstance(timeouts, dict):  # read by the transport as the body starts to arrive
            timeouts["read"] = watch.window_s + 1
        watch.begin()
        with watch.guard(response, self.give_back):
            return read(response, float("inf"))

    def give_back(self, seconds: float) -> float:
        """Give ``seconds`` of moving bytes back to the install deadline and the request's total
        timeout (a body arriving at the rate, or another pod's download of an artifact this one
        waits for, :meth:`tunecache.client.node_cache.NodeCache.fetch`); returns the nearer end."""
        if self._deadline is not None:
            self._deadline += seconds
        if self._request_end is not None:
            self._request_end += seconds
        return min(self._deadline if self._deadline is not None else float("inf"),
                   self._request_end if self._request_end is not None else float("inf"))

    def _wait(self, state: RetryCallState) -> float:
        """Seconds before the next attempt: full-jitter exponential backoff (up to 0.5 s,
        1 s, 2 s, ... at most 4 s), or the server's ``Retry-After`` when it asked for longer
        (capped at ``max_retry_after_s``). Raises :class:`NoTimeToRetry` when the next
        attempt would start past the install deadline or the request's total timeout."""
        backoff = wait_random_exponential(multiplier=0.5, max=4)(state)
        failure = state.outcome.exception() if state.outcome is not None else None
        wait = backoff
        if isinstance(failure, Transient) and failure.retry_after_s is not None:
            wait = max(backoff, min(failure.retry_after_s, self.max_retry_after_s))
        limits = []
        if self._deadline is not None:
            limits.append((self._deadline, f"the {self._deadline_s:g} s TUNECACHE_INSTALL_DEADLINE"))
        if self._request_end is not None:
            limits.append((self._request_end, f"the {self.total_timeout_s:g} s TUNECACHE_TOTAL_TIMEOUT"))
        if isinstance(failure, Transient) and limits and state.attempt_number < self.attempts:
            end, why = min(limits)
            if time.monotonic() + wait >= end - _DEADLINE_SLACK_S:
                raise NoTimeToRetry(failure, state.attempt_number, why)
        return wait

    def _retrying(self, attempt_once):
        """Run ``attempt_once`` with retries for :class:`Transient`, every attempt within
        the request's total timeout (``total_timeout_s`` from now); raise its error at the end."""
        outer = self._request_end
        if outer is None:
            self._request_end = time.monotonic() + self.total_timeout_s
        try:
            for attempt in Retrying(
                stop=stop_after_attempt(self.attempts),
                wait=self._wait,
                retry=retry_if_exception_type(Transient),
                reraise=True,
            ):
                with attempt:
                    return attempt_once()
        except Transient as transient:
            error = transient.error
            if self.attempts > 1:
                error.args = (f"{error} (after {self.attempts} attempts)",)
            raise error from None
        except NoTimeToRetry as stop:
            error = stop.transient.error
            error.args = (f"{error} (after {stop.attempts} of {self.attempts} attempts: the next would start past "
                          f"{stop.why})",)
            raise error from None
        finally:
            self._request_end = outer

    def _read_body(self, response: httpx.Response, deadline: float, sink=None, max_bytes: int | None = None,
                   watch: StallWatch | None = None, keep: bool = True, transfer: bool = False) -> bytes:
        """Read a streamed body before ``deadline`` (monotonic seconds: the attempt's end,
        the install deadline's if sooner); ``sink`` sees each part. At most ``max_bytes``
        (as decoded: a gzip'd answer is counted as it expands; default
        :func:`max_answer_bytes`) are read. ``watch``: each part is counted by it (a stalled
        body raises :class:`~tunecache.store.http.stall.DownloadStalled`); ``keep=False``:
        the parts go to ``sink`` only and ``b""`` is returned (a body streamed to a file).
        ``transfer``: :attr:`on_transfer` is told of the body's bytes as they arrive.

        Raises:
            InstallDeadlineExceeded: the install deadline came first.
            ServerUnreachable: the request's total timeout (``total_timeout_s``) did.
            AnswerTooLarge: the body went past ``max_bytes``.
        """
        limit = max_answer_bytes() if max_bytes is None else max_bytes
        parts, size = [], 0
        told = self.on_transfer if transfer else None
        if told is not None:
            told(0, _content_length(response))
        for part in response.iter_bytes():
            size += len(part)
            if size > limit:
                raise AnswerTooLarge(f"tunecache server {self.base_url} sent more than {limit:,} bytes for "
                                     f"{response.request.method} {response.request.url.path} "
                                     f"({'TUNECACHE_MAX_UNPACK_BYTES' if max_bytes is not None else 'TUNECACHE_MAX_ANSWER_BYTES'})")
            if watch is not None:
                watch.saw(len(part))
            # watched: the guard gives moving time back every tick, so its last tick's worth is allowed
            if time.monotonic() > (deadline if watch is None else min(self._deadline or float("inf"),
                                                                      self._request_end or float("inf")) + 1.0):
                if self._deadline_passed():
                    raise self._deadline_error(response.request.method, response.request.url.path, answered=True)
                raise self._total_timeout_error(answered=True)
            if sink is not None:
                sink(part)
            if told is not None:
                told(size, _content_length(response))
            if keep:
                parts.append(part)
        return b"".join(parts)

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        def once() -> httpx.Response:
            response, body = self._exchange(method, path, lambda response, end: (response, self._read_body(response, end)),
                                            **kwargs)
            headers = [(k, v) for k, v in response.headers.items() if k.lower() not in ("content-encoding", "content-length")]
            response = httpx.Response(response.status_code, headers=headers, content=body, request=response.request)
            if response.status_code in RETRY_STATUSES:
                raise transient_status(response, answer_detail(response))
            return response

        return self._retrying(once)

    def error_of(self, status_code: int, detail: Any) -> ServerError:
        """The :class:`ServerError` of an error answer; a 401 or 403 also names the token sent
        (:attr:`token_source`), so that one line says which token the server refused."""
        error = ServerError(status_code, detail)
        if status_code in (401, 403):
            error.args = (f"{error} [token sent: {self.token_source}]",)
        return error

    def _answer(self, response: httpx.Response, model: type[Answer]) -> Answer:
        """The body of a successful answer as ``model``.

        Raises:
            ServerError: an error status, or a body that is not a ``model`` (not a tunecache server?).
        """
        if response.is_error:
            raise self.error_of(response.status_code, answer_detail(response))
        try:
            return model.model_validate_json(response.content)
        except ValidationError:
            raise ServerError(response.status_code, f"not a tunecache answer: {response.text[:200]!r}") from None
