"""A verified artifact's bytes in a file: what a pod's install reads a run's tarballs from,
never whole in memory.

A download streams the body to a file as it arrives, its sha256 taken on the way
(:meth:`tunecache.store.http.artifacts.ArtifactsClient.download_artifact_to`): a spool file
of the process's own, unlinked at once (:func:`spool_file`: it goes with the last descriptor,
whatever ends the process), or an entry of the node's cache
(:mod:`tunecache.client.node_cache`). An :class:`ArtifactFile` holds the file open, so an
entry the node cache evicts meanwhile is still read whole; each :meth:`ArtifactFile.open`
gives a reader of its own (positional reads on the one descriptor).
"""

from __future__ import annotations

import io
import os
import tempfile
from pathlib import Path
from typing import IO

#: Bytes read from an artifact's file at a time.
READ_BUFFER_BYTES = 1 << 20


class _PositionalReader(io.RawIOBase):
    """A file's bytes by ``os.pread`` on a descriptor shared with other readers (each keeps
    its own offset; closing one leaves the descriptor open)."""

    def __init__(self, fd: int, size: int):
        super().__init__()
        self._fd, self._size, self._offset = fd, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        count = min(len(buffer), self._size - self._offset)
        if count <= 0:
            return 0
        read = os.preadv(self._fd, [memoryview(buffer)[:count]], self._offset)  # into the buffer: no copy
        self._offset += read
        return read

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._offset, io.SEEK_END: self._size}[whence]
        self._offset = max(0, base + offset)
        return self._offset

    def tell(self) -> int:
        return self._offset


class ArtifactFile:
    """A verified artifact (its bytes hash to ``sha256``) held open in a file (``path``: where
    it is named, ``None`` for an unlinked spool file). Given wherever a run's tarball is read
    (:data:`tunecache.formats.tarball.TarSource`)."""

    def __init__(self, fd: int, sha256: str, size: int, path: Path | None = None, from_node_cache: bool = False):
        self._fd: int | None = fd
        self.sha256, self.size, self.path, self.from_node_cache = sha256, size, path, from_node_cache

    def open(self) -> IO[bytes]:
        """A reader of the bytes from their start (its own offset)."""
        if self._fd is None:
            raise ValueError(f"artifact {self.sha256} is closed")
        return io.BufferedReader(_PositionalReader(self._fd, self.size), READ_BUFFER_BYTES)

    def read_bytes(self) -> bytes:
        """The bytes, whole (for the small ones: a FlashInfer autotune file)."""
        with self.open() as f:
            return f.read()

    def __len__(self) -> int:
        return self.size

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:
        try:
            self.close()
        except OSError:
            pass

    def __repr__(self) -> str:
        return f"ArtifactFile({self.sha256[:12]}, {self.size:,} bytes{', node cache' if self.from_node_cache else ''})"


def spool_file() -> IO[bytes]:
    """A new file for a download (``TMPDIR``'s, the process's own), unlinked already: its
    space goes back when the last descriptor of it closes."""
    return tempfile.TemporaryFile(prefix="tunecache-artifact-")


def held(f: IO[bytes], sha256: str, size: int, path: Path | None = None, from_node_cache: bool = False) -> ArtifactFile:
    """An :class:`ArtifactFile` holding a descriptor of its own for the open file ``f``
    (which the caller still closes)."""
    return ArtifactFile(os.dup(f.fileno()), sha256, size, path, from_node_cache)
