"""One download per node: a content-addressed cache of verified artifacts that the pods of a node
share (``TUNECACHE_NODE_CACHE_DIR``, a directory the operator mounts into every pod, e.g. a
``hostPath``), bounded in bytes (``TUNECACHE_NODE_CACHE_MAX_BYTES``) by evicting the least
recently used entries.

Layout: ``<dir>/sha256/<hex>`` holds an artifact whose bytes hash to ``<hex>``. A pod that needs
one takes the entry's lock (``<dir>/locks/<hex>.lock``, ``fcntl.flock``), looks again, and
otherwise downloads it into ``<dir>/tmp/<hex>.part``, checks its sha256 and renames it to its
name: a pod never sees a half-written entry, and the pods of a node that boot together download
each artifact once (the others wait on the lock while the download moves, and read the entry).
A pod reads an entry only after hashing it again: an entry whose bytes do not hash to its name
(a disk error, a hand's edit) is removed and downloaded anew. Using an entry touches its time;
admitting one evicts the oldest others until the cache is within its bound, under the cache's
own lock (``<dir>/index.lock``). An artifact larger than the bound, or a cache that cannot be
written, is downloaded to the pod's own spool instead (:func:`tunecache.client.artifact_file.spool_file`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunecache.client.artifact_file import ArtifactFile, held, spool_file
from tunecache.store.http.stall import StallWatch
from tunecache.formats.tarball import positive_whole_setting

#: Default of ``TUNECACHE_DOWNLOADS``: artifacts of one install downloaded at once.
DEFAULT_DOWNLOADS = 4
#: Default of ``TUNECACHE_NODE_CACHE_MAX_BYTES``: 50 GiB.
DEFAULT_NODE_CACHE_MAX_BYTES = 50 << 30
_SHA256 = re.compile(r"[0-9a-f]{64}")
_HASH_BLOCK = 1 << 20


@dataclass
class Transfer:
    """What an install's artifacts took: bytes downloaded and the seconds their bodies took,
    and how many came from the node cache instead (``from_cache``, ``cached_bytes``)."""

    bytes: int = 0
    seconds: float = 0.0
    artifacts: int = 0
    from_cache: int = 0
    cached_bytes: int = 0

    def add(self, other: Transfer) -> None:
        self.bytes += other.bytes
        self.seconds += other.seconds
        self.artifacts += other.artifacts
        self.from_cache += other.from_cache
        self.cached_bytes += other.cached_bytes

    def line(self) -> str:
        """One line for the install's report: bytes, seconds and rate."""
        rate = self.bytes / self.seconds / 1e6 if self.seconds > 0 else 0.0
        said = f"downloaded {self.bytes / 1e6:,.1f} MB in {self.seconds:.2f} s ({rate:,.1f} MB/s)"
        if self.from_cache:
            said += f"; {self.from_cache} of {self.artifacts} from the node cache ({self.cached_bytes / 1e6:,.1f} MB)"
        return said


def _file_sha256(f: Any) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    f.seek(0)
    while block := f.read(_HASH_BLOCK):
        digest.update(block)
        size += len(block)
    return digest.hexdigest(), size


