"""The deadline of a download that measures progress, not a total.

A warm state's artifacts are big (a FlashInfer fused-MoE JIT module alone is hundreds of MB), so
the time a download takes says more about the wire than about the server, and one total for the
whole install cut moving downloads off. The install deadline (``TUNECACHE_INSTALL_DEADLINE``)
now counts the time an install waits, not the time its bytes move: while an artifact's body
arrives at ``TUNECACHE_MIN_DOWNLOAD_RATE`` bytes per second or more (64 KiB/s by default,
measured over the last ``TUNECACHE_STALL_TIMEOUT`` seconds, 10 by default), that time is given
back to the deadline (and to the request's total timeout). A server that does not answer, or
answers slower than that, still meets the deadline as before; and a body that stalls (fewer
bytes than that rate asks in a whole window) is cut off at once (:class:`DownloadStalled`,
retried while the deadline allows), whatever is left of the deadline.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from tunecache.formats.tarball import positive_whole_setting
from tunecache.store import InstallDeadlineExceeded

#: Default of ``TUNECACHE_STALL_TIMEOUT`` (seconds).
DEFAULT_STALL_TIMEOUT_S = 10
#: Default of ``TUNECACHE_MIN_DOWNLOAD_RATE`` (bytes per second).
DEFAULT_MIN_DOWNLOAD_RATE = 64 * 1024


def _shut_down(sock: socket.socket) -> None:
    """Shut a connection's socket down (from another thread: a blocked read returns at once)."""
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:  # already closed
        pass


@contextlib.contextmanager
def cut_at_deadline(response: Any, end: float) -> Iterator[None]:
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


class DownloadStalled(InstallDeadlineExceeded):
    """An artifact's body stopped moving (fewer bytes than ``TUNECACHE_MIN_DOWNLOAD_RATE`` asks in
    a window of ``TUNECACHE_STALL_TIMEOUT`` seconds): the install gives up as at its deadline
    (nothing is written; the CLI: exit 4)."""


def stall_timeout_s() -> float:
    """``TUNECACHE_STALL_TIMEOUT`` (a positive whole number of seconds), else 10."""
    return float(positive_whole_setting("TUNECACHE_STALL_TIMEOUT", DEFAULT_STALL_TIMEOUT_S))


def min_download_rate() -> int:
    """``TUNECACHE_MIN_DOWNLOAD_RATE`` (a positive whole number of bytes per second), else 64 KiB/s."""
    return positive_whole_setting("TUNECACHE_MIN_DOWNLOAD_RATE", DEFAULT_MIN_DOWNLOAD_RATE)


class StallWatch:
    """Watches one body as it arrives (:meth:`saw` each part) with the window and rate of the
    settings; :meth:`guard` gives back to the deadline the time the body moves at the rate, and
    shuts its connection down when it stalls or the deadline comes. ``received`` and
    ``seconds`` say what came."""

    def __init__(self, window_s: float | None = None, min_rate: int | None = None):
        self.window_s = stall_timeout_s() if window_s is None else window_s
        self.min_rate = min_download_rate() if min_rate is None else min_rate
        self.received = 0
        self.started = time.monotonic()
        self.stalled: str | None = None
        self._samples: list[tuple[float, int]] = [(self.started, 0)]  # (time, received): the last window's
        self._lock = threading.Lock()

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.started

    def begin(self) -> None:
        """The body starts arriving now."""
        self.started = time.monotonic()
        self._samples = [(self.started, self.received)]

    def saw(self, size: int) -> None:
        """``size`` more bytes arrived.

        Raises:
            DownloadStalled: the body stalled (found by :meth:`tick`)."""
        with self._lock:
            self.received += size
        if self.stalled is not None:
            raise DownloadStalled(self.stalled)

    def rate(self, now: float) -> float:
        """Bytes per second over the last window (since the body began, within its first)."""
        with self._lock:
            self._samples.append((now, self.received))
            while len(self._samples) > 2 and now - self._samples[1][0] >= self.window_s:
                self._samples.pop(0)
            since, then = self._samples[0]
            return (self.received - then) / max(now - since, 1e-6)

    def tick(self, now: float) -> bool:
        """Whether the body moves at the rate now; sets :attr:`stalled` once a whole window
        passed with fewer bytes than the rate asks."""
        rate = self.rate(now)
        if rate >= self.min_rate:
            return True
        if now - self._samples[0][0] >= self.window_s and self.stalled is None:
            self.stalled = (f"download stalled: {rate * self.window_s:,.0f} bytes in the last {self.window_s:g} s, "
                            f"at least {self.min_rate * self.window_s:,.0f} wanted (TUNECACHE_STALL_TIMEOUT, "
                            f"TUNECACHE_MIN_DOWNLOAD_RATE); {self.received:,} bytes had arrived in "
                            f"{now - self.started:.1f} s")
        return False

    def guard(self, response: Any, credit: Callable[[float], float]) -> _Guard:
        """While the body of ``response`` (httpx, streamed) is read: a thread that, every
        fraction of a second, gives the time back while the body moves at the rate
        (``credit(seconds)``, which returns when the deadline now is, monotonic seconds), and
        shuts the socket down when the body stalls or that deadline comes (a read blocked on a
        silent server then ends at once)."""
        stream = response.extensions.get("network_stream")
        sock = stream.get_extra_info("socket") if stream is not None else None
        return _Guard(self, sock if isinstance(sock, socket.socket) else None, credit)


class _Guard:
    def __init__(self, watch: StallWatch, sock: socket.socket | None, credit: Callable[[float], float]):
        self.watch, self.sock, self.credit = watch, sock, credit
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tunecache-stall-watch", daemon=True)

    def _run(self) -> None:
        tick = min(0.1, self.watch.window_s / 10)
        last = time.monotonic()
        while not self._done.wait(tick):
            now = time.monotonic()
            moving = self.watch.tick(now)
            end = self.credit(now - last if moving else 0.0)
            last = now
            if self.watch.stalled is not None or now >= end:
                if self.sock is not None:
                    _shut_down(self.sock)
                return

    def __enter__(self) -> StallWatch:
        self._thread.start()
        return self.watch

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
