"""An artifact streamed from the wire into its one pass: no spool file, no second read.

Where a pod has no node cache (``TUNECACHE_NODE_CACHE_DIR``), ``tunecache pull`` and the Python
API (:func:`tunecache.client.install.fetch_and_install`) do not download a run's tarballs before
installing them: each is an :class:`ArtifactStream`, whose bytes a thread downloads while the
install's one pass (:func:`tunecache.client.unpack.unpack`) inflates them and writes their files
into a staging directory, as ``curl | tar`` would. Nothing is placed before the bytes' sha256
checked: the reader meets the end of the bytes only after the download checked the sha256 (and
the size the server announced) of all of them; bytes that hash to something else raise
:class:`~tunecache.store.ArtifactCorrupt` at the reader instead, and what was unpacked goes with
its staging directory (:func:`tunecache.client.unpack.staging_scope`).

Retries: a download that breaks off (a reset, a stall, a truncated body) is retried as before
(:meth:`~tunecache.store.http.artifacts.ArtifactsClient.download_artifact_to`); the bytes the
reader already has are not given again, and the new attempt's are checked to be those (their
sha256 up to there) before it goes on, so what was unpacked is what the sha256 at the end checks.

Bounded: at most :data:`~tunecache.formats.read_ahead.AHEAD_PARTS` parts of the body (a MiB
each, httpx's 64 KiB reads gathered: :data:`~tunecache.formats.read_ahead.PART_BYTES`) wait for
the reader (:class:`tunecache.formats.read_ahead.ReadAhead`); a reader that stops reading holds
the download back with it (a whole stall window of it is a stall). A second reader (:meth:`ArtifactStream.open`, or ``stream()`` again)
or one that wants the bytes whole (:meth:`ArtifactStream.read_bytes`) gets them downloaded into a
spool file first, as without streaming (:func:`tunecache.client.node_cache.fetch_artifact`).

The streams of one install download one at a time, on one client (:class:`Streams`, a sibling
of the install's client made inside its deadline): the time each body moves is given back to
that deadline (:mod:`tunecache.store.http.stall`), so big artifacts unpacked one after another
do not run it out.
"""

from __future__ import annotations

import hashlib
import io
import sys
import threading
import time
from typing import IO, Any

from tunecache.client.artifact_file import ArtifactFile
from tunecache.client.node_cache import Transfer, fetch_artifact
from tunecache.formats.read_ahead import AHEAD_PARTS, PART_BYTES, Put, ReadAhead
from tunecache.store import ArtifactCorrupt
from tunecache.store.http.stall import StallWatch


class _Sink:
    """What a download writes into (``begin_attempt``, ``write``, ``tell``, ``flush``): each part
    given to the reader once, across attempts (see the module's docstring)."""

    def __init__(self, put: Put, sha256: str):
        self._put, self.sha256 = put, sha256
        self.delivered = 0  # bytes the reader has been given
        self.position = 0  # this attempt's
        self._digest: Any = None  # this attempt's sha256, as the download runs it
        self._prefix: tuple[int, str] | None = None  # (bytes, sha256) the reader has, from an attempt before
        self._catching_up: Any = None  # this attempt's own sha256 up to there
        self._held: list[bytes] = []  # parts received, not yet given (:meth:`flush`)
        self._held_bytes = 0

    def begin_attempt(self, digest: Any) -> None:
        self.flush()  # what the attempt before received (its sha256 covers it)
        if self._digest is not None and self.delivered and self.position == self.delivered:
            self._prefix = (self.delivered, self._digest.hexdigest())  # the attempt before gave all it had
        self._digest, self.position = digest, 0
        self._catching_up = hashlib.sha256() if self.delivered else None

    def write(self, part: bytes) -> None:
        if self.position < self.delivered:
            view = memoryview(part)
            taken = min(len(part), self.delivered - self.position)
            self._catching_up.update(view[:taken])
            self.position += taken
            if self.position == self.delivered and self._prefix is not None \
                    and self._catching_up.hexdigest() != self._prefix[1]:
                raise ArtifactCorrupt(f"artifact {self.sha256}: a retried download sent other bytes than the "
                                      f"{self.delivered:,} already unpacked")
            if taken == len(part):
                return
            part = bytes(view[taken:])
        self._held.append(part)
        self._held_bytes += len(part)
        self.position += len(part)
        self.delivered += len(part)
        if self._held_bytes >= PART_BYTES:
            self.flush()

    def tell(self) -> int:
        return self.position

    def flush(self) -> None:
        """Give the reader the parts held back (one part of a MiB rather than sixteen of
        httpx's: one hand-over each)."""
        if self._held:
            part = self._held[0] if len(self._held) == 1 else b"".join(self._held)
            self._held, self._held_bytes = [], 0
            self._put(part)


