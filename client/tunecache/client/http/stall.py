"""The deadline of a download that measures progress, not a total.

A warm state's artifacts are big (a FlashInfer fused-MoE JIT module alone is hundreds of MB), so
the time a download takes says more about the wire than about the server: a total cut a moving
download off. While an artifact's body arrives, a :class:`StallWatch` asks for progress instead:
in every window of ``TUNECACHE_STALL_TIMEOUT`` seconds (10 by default) at least
``TUNECACHE_MIN_DOWNLOAD_RATE`` bytes per second of it (64 KiB/s by default) must arrive, else
the download is stalled and its connection is shut down (a server that sends nothing, or trickles
a byte now and then, holds a pod no longer than that). The time a body spends arriving is not
counted against the install deadline (``TUNECACHE_INSTALL_DEADLINE``), which still bounds the
lookup and each download's wait for its answer (:meth:`tunecache.client.http.transport.Transport._exchange`).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
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
    """Watches one body as it arrives (:meth:`saw` each part); :meth:`guard` shuts its connection
    down when a window passes with too few bytes. ``received`` and ``seconds`` say what came."""

    def __init__(self, window_s: float | None = None, min_rate: int | None = None):
        self.window_s = stall_timeout_s() if window_s is None else window_s
        self.min_rate = min_download_rate() if min_rate is None else min_rate
        self.received = 0
        self.started = time.monotonic()
        self.stalled: str | None = None
        self._window_start = self.started
        self._in_window = 0
        self._lock = threading.Lock()

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.started

    def saw(self, size: int) -> None:
        """``size`` more bytes arrived.

        Raises:
            DownloadStalled: the watch found the body stalled (a transport without a socket)."""
        with self._lock:
            self.received += size
            self._in_window += size
        if self.stalled is None:
            self._check(time.monotonic())
        if self.stalled is not None:
            raise DownloadStalled(self.stalled)

    def _check(self, now: float) -> bool:
        """Close the window when it is over; ``True`` when it held too few bytes."""
        with self._lock:
            if now - self._window_start < self.window_s:
                return False
            need = max(1, int(self.min_rate * self.window_s))
            if self._in_window < need:
                self.stalled = (f"download stalled: {self._in_window:,} bytes in the last {self.window_s:g} s, "
                                f"at least {need:,} wanted (TUNECACHE_STALL_TIMEOUT, TUNECACHE_MIN_DOWNLOAD_RATE); "
                                f"{self.received:,} bytes had arrived in {now - self.started:.1f} s")
                return True
            self._window_start, self._in_window = now, 0
            return False

    def guard(self, response: Any) -> "_Guard":
        """While the body of ``response`` (httpx, streamed) is read: a thread that shuts its
        socket down once :meth:`_check` finds a window with too few bytes (a read blocked on a
        silent server then ends at once)."""
        stream = response.extensions.get("network_stream")
        sock = stream.get_extra_info("socket") if stream is not None else None
        return _Guard(self, sock if isinstance(sock, socket.socket) else None)


class _Guard:
    def __init__(self, watch: StallWatch, sock: socket.socket | None):
        self.watch, self.sock = watch, sock
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tunecache-stall-watch", daemon=True)

    def _run(self) -> None:
        tick = min(0.25, self.watch.window_s / 4)
        while not self._done.wait(tick):
            if self.watch._check(time.monotonic()):
                if self.sock is not None:
                    _shut_down(self.sock)
                return

    def __enter__(self) -> StallWatch:
        self._thread.start()
        return self.watch

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
