"""Bounds on requests: body sizes (HTTP 413), the wait for a body (HTTP 408), requests in
flight (HTTP 503 at once) and request rates per caller (HTTP 429)."""

from __future__ import annotations

import json
import math
import time

import anyio
import limits

from fastapi import HTTPException
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class RateLimit:
    """Requests of each caller at most ``rate`` (``limits``' notation, ``30/minute``), counted
    in this process's memory in a moving window (``limits``' ``MovingWindowRateLimiter``);
    ``what``: the requests counted, for the refusal (``tuning-job requests``)."""

    def __init__(self, rate: str, what: str):
        self.rate_text = rate
        self.rate = limits.parse(rate)
        self.what = what
        self.limiter = limits.strategies.MovingWindowRateLimiter(limits.storage.MemoryStorage())

    def check(self, token_name: str) -> None:
        """Count one request with token ``token_name`` (``RateLimiter.hit``); past the rate,
        answer 429 naming the token and the rate, with ``Retry-After`` the seconds until the
        window lets the token in again (``get_window_stats(...).reset_time``, at least 1).

        Raises:
            HTTPException: 429, the rate is used up for this token.
        """
        if not self.limiter.hit(self.rate, token_name):
            reset = self.limiter.get_window_stats(self.rate, token_name).reset_time
            raise HTTPException(429, detail=f"too many {self.what} with token {token_name!r}: at most {self.rate_text}",
                                headers={"Retry-After": str(max(1, math.ceil(reset - time.time())))})


class _BodyRefused(Exception):
    pass


class RequestBodyGuard:
    """ASGI middleware over a request's body, as it streams in:

    * **size** (413 with a JSON body): ``max_upload_bytes`` for artifact uploads
      (``PUT /v1/artifacts/...``), ``max_report_bytes`` for pod reports (``POST
      /v1/reports``; at most ``max_json_bytes``), ``max_json_bytes`` for every other route. A
      ``Content-Length`` above the limit is refused before the body is read; a body without
      one is counted as it streams in;
    * **time** (408 with a JSON body, the connection closed): a body that stops arriving (no
      piece of it for ``timeout_s``, ``TUNECACHE_BODY_TIMEOUT_SECONDS``). The timeout is
      between pieces (an upload over a slow link is not cut while it moves); once the body is
      complete, nothing is timed.

    Whatever the app makes of a body cut short (FastAPI answers 400 "error parsing the
    body"), the client gets the 413 or the 408, once. One wrapper of ``receive`` and
    ``send`` for both bounds: every request passes through it.
    """

    def __init__(self, app: ASGIApp, max_upload_bytes: int, max_json_bytes: int, max_report_bytes: int | None = None,
                 timeout_s: float = 30.0):
        self.app = app
        self.max_upload_bytes = max_upload_bytes
        self.max_json_bytes = max_json_bytes
        self.max_report_bytes = min(max_report_bytes or max_json_bytes, max_json_bytes)
        self.timeout_s = timeout_s
        self._timed_out = json.dumps({"detail": f"request body not received: nothing of it for {timeout_s:g} s "
                                                f"(setting TUNECACHE_BODY_TIMEOUT_SECONDS)"}).encode()

    def _limit(self, scope: Scope) -> tuple[int, str]:
        """The limit of this request's body and why: ``(bytes, "setting NAME")``."""
        if scope.get("method") == "PUT" and scope.get("path", "").startswith("/v1/artifacts/"):
            return self.max_upload_bytes, "setting TUNECACHE_MAX_UPLOAD_BYTES"
        if scope.get("method") == "POST" and scope.get("path", "") == "/v1/reports":
            return self.max_report_bytes, "the most a pod report may be"
        return self.max_json_bytes, "setting TUNECACHE_MAX_JSON_BYTES"

    @staticmethod
    async def _answer(send: Send, status: int, body: bytes, close: bool = False) -> None:
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status,
                    "headers": headers + ([(b"connection", b"close")] if close else [])})
        await send({"type": "http.response.body", "body": body})

    @staticmethod
    def _too_large(received: str, limit: int, why: str) -> bytes:
        return json.dumps({"detail": f"request body {received} exceeds the limit of {limit} bytes ({why})"}).encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        max_bytes, setting = self._limit(scope)
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > max_bytes:
            await self._answer(send, 413, self._too_large(f"of {int(declared)} bytes", max_bytes, setting))
            return
        seen = 0
        more_body = True
        refusal: tuple[int, bytes, bool] | None = None  # (status, body, close) once the body is refused
        answered = False

        async def guarded_receive() -> Message:
            nonlocal seen, more_body, refusal
            if not more_body:
                return await receive()  # the body is complete: this waits for a disconnect
            try:
                with anyio.fail_after(self.timeout_s):
                    message = await receive()
            except TimeoutError:
                refusal = (408, self._timed_out, True)
                raise _BodyRefused from None
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > max_bytes:
                    refusal = (413, self._too_large("streamed", max_bytes, setting), False)
                    raise _BodyRefused
            if message["type"] != "http.request" or not message.get("more_body", False):
                more_body = False
            return message

        async def answer_refusal() -> None:
            nonlocal answered
            if not answered:
                answered = True
                await self._answer(send, *refusal)

        async def guarded_send(message: Message) -> None:
            if refusal is not None:
                await answer_refusal()
                return
            await send(message)

        try:
            await self.app(scope, guarded_receive, guarded_send)
        except _BodyRefused:
            await answer_refusal()


