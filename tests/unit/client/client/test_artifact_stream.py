"""A streamed tarball's reader closed before its end (:mod:`tunecache.client.artifact_stream`):
after a refusal it reads the rest first, so the download's own verdict on the bytes is what the
install reports; after an interrupt it does not wait for the rest. The install's transfer counts
a streamed artifact once it arrived whole."""

from __future__ import annotations

import hashlib
import threading
import time

import pytest

from tunecache.client.artifact_stream import ArtifactStream, Streams, _StreamReader
from tunecache.client.node_cache import Transfer
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


class _DownloadingClient:
    """The edge of the install's client: a download that sends ``body`` and then, if
    ``failure``, raises it (as a download whose bytes hashed to something else does)."""

    def __init__(self, body: bytes, failure: Exception | None = None):
        self.body, self.failure = body, failure

    def download_sibling(self):
        return self

    def download_artifact_to(self, sha256, out, watch):
        out.begin_attempt(hashlib.sha256())
        out.write(self.body)
        watch.received += len(self.body)
        if self.failure is not None:
            raise self.failure
        out.flush()
        return len(self.body)

    def close(self):
        pass


def test_the_transfer_counts_an_artifact_that_arrived_and_not_one_that_failed():
    transfer = Transfer()
    parts = []
    Streams(_DownloadingClient(bytes(300)), transfer).download("1" * 64, parts.append)
    assert (transfer.artifacts, transfer.bytes, b"".join(parts)) == (1, 300, bytes(300))
    with pytest.raises(ArtifactCorrupt):
        failing = _DownloadingClient(bytes(200), ArtifactCorrupt("hashing to something else"))
        Streams(failing, transfer).download("2" * 64, parts.append)
    assert (transfer.artifacts, transfer.bytes) == (1, 300)