class Streams:
    """The streamed artifacts of one install: one client for their downloads (a sibling of
    ``client``, made now: inside the install's deadline), one download at a time; what they
    took is added to ``transfer``. Close it after the install."""

    def __init__(self, client: Any, transfer: Transfer):
        self._client, self.transfer = client.download_sibling(), transfer
        self._one_at_a_time = threading.Lock()

    def of(self, sha256: str) -> ArtifactStream:
        return ArtifactStream(self, sha256)

    def download(self, sha256: str, put: Put) -> None:
        """The artifact's bytes, each part to ``put``, its sha256 checked before this returns;
        added to the install's transfer once it arrived whole.

        Raises:
            as :meth:`tunecache.store.http.artifacts.ArtifactsClient.download_artifact_to`."""
        with self._one_at_a_time:
            watch, began = StallWatch(), time.monotonic()
            self._client.download_artifact_to(sha256, _Sink(put, sha256), watch)
            # counted once it arrived whole, as fetch_artifact counts a spooled one
            self.transfer.artifacts += 1
            self.transfer.bytes += watch.received
            self.transfer.seconds += time.monotonic() - began

    def downloaded(self, sha256: str) -> ArtifactFile:
        """The artifact downloaded into a spool file (:func:`~tunecache.client.node_cache.fetch_artifact`)."""
        with self._one_at_a_time:
            return fetch_artifact(self._client, sha256, self.transfer)

    def close(self) -> None:
        self._client.close()


class _StreamReader(io.BufferedReader):
    """The reader of a stream. Closed before the end (its reader refused what it read: bytes
    that are not a gzip'd tar, an entry the kind forbids), it reads the rest first: bytes that
    were damaged on the way fail their sha256 at the end, and that (:attr:`ArtifactStream.failure`)
    is what the install reports, not a refusal of the signer's artifact."""

    def __init__(self, raw: ReadAhead, stream: ArtifactStream):
        super().__init__(raw, PART_BYTES)
        self._stream = stream

    def close(self) -> None:
        try:
            if not self.closed and not _interrupted():
                while self.read(PART_BYTES):
                    pass
        except Exception as exc:  # the download's verdict
            self._stream.failure = exc
        finally:
            super().close()


def _interrupted() -> bool:
    """Whether the exception being handled comes of an interrupt or an exit (Ctrl-C, a
    ``sys.exit``): then a reader closed early does not wait for the rest of its download."""
    exc = sys.exc_info()[1]
    while exc is not None:
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            return True
        exc = exc.__context__
    return False


class ArtifactStream:
    """A run's artifact whose bytes are downloaded as its one reader reads them (:meth:`stream`),
    a :data:`tunecache.formats.tarball.TarSource`."""

    def __init__(self, streams: Streams, sha256: str):
        self._streams, self.sha256 = streams, sha256
        self._streamed = False
        self._file: ArtifactFile | None = None
        self.failure: Exception | None = None
        """What the download met when its reader stopped before the end and the rest was read
        for the sha256's verdict (:class:`_StreamReader`): the bytes' own fault comes first."""

    def stream(self) -> IO[bytes]:
        """The bytes as they arrive, for one reader front to back; their end comes after their
        sha256 checked. A second call: :meth:`open`."""
        if self._streamed:
            return self.open()
        self._streamed = True
        reader = ReadAhead(lambda put: self._streams.download(self.sha256, put), AHEAD_PARTS, "tunecache-download")
        return _StreamReader(reader, self)

    def open(self) -> IO[bytes]:
        """A reader of the whole bytes from their start, downloaded into a spool file first."""
        if self._file is None:
            self._file = self._streams.downloaded(self.sha256)
        return self._file.open()

    def read_bytes(self) -> bytes:
        with self.open() as f:
            return f.read()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()

    def __repr__(self) -> str:
        return f"ArtifactStream({self.sha256[:12]})"