class LoadShedding:
    """ASGI middleware: at most ``max_in_flight`` requests of this process being worked on at
    once; the next ones are answered at once with 503, a JSON body and ``Retry-After``,
    instead of queueing for threads and database connections they would wait seconds for.
    Clients (tunecache's own back off with jitter and obey ``Retry-After``) come back later.

    A request waiting on its client (for the next piece of its body, or for the client to
    take its answer) is not being worked on: it leaves the count while it waits, so slow
    clients cannot hold the service's capacity (they are bounded by the body and send
    timeouts instead: :class:`RequestBodyGuard`, :mod:`tunecache.service.connections`).
    """

    def __init__(self, app: ASGIApp, max_in_flight: int, retry_after_s: int):
        self.app = app
        self.max_in_flight = max_in_flight
        self.retry_after = str(retry_after_s).encode()
        self.in_flight = 0
        self._body = json.dumps({"detail": "the service is busy: try again after Retry-After seconds"}).encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.max_in_flight:
            await send({"type": "http.response.start", "status": 503, "headers": [
                (b"content-type", b"application/json"), (b"content-length", str(len(self._body)).encode()),
                (b"retry-after", self.retry_after)]})
            await send({"type": "http.response.body", "body": self._body})
            return

        more_body = True

        async def waiting_receive() -> Message:
            nonlocal more_body
            if not more_body:  # the body is complete: a wait for a disconnect, beside the work
                return await receive()
            self.in_flight -= 1
            try:
                message = await receive()
            finally:
                self.in_flight += 1
            if message["type"] != "http.request" or not message.get("more_body", False):
                more_body = False
            return message

        async def waiting_send(message: Message) -> None:
            self.in_flight -= 1
            try:
                await send(message)
            finally:
                self.in_flight += 1

        self.in_flight += 1  # one event loop per process: no lock needed
        try:
            await self.app(scope, waiting_receive, waiting_send)
        finally:
            self.in_flight -= 1


class AllowedHosts(TrustedHostMiddleware):
    """starlette's ``TrustedHostMiddleware`` (``TUNECACHE_ALLOWED_HOSTS``: a page of another
    site whose name was rebound to this service's address sends its own name as ``Host``),
    answering its 400 with a JSON body that names the host and the setting."""

    def __init__(self, app: ASGIApp, allowed_hosts: list[str]):
        async def allowed(scope: Scope, receive: Receive, send: Send) -> None:
            scope["tunecache.host_allowed"] = True
            await app(scope, receive, send)

        super().__init__(allowed, allowed_hosts=allowed_hosts, www_redirect=False)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return

        async def json_refusal(message: Message) -> None:
            if scope.get("tunecache.host_allowed"):
                await send(message)
            elif message["type"] == "http.response.start":
                host = dict(scope.get("headers", [])).get(b"host", b"").decode("latin-1")[:100]
                body = json.dumps({"detail": f"Host header {host!r} is not one this service answers to "
                                             f"(setting TUNECACHE_ALLOWED_HOSTS)"}).encode()
                await send({"type": "http.response.start", "status": 400, "headers": [
                    (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})

        await super().__call__(scope, receive, json_refusal)