class NodeCache:
    """The node's artifact cache at ``root`` (made when missing), at most ``max_bytes``."""

    def __init__(self, root: Path, max_bytes: int = DEFAULT_NODE_CACHE_MAX_BYTES):
        self.root, self.max_bytes = Path(root), max_bytes
        for sub in ("sha256", "tmp", "locks"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)

    @classmethod
    def from_environment(cls) -> NodeCache | None:
        """The cache ``TUNECACHE_NODE_CACHE_DIR`` names (``None``: unset, or a directory this
        pod cannot make or write: then each pod downloads for itself)."""
        where = os.environ.get("TUNECACHE_NODE_CACHE_DIR", "").strip()
        if not where:
            return None
        try:
            cache = cls(Path(where).expanduser(),
                        positive_whole_setting("TUNECACHE_NODE_CACHE_MAX_BYTES", DEFAULT_NODE_CACHE_MAX_BYTES))
        except OSError:
            return None
        return cache if os.access(cache.root / "tmp", os.W_OK) else None

    def entry(self, sha256: str) -> Path:
        if not _SHA256.fullmatch(sha256):
            raise ValueError(f"not a sha256: {sha256!r}")
        return self.root / "sha256" / sha256

    def get(self, sha256: str) -> ArtifactFile | None:
        """The entry of ``sha256`` held open, after hashing it again (one whose bytes hash to
        something else is removed: ``None``); ``None`` when there is none."""
        path = self.entry(sha256)
        try:
            f = path.open("rb")
        except FileNotFoundError:
            return None
        with f:
            found, size = _file_sha256(f)
            if found != sha256:
                with contextlib.suppress(OSError), self._lock(self.root / "index.lock"):
                    if os.path.samestat(os.fstat(f.fileno()), os.stat(path)):  # not a good one renamed in meanwhile
                        path.unlink()
                return None
            with contextlib.suppress(OSError):
                os.utime(path)  # used now: the last to be evicted
            return held(f, sha256, size, path, from_node_cache=True)

    def fetch(self, client: Any, sha256: str, watch: StallWatch) -> ArtifactFile:
        """The artifact ``sha256`` from the cache, else downloaded into it (one download per
        node: the pods asking at once wait on the entry's lock while it moves).

        Raises:
            as :meth:`tunecache.store.http.artifacts.ArtifactsClient.download_artifact_to`.
        """
        found = self.get(sha256)
        if found is not None:
            return found
        part = self.root / "tmp" / f"{sha256}.part"
        with self._entry_lock(sha256, part, watch.window_s, getattr(client, "give_back", None)) as mine:
            if not mine:  # another pod's download stopped moving: this pod downloads for itself
                return _spooled(client, sha256, watch)
            found = self.get(sha256)
            if found is not None:
                return found
            with part.open("w+b") as f:
                size = client.download_artifact_to(sha256, f, watch)
                if size > self.max_bytes:  # never admitted: it would evict everything else
                    artifact = held(f, sha256, size)
                    part.unlink(missing_ok=True)
                    return artifact
                os.fsync(f.fileno())
                os.chmod(part, 0o644)
                os.replace(part, self.entry(sha256))
                artifact = held(f, sha256, size, self.entry(sha256))
        self.evict(keep=sha256)
        return artifact

    def evict(self, keep: str | None = None) -> list[str]:
        """Remove the least recently used entries (but ``keep``) until the cache holds at most
        ``max_bytes``; returns the sha256 of those removed. A pod reading one keeps its bytes
        (it holds the file open)."""
        removed = []
        with self._lock(self.root / "index.lock"):
            entries = []
            for path in (self.root / "sha256").iterdir():
                with contextlib.suppress(OSError):
                    stat = path.stat()
                    entries.append((stat.st_mtime, path.name, stat.st_size))
            total = sum(size for _, _, size in entries)
            for _, name, size in sorted(entries):
                if total <= self.max_bytes:
                    break
                if name == keep:
                    continue
                with contextlib.suppress(OSError):
                    (self.root / "sha256" / name).unlink()
                    removed.append(name)
                    total -= size
        return removed

    @contextlib.contextmanager
    def _lock(self, path: Path) -> Iterator[None]:
        with path.open("a") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)

    @contextlib.contextmanager
    def _entry_lock(self, sha256: str, part: Path, window_s: float,
                    give_back: Callable[[float], object] | None = None) -> Iterator[bool]:
        """The lock of entry ``sha256`` (``True``), or ``False`` when the pod holding it let
        its download (``part``) stand still for a stall window: waiting is bounded by the
        same progress a download is held to (:mod:`tunecache.store.http.stall`), and the time
        that download moves is given back to this pod's install deadline (``give_back``), as
        the time its own download's body moves would be: a pod waiting for a big artifact
        another pod of the node is fetching does not run out of deadline meanwhile."""
        with (self.root / "locks" / f"{sha256}.lock").open("a") as f:
            last, moved = -1, time.monotonic()
            while True:
                try:
                    fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    pass
                try:
                    size = part.stat().st_size
                except OSError:
                    size = -1
                now = time.monotonic()
                if size != last:
                    if last >= 0 and give_back is not None:  # moved since it last did, within the window
                        give_back(now - moved)
                    last, moved = size, now
                elif now - moved > window_s:
                    yield False
                    return
                time.sleep(0.05)
            try:
                yield True
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _spooled(client: Any, sha256: str, watch: StallWatch) -> ArtifactFile:
    """The artifact downloaded into this process's own spool file (unlinked: no trace on disk)."""
    with spool_file() as f:
        size = client.download_artifact_to(sha256, f, watch)
        return held(f, sha256, size)


def fetch_artifacts(client: Any, shas: list[str], transfer: Transfer | None = None,
                    cache: NodeCache | None = None) -> list[ArtifactFile]:
    """:func:`fetch_artifact` of each of ``shas``, in their order, at most
    ``TUNECACHE_DOWNLOADS`` at once (4 by default; each on a client of its own,
    :meth:`~tunecache.store.http.artifacts.ArtifactsClient.download_sibling`).

    Raises:
        the first error of :func:`fetch_artifact` (after the downloads under way are done)."""
    workers = min(positive_whole_setting("TUNECACHE_DOWNLOADS", DEFAULT_DOWNLOADS), len(shas))
    if workers <= 1 or not hasattr(client, "download_sibling"):
        return [fetch_artifact(client, sha, transfer, cache) for sha in shas]
    from concurrent.futures import ThreadPoolExecutor

    lock, clients = threading.Lock(), [client.download_sibling() for _ in range(workers)]
    free = list(clients)

    def one(sha: str) -> ArtifactFile:
        with lock:
            mine = free.pop()
        tally = Transfer()
        try:
            return fetch_artifact(mine, sha, tally, cache)
        finally:
            with lock:
                free.append(mine)
                if transfer is not None:
                    transfer.add(tally)

    began = time.monotonic()
    try:
        with ThreadPoolExecutor(workers, thread_name_prefix="tunecache-download") as pool:
            return list(pool.map(one, shas))
    finally:
        for sibling in clients:
            sibling.close()
        if transfer is not None and transfer.seconds:
            transfer.seconds = min(transfer.seconds, time.monotonic() - began)  # wall time, not the sum


def fetch_artifact(client: Any, sha256: str, transfer: Transfer | None = None,
                   cache: NodeCache | None = None) -> ArtifactFile:
    """The verified artifact ``sha256`` as a file held open: from the node cache (``cache``)
    where it has it, else downloaded (into the cache where there is one, else into a spool file
    of this process), its body held to the deadline that measures progress; ``transfer`` adds
    up what it took.

    Raises:
        as :meth:`tunecache.store.http.artifacts.ArtifactsClient.download_artifact_to`.
    """
    watch = StallWatch()
    began = time.monotonic()
    artifact = cache.fetch(client, sha256, watch) if cache is not None else _spooled(client, sha256, watch)
    if transfer is not None:
        transfer.artifacts += 1
        if watch.received:
            transfer.bytes += watch.received
            transfer.seconds += time.monotonic() - began
        else:
            transfer.from_cache += 1
            transfer.cached_bytes += artifact.size
    return artifact
