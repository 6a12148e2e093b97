"""A run's tarball is inflated in a thread of its own ahead of the tar's reader
(:mod:`tunecache.formats.inflate` over :mod:`tunecache.formats.read_ahead`): the same bytes as
``gzip`` gives, bounded parts however far a small gzip inflates, and every failure raised to the
reader where it would have met it."""

from __future__ import annotations

import gzip
import io
import os
import threading
import time
import zlib

import pytest

from tunecache.formats.inflate import _inflate, inflating
from tunecache.formats.read_ahead import PART_BYTES, ReadAhead, Stopped


def test_the_bytes_are_gzips_and_the_source_is_read_to_its_end():
    payload = os.urandom(3 * PART_BYTES + 12345) + bytes(2 * PART_BYTES)
    source = io.BytesIO(gzip.compress(payload, compresslevel=1) + b"trailing bytes after the member")
    with inflating(source) as reader:
        assert reader.read() == payload
    assert source.tell() == len(source.getvalue())  # what follows the member read (and ignored)


def test_a_small_gzip_that_inflates_far_is_never_inflated_whole():
    bomb = gzip.compress(bytes(64 * PART_BYTES))
    assert len(bomb) < PART_BYTES // 4
    parts: list[int] = []
    _inflate(io.BytesIO(bomb), lambda part: parts.append(len(part)))
    assert sum(parts) == 64 * PART_BYTES and max(parts) <= PART_BYTES


@pytest.mark.parametrize("data, error", [
    (b"not gzip at all", zlib.error),
    (gzip.compress(b"x" * 100_000)[:-30], EOFError),  # ends before its end
    (gzip.compress(b"x" * 100_000)[:-8] + b"\0\0\0\0" + gzip.compress(b"x" * 100_000)[-4:], zlib.error),  # CRC-32
])
def test_what_is_not_a_whole_gzip_is_raised_to_the_reader(data, error):
    with inflating(io.BytesIO(data)) as reader, pytest.raises(error):
        reader.read()


def test_a_producer_stays_at_most_its_parts_ahead_and_stops_when_the_reader_closes():
    made, stopped = [], threading.Event()

    def produce(put):
        try:
            for n in range(1000):
                put(bytes([n % 256]) * 10)
                made.append(n)
        except Stopped:
            stopped.set()
            raise

    reader = ReadAhead(produce, 4, "test-producer")
    time.sleep(0.5)
    assert len(made) <= 5  # four waiting, one in its put
    assert reader.read(10) == bytes([0]) * 10
    reader.close()
    assert stopped.wait(5) and not any(t.name == "test-producer" for t in threading.enumerate())


def test_what_a_producer_raises_comes_after_the_parts_it_made():
    def produce(put):
        put(b"one")
        put(b"two")
        raise OSError("the wire broke")

    with io.BufferedReader(ReadAhead(produce, 8, "test-producer")) as reader:
        assert reader.read(6) == b"onetwo"
        with pytest.raises(OSError, match="the wire broke"):
            reader.read(1)
