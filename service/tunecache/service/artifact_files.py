"""Artifacts mirrored from their store (the database, or the object store:
:mod:`tunecache.service.artifact_store`) into files named by their sha256, the small ones
also held in memory (:class:`ArtifactFiles`). Artifacts are immutable, so a file, once
written whole and verified, is served as it is (``FileResponse``: ``Range``, ``HEAD``)
without a database connection; the download of a large one holds no connection while the
pod reads it. Its size is capped by :meth:`ArtifactFiles.trim` (least recently used files
first; ``TUNECACHE_MIRROR_MAX_BYTES``, :mod:`tunecache.service.retention`)."""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from cachetools import LRUCache
from sqlalchemy.orm import Session

from tunecache.service import artifact_store, blobs


@dataclass
class Trimmed:
    """Mirrored files a trim removed (or, dry, would remove), and their bytes."""

    files: int = 0
    bytes: int = 0


#: A file used is marked so (its access time set) at most this often, seconds.
TOUCH_AFTER_S = 10.0
#: A file used within this many seconds is never evicted (a download may be about to open it).
IN_USE_S = 60.0


class ArtifactFiles:
    """Artifacts as files under ``root`` (``root/ab/abcd...``), written once, never changed;
    those of at most ``memory_max_item`` bytes also in memory (LRU, ``memory_bytes`` in all).

    Each use of a file (:meth:`get`) sets its access time (at most every
    :data:`TOUCH_AFTER_S` seconds, explicitly: mounts with ``noatime`` do not), which is
    what :meth:`trim` evicts by. Files may be removed at any time; a missing one is mirrored
    again from the database."""

    def __init__(self, root: Path, memory_bytes: int = 64 * 1024 * 1024, memory_max_item: int = 1024 * 1024):
        self.root = root
        self.memory_max_item = memory_max_item
        self._memory: LRUCache = LRUCache(maxsize=max(memory_bytes, 1), getsizeof=len)
        self._lock = threading.Lock()
        #: Why the last mirror write failed (``None`` once one succeeded again): /v1/health's "degraded".
        self.write_failure: str | None = None

    def note_written(self) -> None:
        """A mirror write succeeded: the mirror is writable again."""
        self.write_failure = None

    def note_write_failure(self, exc: OSError) -> None:
        """A mirror write failed (full disk, I/O error): artifacts come from the database meanwhile."""
        self.write_failure = f"artifact mirror {self.root} cannot be written ({exc.strerror or exc}); artifacts are served from the database"

    def hold(self, sha256: str, data: bytes) -> None:
        """Hold a small artifact's verified bytes in memory (read from the database when the
        mirror could not be written)."""
        if len(data) <= self.memory_max_item:
            with self._lock:
                self._memory[sha256] = data

    def path(self, sha256: str) -> Path:
        return self.root / sha256[:2] / sha256

    def get(self, sha256: str) -> Path | None:
        """The file of a mirrored artifact (marked used now), or ``None``."""
        path = self.path(sha256)
        try:
            st = path.stat()
        except OSError:
            return None
        now = time.time()
        if st.st_atime < now - TOUCH_AFTER_S:
            try:
                os.utime(path, (now, st.st_mtime))
            except OSError:  # removed meanwhile, or a read-only mirror: still served while open
                pass
        return path

    def remove(self, sha256: str) -> int:
        """Remove a mirrored artifact (its blob was deleted) from disk and memory; returns
        the bytes its file held (0: there was none)."""
        with self._lock:
            self._memory.pop(sha256, None)
        path = self.path(sha256)
        try:
            size = path.stat().st_size
            path.unlink()
        except FileNotFoundError:
            return 0
        return size

    def _files(self) -> list[tuple[float, int, str, Path]]:
        """``(access time, size, sha256, path)`` of every mirrored file (not the temporary ones)."""
        found = []
        if not self.root.is_dir():
            return found
        for directory in self.root.iterdir():
            if len(directory.name) != 2 or not directory.is_dir():
                continue
            for entry in os.scandir(directory):
                if len(entry.name) == 64 and not entry.name.startswith("."):
                    try:
                        st = entry.stat()
                    except OSError:
                        continue
                    found.append((st.st_atime, st.st_size, entry.name, Path(entry.path)))
        return found

    def size(self) -> int:
        """Bytes of all mirrored files."""
        return sum(size for _, size, _, _ in self._files())

    def trim(self, max_bytes: int, stored: Callable[[list[str]], set[str]] | None = None,
             dry_run: bool = False) -> Trimmed:
        """Remove the files whose blob is no longer stored (``stored(shas)`` says which of
        them still are; ``None``: not checked), then, while the files hold more than
        ``max_bytes``, the least recently used, except those used within :data:`IN_USE_S`
        seconds (the mirror may stay above the cap until they age). ``dry_run``: count only.

        A file being read stays readable to its end (POSIX: an unlinked file lives while
        open); the next download of an evicted artifact mirrors it again from the database.
        """
        trimmed = Trimmed()
        files = self._files()
        if stored is not None and files:
            kept = stored([sha for _, _, sha, _ in files])
            for _, size, sha, path in files:
                if sha not in kept:
                    trimmed.files += 1
                    trimmed.bytes += size
                    if not dry_run:
                        self.remove(sha)
            files = [f for f in files if f[2] in kept]
        total = sum(size for _, size, _, _ in files)
        in_use = time.time() - IN_USE_S
        for atime, size, sha, path in sorted(files):
            if total <= max_bytes or atime >= in_use:
                break
            if not dry_run:
                path.unlink(missing_ok=True)
            total -= size
            trimmed.files += 1
            trimmed.bytes += size
        return trimmed

    def in_memory(self, sha256: str) -> bytes | None:
        """The bytes of a small mirrored artifact, when held in memory."""
        with self._lock:
            return self._memory.get(sha256)

    def remember(self, sha256: str, path: Path) -> None:
        """Hold a small mirrored artifact's bytes in memory (read once, not again while held)."""
        if self.in_memory(sha256) is None and path.stat().st_size <= self.memory_max_item:
            data = path.read_bytes()
            with self._lock:
                self._memory[sha256] = data

    def mirror(self, session: Session, sha256: str) -> Path | None:
        """Copy a stored blob into its file (from its store: the database's chunks in
        ``session``'s transaction, or the object store), verifying its sha256; ``None`` when
        no blob is stored under ``sha256``.

        Raises:
            blobs.DigestMismatch: the stored bytes do not hash to ``sha256`` (nothing is
                written).
            OSError: the file cannot be written.
            artifact_store.ArtifactStoreUnavailable: the object store failed.
        """
        found = artifact_store.locate(session, sha256, hold=True)
        if found is None:
            return None
        return self.write(sha256, artifact_store.stores_of(session).at(found[1]).iter_bytes(session, sha256))

    def write(self, sha256: str, parts: Iterable[bytes]) -> Path:
        """Write a blob's bytes (``parts``, in order) into its file, verifying its sha256,
        and rename it into place (concurrent writes of one blob are safe).

        Raises:
            blobs.DigestMismatch: the bytes do not hash to ``sha256`` (nothing is written).
            OSError: the file cannot be written.
        """
        target = self.path(sha256)
        target.parent.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256()
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{sha256[:16]}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                for chunk in parts:
                    digest.update(chunk)
                    f.write(chunk)
            if digest.hexdigest() != sha256:
                raise blobs.DigestMismatch(f"stored blob {sha256} hashes to {digest.hexdigest()}")
            os.chmod(tmp, 0o644)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return target
