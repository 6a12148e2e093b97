"""Bytes made by a thread of their own, a part at a time, ahead of their reader.

How a run's tarball is read in one pass without one thread doing everything: the download's
parts arrive (:mod:`tunecache.client.artifact_stream`) and the gzip is inflated
(:mod:`tunecache.formats.inflate`) each in a thread of its own, while the reader parses the tar
and writes its files. Each is a :class:`ReadAhead`: bounded (at most ``ahead`` parts wait for
the reader), and whatever its thread meets is raised to the reader, in order, where the reader
would have met it.
"""

from __future__ import annotations

import io
import queue
import threading
from collections.abc import Callable

#: The size of a part handed to the reader (a download's, an inflating's): a MiB, one hand-over
#: where httpx reads 64 KiB at a time, and the most a small gzip is inflated at once.
PART_BYTES = 1 << 20
#: The most parts waiting for their reader, by each read-ahead (a pull's peak RSS grows with it:
#: docs/benchmarks.md, "Installing big warm states").
AHEAD_PARTS = 4

#: What a producer is given: a function that hands the reader one more part (it waits while
#: ``ahead`` parts wait already; it raises :class:`Stopped` once the reader has closed).
Put = Callable[[bytes], None]


class Stopped(Exception):
    """The reader closed: the producing thread stops (raised by its ``put``)."""


class ReadAhead(io.RawIOBase):
    """The bytes ``produce(put)`` makes in a thread of its own (named ``name``), read in order;
    its return is their end, what it raises is raised to the reader after the parts before it.
    :meth:`close` stops the thread (its next ``put`` raises :class:`Stopped`) and waits for it."""

    def __init__(self, produce: Callable[[Put], None], ahead: int, name: str):
        super().__init__()
        self._parts: queue.Queue[bytes | BaseException | None] = queue.Queue(ahead)
        self._part, self._at, self._ended = b"", 0, False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(produce,), name=name, daemon=True)
        self._thread.start()

    def readable(self) -> bool:
        return True

    def _put(self, item: bytes | BaseException | None) -> None:
        while True:
            if self._stop.is_set():
                raise Stopped
            try:
                self._parts.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def _run(self, produce: Callable[[Put], None]) -> None:
        try:
            produce(self._put)
            self._put(None)
        except Stopped:
            return
        except BaseException as exc:  # the reader's, where it would have met it
            try:
                self._put(exc)
            except Stopped:
                return

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        while self._at >= len(self._part):
            if self._ended:
                return 0
            try:
                item = self._parts.get(timeout=0.1)
            except queue.Empty:
                if self._stop.is_set():  # closed from another thread while this one waited
                    raise ValueError("read of a closed reader") from None
                continue
            if item is None or isinstance(item, BaseException):
                self._ended = True
                if item is None:
                    return 0
                raise item
            self._part, self._at = item, 0
        count = min(len(buffer), len(self._part) - self._at)
        buffer[:count] = memoryview(self._part)[self._at:self._at + count]
        self._at += count
        return count

    def close(self) -> None:
        """Stop the producing thread and wait for it."""
        if not self.closed:
            self._stop.set()
            self._thread.join()
        super().close()
