"""A streamed tarball's reader closed before its end (:mod:`tunecache.client.artifact_stream`):
after a refusal it reads the rest first, so the download's own verdict on the bytes is what the
install reports; after an interrupt it does not wait for the rest."""

from __future__ import annotations

import threading
import time

import pytest

from tunecache.client.artifact_stream import ArtifactStream, _StreamReader
from tunecache.formats.read_ahead import ReadAhead
from tunecache.store import ArtifactCorrupt


def _reader(produce) -> tuple[_StreamReader, ArtifactStream]:
    stream = ArtifactStream(streams=None, sha256="0" * 64)  # its downloads are not asked for here
    return _StreamReader(ReadAhead(produce, 4, "test-download"), stream), stream


def test_a_reader_closed_after_a_refusal_reads_the_rest_for_the_downloads_verdict():
    sent = []

    def produce(put):
        for n in range(6):
            put(bytes(100))
            sent.append(n)
        raise ArtifactCorrupt("arrived hashing to something else")

    reader, stream = _reader(produce)
    assert reader.read(10) == bytes(10)
    try:
        raise ValueError("an entry the kind forbids")
    except ValueError:
        reader.close()
    assert len(sent) == 6 and isinstance(stream.failure, ArtifactCorrupt)


def test_a_reader_closed_by_an_interrupt_does_not_wait_for_the_rest():
    def produce(put):
        while True:  # a download that would go on for long
            put(bytes(100))
            time.sleep(0.05)

    reader, stream = _reader(produce)
    reader.read(10)
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        try:
            raise KeyboardInterrupt
        finally:
            reader.close()
    assert time.monotonic() - started < 2 and stream.failure is None
    assert not any(t.name == "test-download" for t in threading.enumerate())
