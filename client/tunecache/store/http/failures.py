"""What a failed request of the HTTP store is called: a failure worth another attempt
(:class:`Transient`), the end of the attempts before a deadline (:class:`NoTimeToRetry`),
and an httpx error named in words an operator can act on (:func:`classified`); used by
:mod:`tunecache.store.http.transport` and the resources' clients."""

from __future__ import annotations

from typing import Any

import httpx

from tunecache.store import DownloadTruncated, ServerError, ServerUnreachable, TunecacheError
from tunecache.store.http.answers import retry_after_seconds


class Transient(Exception):
    """A failure worth another attempt; carries the error to raise when attempts run out,
    and the seconds the server asked to wait (``Retry-After``), if it did."""

    def __init__(self, error: TunecacheError, retry_after_s: float | None = None):
        super().__init__(str(error))
        self.error = error
        self.retry_after_s = retry_after_s


class NoTimeToRetry(Exception):
    """The next attempt would start past the install deadline or the request's total
    timeout (``why`` names which): give up with ``transient``'s error after ``attempts``
    attempts."""

    def __init__(self, transient: Transient, attempts: int, why: str):
        super().__init__(str(transient))
        self.transient = transient
        self.attempts = attempts
        self.why = why


def transient_status(response: httpx.Response, detail: Any) -> Transient:
    """A retry-worthy status as a :class:`Transient`, with the seconds its ``Retry-After`` asks."""
    return Transient(ServerError(response.status_code, detail), retry_after_seconds(response.headers.get("retry-after")))


def classified(exc: httpx.HTTPError, where: str, read_timeout_s: float) -> TunecacheError:
    """Name the failure a pod hit at ``where`` (the server, or the artifact store), in words an
    operator can act on."""
    if isinstance(exc, httpx.ConnectTimeout):
        return ServerUnreachable(f"{where} unreachable: no connection within the connect timeout")
    if isinstance(exc, httpx.ConnectError):
        return ServerUnreachable(f"{where} unreachable: {exc}")
    if isinstance(exc, httpx.ReadTimeout):
        return ServerUnreachable(f"{where} accepted the connection but sent no answer within {read_timeout_s:g} s")
    if isinstance(exc, httpx.RemoteProtocolError):
        return DownloadTruncated(f"{where} closed the connection before the whole answer arrived: {exc}")
    return ServerUnreachable(f"{where} unreachable: {type(exc).__name__}: {exc}")
