"""Artifacts read while they arrive: an install unpacks each of a run's tarballs from the file its
download is writing, as the bytes come, instead of waiting for the whole file; the downloads of
one install run at once in the background (at most ``TUNECACHE_DOWNLOADS``).

:func:`start_downloads` starts them and gives one :class:`ArrivingArtifact` per artifact, a
:data:`tunecache.formats.tarball.TarSource` like an :class:`~tunecache.client.artifact_file.ArtifactFile`:
each :meth:`ArrivingArtifact.open` gives a reader of its own that waits for bytes the download has
not written yet and ends (EOF) only once the whole artifact arrived and its sha256 checked. What
it reads before then is not yet verified: a destination unpacks it into a staging directory
with every entry checked as usual (:mod:`tunecache.client.unpack`), and
:func:`tunecache.client.install.install` renames nothing in before :meth:`Downloads.settle`
said every artifact checked. A download that fails fails every reader of it with its error; one
that starts over (a transient error midway, :meth:`~tunecache.store.http.artifacts.ArtifactsClient.download_artifact_to`'s
retries) fails a reader already past its first bytes with :class:`DownloadRestarted` (the bytes
read may not be those of the artifact): the install then stages again from the finished files.
"""

from __future__ import annotations

import io
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import IO, Any

from tunecache.client.artifact_file import READ_BUFFER_BYTES, ArtifactFile
from tunecache.formats.tarball import positive_whole_setting
from tunecache.store import TunecacheError

#: Default of ``TUNECACHE_DOWNLOADS``: artifacts of one install downloaded at once.
DEFAULT_DOWNLOADS = 4


#: A reader waiting for bytes is woken once this many are there (or the artifact's end): not at
#: every part a download writes.
WAKE_BYTES = 256 << 10


class DownloadRestarted(TunecacheError):
    """A download started over after a reader had read some of its bytes: what it read may not be
    the artifact's, so that reader stops (the install stages again from the finished file)."""


class DownloadCancelled(TunecacheError):
    """The install no longer needs the download (another part of it failed)."""


class Growing:
    """The state of one download into a file, shared by the thread writing it and its readers:
    the file's descriptor, the bytes written by the current attempt, the attempt's number, and
    at the end the verified :class:`ArtifactFile` or the error."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.fd: int | None = None
        self.written = 0
        self.attempt = 0
        self.done: ArtifactFile | None = None
        self.error: BaseException | None = None
        self.cancelled = False
        self._wanted = 0  # the end a waiting reader waits for (0: none waits)

    def writer(self, f: IO[bytes]) -> IO[bytes]:
        """``f`` (the file the download writes) as the download's ``out``: each part written is
        flushed and told to the readers; emptying it starts a new attempt."""
        with self._cond:
            if self.fd is None:
                self.fd = os.dup(f.fileno())
        return _TellingFile(f, self)  # type: ignore[return-value]

    def wrote(self, count: int) -> None:
        with self._cond:
            if self.cancelled:
                raise DownloadCancelled("download cancelled: the install stopped")
            self.written += count
            if self._wanted and self.written >= self._wanted:
                self._wanted = 0
                self._cond.notify_all()

    def restarted(self) -> None:
        with self._cond:
            self.attempt += 1
            self.written = 0
            self._cond.notify_all()

    def finish(self, artifact: ArtifactFile | None, error: BaseException | None = None) -> None:
        with self._cond:
            self.done, self.error = artifact, error
            self._cond.notify_all()

    def cancel(self) -> None:
        with self._cond:
            self.cancelled = True
            self._cond.notify_all()

    def wait_for(self, offset: int, attempt: int, want: int) -> tuple[int, int | None, int]:
        """Wait until ``want`` bytes past ``offset`` can be read (fewer at the artifact's end):
        returns (the readable end, the descriptor to read from (``None``: the end of the
        artifact), the attempt it is of). Readers are woken once their bytes are there, not at
        every part written.

        Raises:
            the download's error; DownloadRestarted: the attempt changed after ``offset`` > 0."""
        with self._cond:
            while True:
                if self.error is not None:
                    raise self.error
                if offset > 0 and self.attempt != attempt:
                    raise DownloadRestarted("the download started over after part of it was read")
                if self.done is not None:
                    return self.done.size, None, self.attempt
                if self.cancelled:
                    raise DownloadCancelled("download cancelled: the install stopped")
                if self.written >= offset + want and self.fd is not None:
                    return self.written, self.fd, self.attempt
                self._wanted = offset + want if not self._wanted else min(self._wanted, offset + want)
                self._cond.wait(1.0)

    def __del__(self) -> None:
        # Closed only when no reader holds this state any more: a reader may be about to read
        # the descriptor (a number closed earlier could name another file by then).
        if self.fd is not None:
            os.close(self.fd)


class _TellingFile:
    """The download's view of its file (:meth:`Growing.writer`)."""

    def __init__(self, f: IO[bytes], growing: Growing):
        self._f, self._growing = f, growing

    def write(self, part: bytes) -> int:
        self._f.write(part)
        self._f.flush()
        self._growing.wrote(len(part))
        return len(part)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._f.seek(offset, whence)

    def truncate(self, size: int | None = None) -> int:
        self._growing.restarted()  # first: a reader that reads what the truncation changes sees the new attempt
        return self._f.truncate(size)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)


