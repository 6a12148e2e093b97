"""Bounds on client connections, in the HTTP protocol ``tunecache serve`` gives uvicorn
(``uvicorn.run(http=...)``): what uvicorn's own settings do not bound.

uvicorn closes a connection idle after a response (``timeout_keep_alive``,
``TUNECACHE_KEEP_ALIVE_SECONDS``), but not one that never sends a request, nor one that
sends its request headers a byte at a time, nor one that never reads its answer; and any
one client address may hold every file descriptor of the process. :class:`GuardedHttpProtocol`
is uvicorn's own protocol (httptools, or h11 where httptools is missing) with:

* a new connection that sends nothing is closed after the keep-alive setting, like an
  idle one after a response;
* request headers must be complete within ``TUNECACHE_HEADER_TIMEOUT_SECONDS`` of their
  first byte: past it the connection gets 408 and is closed;
* an answer the client stops reading (the process's write buffer stays full) is dropped
  after ``TUNECACHE_SEND_TIMEOUT_SECONDS`` (the connection is reset), as is a connection
  the service closed whose last bytes the client never takes;
* one client address holds at most ``TUNECACHE_MAX_CONNECTIONS_PER_ADDRESS`` connections
  of a process; the next get 429 and are closed at once.

A slow request *body* is bounded in the app, where the request can be answered 408
(:class:`tunecache.service.limits.RequestBodyGuard`). All of these are per process.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from asyncio import TimerHandle
from typing import ClassVar

from uvicorn.protocols.http.auto import AutoHTTPProtocol

from tunecache.service.settings import Settings

log = logging.getLogger("tunecache")


@functools.cache
def _settings() -> Settings:
    """This process's settings (the environment ``tunecache serve`` wrote back), read once."""
    return Settings()


def _answer(status: str, detail: str) -> bytes:
    """A whole HTTP/1.1 answer with a JSON body that closes the connection."""
    body = json.dumps({"detail": detail}).encode()
    return (f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            f"connection: close\r\n\r\n").encode() + body


class GuardedHttpProtocol(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
    """uvicorn's HTTP/1.1 protocol with the bounds of this module's docstring."""

    #: Open connections of this process by client address (one event loop per process).
    open_by_address: ClassVar[dict[str, int]] = {}

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        settings = _settings()
        self.header_timeout = settings.header_timeout_seconds
        self.send_timeout = settings.send_timeout_seconds
        self.max_per_address = settings.max_connections_per_address
        self.address: str | None = None
        self.refused = False
        self.header_timer: TimerHandle | None = None
        self.header_cycle = None
        self.send_timer: TimerHandle | None = None

    # -- connections per address --------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.address = self.client[0] if self.client else None
        if self.address is not None:
            count = self.open_by_address.get(self.address, 0) + 1
            self.open_by_address[self.address] = count
            if count > self.max_per_address:
                self.refused = True
                if count == self.max_per_address + 1:
                    log.warning("client %s holds %d connections (TUNECACHE_MAX_CONNECTIONS_PER_ADDRESS): "
                                "refusing more with 429", self.address, self.max_per_address)
                transport.write(_answer("429 Too Many Requests", (
                    f"too many connections from {self.address}: at most {self.max_per_address} per process "
                    f"(setting TUNECACHE_MAX_CONNECTIONS_PER_ADDRESS)")))
                self._close()
                return
        # a new connection that sends nothing is idle: closed after the keep-alive setting
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self.header_timer, self.send_timer):
            if timer is not None:
                timer.cancel()
        self.header_timer = self.send_timer = None
        if self.address is not None:
            left = self.open_by_address.get(self.address, 1) - 1
            if left > 0:
                self.open_by_address[self.address] = left
            else:
                self.open_by_address.pop(self.address, None)
            self.address = None
        super().connection_lost(exc)

    # -- slow request headers -----------------------------------------------------------
    def _waiting_for_request(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return  # answered 429 already; what it sends is not read
        waiting, before = self._waiting_for_request(), self.cycle
        super().data_received(data)
        if self.header_timer is not None:
            if self.cycle is not self.header_cycle:  # the headers are complete: a new request cycle
                self.header_timer.cancel()
                self.header_timer = None
        elif waiting and self.cycle is before and not self.transport.is_closing():
            # the first bytes of a request whose headers are not complete yet
            self.header_cycle = before
            self.header_timer = self.loop.call_later(self.header_timeout, self._headers_too_slow)

    def _headers_too_slow(self) -> None:
        self.header_timer = None
        if self.transport.is_closing():
            return
        self.transport.write(_answer("408 Request Timeout", (
            f"request headers not complete within {self.header_timeout:g} s (setting TUNECACHE_HEADER_TIMEOUT_SECONDS)")))
        self._close()

    # -- answers the client does not read -------------------------------------------------
    def pause_writing(self) -> None:
        super().pause_writing()
        if self.send_timer is None:
            self.send_timer = self.loop.call_later(self.send_timeout, self._client_not_reading)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self.send_timer is not None:
            self.send_timer.cancel()
            self.send_timer = None

    def _client_not_reading(self) -> None:
        self.send_timer = None
        log.info("client %s read nothing of its answer for %g s (TUNECACHE_SEND_TIMEOUT_SECONDS): connection reset",
                 self.address, self.send_timeout)
        self.transport.abort()

    def _close(self) -> None:
        """Close the connection; reset it if the client has not taken the last bytes within
        the send timeout (a closing transport waits for its buffer to drain first)."""
        self.transport.close()
        if self.send_timer is None:
            self.send_timer = self.loop.call_later(self.send_timeout, self._client_not_reading)

    def timeout_keep_alive_handler(self) -> None:
        super().timeout_keep_alive_handler()
        self._close()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.transport.is_closing() and self.send_timer is None:
            # uvicorn closed it (Connection: close); the answer may still be in the buffer
            self.send_timer = self.loop.call_later(self.send_timeout, self._client_not_reading)