class _ArrivingReader(io.RawIOBase):
    """An arriving artifact's bytes from its start, waiting for those not yet written."""

    def __init__(self, growing: Growing):
        super().__init__()
        self._growing, self._offset, self._attempt = growing, 0, growing.attempt
        self._file: IO[bytes] | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        if self._file is not None:
            return self._file.readinto(buffer)  # type: ignore[attr-defined]
        end, fd, attempt = self._growing.wait_for(self._offset, self._attempt, min(len(buffer), WAKE_BYTES))
        self._attempt = attempt
        if fd is None:  # the whole artifact is here and verified: read the rest from it
            assert self._growing.done is not None
            self._file = self._growing.done.open()
            self._file.seek(self._offset)
            return self._file.readinto(buffer)  # type: ignore[attr-defined]
        count = os.preadv(fd, [memoryview(buffer)[:end - self._offset]], self._offset)  # into the buffer: no copy
        if self._growing.attempt != attempt:  # read while the download started over: maybe not its bytes
            raise DownloadRestarted("the download started over while part of it was read")
        self._offset += count
        return count

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        super().close()


class ArrivingArtifact:
    """An artifact (``sha256``) whose download may still be under way (:func:`start_downloads`)."""

    def __init__(self, sha256: str, growing: Growing, future: Future[ArtifactFile]):
        self.sha256, self._growing, self._future = sha256, growing, future

    def open(self) -> IO[bytes]:
        """A reader of the bytes from their start, waiting for those still to arrive (see the
        module's docstring: EOF only after the sha256 checked)."""
        return io.BufferedReader(_ArrivingReader(self._growing), READ_BUFFER_BYTES)

    def result(self) -> ArtifactFile:
        """The verified artifact, once its download finished.

        Raises:
            the download's error."""
        return self._future.result()

    def __repr__(self) -> str:
        return f"ArrivingArtifact({self.sha256[:12]}, {'done' if self._future.done() else 'arriving'})"


Fetch = Callable[[Any, str, Growing], ArtifactFile]


class Downloads:
    """The downloads of one install, under way in the background."""

    def __init__(self, artifacts: list[ArrivingArtifact], pool: ThreadPoolExecutor | None,
                 finished: Callable[[], None]):
        self.artifacts, self._pool, self._finished = artifacts, pool, finished

    def settle(self) -> list[ArtifactFile]:
        """Every artifact, verified, in order, once all downloads finished.

        Raises:
            the first download's error (after the others finished)."""
        errors, files = [], []
        for artifact in self.artifacts:
            try:
                files.append(artifact.result())
            except BaseException as exc:  # noqa: BLE001 - the first is raised once all are done
                errors.append(exc)
        self.close()
        if errors:
            raise next((e for e in errors if not isinstance(e, DownloadCancelled)), errors[0])
        return files

    def cancel(self) -> None:
        """Stop the downloads still under way (their readers fail with :class:`DownloadCancelled`)."""
        for artifact in self.artifacts:
            artifact._growing.cancel()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
            self._finished()


def start_downloads(client: Any, shas: list[str], fetch: Fetch, workers: int | None = None) -> Downloads:
    """``fetch(client, sha256, growing)`` of each of ``shas`` in the background, at most
    ``workers`` (``TUNECACHE_DOWNLOADS``, 4 by default) at once, each on a client of its own
    (:meth:`~tunecache.store.http.artifacts.ArtifactsClient.download_sibling`, made now: inside
    the install deadline as it stands), closed once all are done."""
    count = workers or min(positive_whole_setting("TUNECACHE_DOWNLOADS", DEFAULT_DOWNLOADS), max(len(shas), 1))
    siblings = hasattr(client, "download_sibling") and count > 1
    clients = [client.download_sibling() for _ in range(count)] if siblings else [client]
    free, lock = list(clients), threading.Lock()
    pool = ThreadPoolExecutor(count if siblings else 1, thread_name_prefix="tunecache-download")

    def one(sha: str, growing: Growing) -> ArtifactFile:
        with lock:
            mine = free.pop()
        try:
            artifact = fetch(mine, sha, growing)
        except BaseException as exc:
            growing.finish(None, exc)
            raise
        finally:
            with lock:
                free.append(mine)
        growing.finish(artifact)
        return artifact

    def finished() -> None:
        if siblings:
            for sibling in clients:
                sibling.close()

    growings = [Growing() for _ in shas]
    artifacts = [ArrivingArtifact(sha, growing, pool.submit(one, sha, growing)) for sha, growing in zip(shas, growings)]
    return Downloads(artifacts, pool, finished)
