"""Artifacts (``/v1/artifacts/{sha256}``): content-addressed bytes, downloaded verified
(through the object store's presigned URL where the service redirects) and uploaded once."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import httpx
from pydantic import ValidationError

from tunecache.store.http.answers import answer_detail, body_detail
from tunecache.store.http import routes
from tunecache.store.http.routes import calls
from tunecache.store.http.stall import StallWatch
from tunecache.store.http.failures import Transient, transient_status
from tunecache.store.http.transport import RETRY_STATUSES, TransferCallback, Transport
from tunecache.contract import ArtifactStored, Health
from tunecache.formats.tarball import max_unpack_bytes
from tunecache.store import ArtifactCorrupt, DownloadTruncated, ServerError, file_sha256

#: Answers that send an artifact download elsewhere (the object store's presigned URL).
_REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})


class ArtifactsClient(Transport):
    """The artifact bytes of a tunecache server (:mod:`tunecache.service.routes.artifacts`)."""

    @calls(routes.GET_ARTIFACT)
    def download_artifact(self, sha256: str) -> bytes:
        """``GET /v1/artifacts/{sha256}``, streamed and verified against ``sha256``.

        A service whose artifacts are in an object store may answer with a redirect to a
        presigned URL of the store (``TUNECACHE_ARTIFACT_REDIRECT``): it is followed (one
        hop, to an http(s) URL only, without the ``Authorization`` header), within the same
        attempt, timeouts and install deadline, and the bytes are checked the same way. A
        store that refuses the URL (expired) or fails is retried from the service, which
        signs a new one.

        Raises:
            DownloadTruncated: the body stopped short (after retries).
            ArtifactCorrupt: the bytes hash to something else (nothing is returned).
            InstallDeadlineExceeded: inside :meth:`deadline_scope`, the deadline passed first.
            ServerUnreachable, ServerError.
        """
        method, where = routes.GET_ARTIFACT.call(sha256=sha256)

        def once() -> bytes:
            digest = hashlib.sha256()

            def read(response: httpx.Response, deadline: float) -> tuple[str | None, bytes]:
                if response.status_code in RETRY_STATUSES:
                    raise transient_status(response, body_detail(self._read_body(response, deadline)))
                if response.is_error:
                    raise self.error_of(response.status_code, body_detail(self._read_body(response, deadline)))
                return response.headers.get("content-length"), self._read_body(response, deadline, sink=digest.update,
                                                                               max_bytes=max_unpack_bytes(), transfer=True)

            def read_or_redirect(response: httpx.Response, deadline: float) -> tuple[str | None, bytes] | httpx.URL:
                if response.status_code in _REDIRECT_STATUSES:
                    return self._redirect_target(response, sha256)
                return read(response, deadline)

            def read_from_store(response: httpx.Response, deadline: float) -> tuple[str | None, bytes]:
                if response.status_code in _REDIRECT_STATUSES:
                    raise ServerError(response.status_code, f"the artifact store redirected {sha256} again: not followed")
                if response.is_error:  # an expired URL (403), a store failing: the service signs a new one
                    body = self._read_body(response, deadline, max_bytes=64 * 1024)
                    raise Transient(ServerError(response.status_code,
                                                 f"artifact store answered {response.status_code} for {sha256}: "
                                                 f"{body[:200].decode(errors='replace')}"))
                return read(response, deadline)

            answer = self._exchange(method, where, read_or_redirect)
            if isinstance(answer, httpx.URL):
                answer = self._exchange(method, where, read_from_store, elsewhere=answer)
            expected, data = answer
            if expected is not None and len(data) != int(expected):
                raise Transient(DownloadTruncated(f"artifact {sha256}: received {len(data)} of {expected} bytes"))
            if digest.hexdigest() != sha256:
                raise ArtifactCorrupt(f"artifact {sha256} arrived as {len(data)} bytes hashing to {digest.hexdigest()}")
            return data

        return self._retrying(once)

    @calls(routes.GET_ARTIFACT)
    def download_artifact_to(self, sha256: str, out: IO[bytes], watch: StallWatch | None = None) -> int:
        """``GET /v1/artifacts/{sha256}`` streamed into the file ``out`` as it arrives (never
        whole in memory), hashed on the way; returns its size. As :meth:`download_artifact`
        (the redirect, retries: ``out`` is emptied before each attempt; one with a
        ``begin_attempt(digest)`` is told instead, given the attempt's sha256 as it will run,
        and asked only ``write``, ``tell`` and ``flush``) except for its
        deadline: the body is held to a deadline that measures progress, not a total
        (:mod:`tunecache.store.http.stall`; ``watch`` counts what arrived).

        Raises:
            ArtifactCorrupt, DownloadTruncated (``out`` then holds bytes nothing may use);
            DownloadStalled: the body stopped moving; InstallDeadlineExceeded: no answer
            before the install deadline; ServerUnreachable, ServerError.
        """
        method, where = routes.GET_ARTIFACT.call(sha256=sha256)
        limit = max_unpack_bytes()

        def once() -> int:
            digest = hashlib.sha256()
            begin = getattr(out, "begin_attempt", None)
            if begin is not None:  # a sink that is not a file (tunecache.client.artifact_stream)
                begin(digest)
            else:
                out.seek(0)
                out.truncate()
            attempt = StallWatch(watch.window_s, watch.min_rate) if watch is not None else StallWatch()

            def sink(part: bytes) -> None:
                digest.update(part)
                out.write(part)

            def read(response: httpx.Response, deadline: float) -> str | None:
                if response.status_code in RETRY_STATUSES:
                    raise transient_status(response, body_detail(self._read_body(response, deadline)))
                if response.is_error:
                    raise self.error_of(response.status_code, body_detail(self._read_body(response, deadline)))
                self._read_body(response, deadline, sink=sink, max_bytes=limit, watch=attempt, keep=False,
                                transfer=True)
                return response.headers.get("content-length")

            def read_or_redirect(response: httpx.Response, deadline: float) -> str | None | httpx.URL:
                if response.status_code in _REDIRECT_STATUSES:
                    return self._redirect_target(response, sha256)
                return read(response, deadline)

            def read_from_store(response: httpx.Response, deadline: float) -> str | None:
                if response.status_code in _REDIRECT_STATUSES:
                    raise ServerError(response.status_code, f"the artifact store redirected {sha256} again: not followed")
                if response.is_error:
                    body = self._read_body(response, deadline, max_bytes=64 * 1024)
                    raise Transient(ServerError(response.status_code, f"artifact store answered {response.status_code} "
                                                                      f"for {sha256}: {body[:200].decode(errors='replace')}"))
                return read(response, deadline)

            try:
                expected = self._exchange(method, where, read_or_redirect, watch=attempt)
                if isinstance(expected, httpx.URL):
                    expected = self._exchange(method, where, read_from_store, elsewhere=expected, watch=attempt)
            finally:
                if watch is not None:
                    watch.received += attempt.received
            size = out.tell()
            if expected is not None and size != int(expected):
                raise Transient(DownloadTruncated(f"artifact {sha256}: received {size} of {expected} bytes"))
            if digest.hexdigest() != sha256:
                raise ArtifactCorrupt(f"artifact {sha256} arrived as {size} bytes hashing to {digest.hexdigest()}")
            out.flush()
            return size

        return self._retrying(once)

    def download_sibling(self) -> "ArtifactsClient":
        """A client for one more download at once from another thread: this client's server,
        token, TLS, timeouts and attempts, inside the same install deadline (as it stands now;
        the time its own bodies move is given back to its copy). The caller closes it."""
        t = self._timeout
        sibling = type(self)(self.base_url, connect_timeout_s=t.connect, read_timeout_s=self.read_timeout_s,
                             total_timeout_s=self.total_timeout_s, attempts=self.attempts,
                             max_retry_after_s=self.max_retry_after_s, install_deadline_s=self.install_deadline_s,
                             **({"reports": False} if hasattr(self, "reports") else {}), **self._connection_options)
        sibling._deadline, sibling._deadline_s = self._deadline, self._deadline_s
        sibling.on_transfer = self.on_transfer  # one progress for every download of the install
        return sibling

    def _redirect_target(self, response: httpx.Response, sha256: str) -> httpx.URL:
        """Where a redirect of an artifact download points (resolved against the service's
        URL).

        Raises:
            ServerError: no ``Location``, or one that is not an http(s) URL (never followed).
        """
        location = response.headers.get("location")
        try:
            target = response.request.url.join(location) if location else None
        except httpx.InvalidURL:
            target = None
        if target is None or target.scheme not in ("http", "https") or not target.host:
            raise ServerError(response.status_code, f"artifact {sha256}: redirect to {location!r} not followed "
                                                    "(only to an http or https URL)")
        return target

    @calls(routes.HAS_ARTIFACT, routes.PUT_ARTIFACT)
    def upload_file(self, path: Path, again: bool = False) -> str:
        """Upload a file's bytes streamed from disk (never whole in memory), unless the
        server already has them (``HEAD``; ``again``: uploaded without asking, for bytes a
        record found missing); returns the sha256.

        Raises:
            ServerUnreachable, ServerError.
        """
        sha256 = file_sha256(path)
        if not again and self._request(*routes.HAS_ARTIFACT.call(sha256=sha256)).status_code == 200:
            return sha256

        def once() -> httpx.Response:
            method, where = routes.PUT_ARTIFACT.call(sha256=sha256)
            end, timeout = self._attempt_window(method, where)
            try:
                with path.open("rb") as f:
                    size = path.stat().st_size
                    content = f if self.on_transfer is None else _told_parts(f, size, self.on_transfer)
                    response = self._http.put(where, content=content, timeout=timeout,
                                              headers={"Content-Length": str(size)})
            except httpx.HTTPError as exc:
                raise self._failed(exc, method, where, end, answered=False) from None
            if response.status_code in RETRY_STATUSES:
                raise transient_status(response, answer_detail(response))
            return response

        self._answer(self._retrying(once), ArtifactStored)
        return sha256

    @calls(routes.HEALTH)
    def upload_limit(self) -> int | None:
        """The largest upload the server takes (``max_upload_bytes`` of ``GET /v1/health``,
        which the service gives a caller with a token), asked before an upload so that a
        file over it is never sent; ``None`` when the server does not say (an older server,
        no token, an error answer): the upload is tried as before and the server refuses it.

        Raises:
            ServerUnreachable.
        """
        response = self._request(*routes.HEALTH.call())
        if response.status_code != 200:
            return None
        try:
            limit = Health.model_validate_json(response.content).max_upload_bytes
        except ValidationError:
            return None
        return limit if limit is not None and limit > 0 else None

    @calls(routes.PUT_ARTIFACT)
    def upload_artifact(self, data: bytes) -> ArtifactStored:
        """``PUT /v1/artifacts/{sha256}`` of bytes in memory. Idempotent.

        Raises:
            ServerUnreachable, ServerError.
        """
        digest = hashlib.sha256(data).hexdigest()
        content = data if self.on_transfer is None else _TellingBytes(data, self.on_transfer)
        return self._answer(self._request(*routes.PUT_ARTIFACT.call(sha256=digest), content=content,
                                          headers={"Content-Length": str(len(data))}), ArtifactStored)


class _TellingBytes:
    """Bytes to upload, sent in parts, each part told to ``told`` (:data:`TransferCallback`);
    iterable again for a retried attempt."""

    def __init__(self, data: bytes, told: TransferCallback) -> None:
        self._data, self._told = data, told

    def __iter__(self) -> Iterator[bytes]:
        return _told_parts(io.BytesIO(self._data), len(self._data), self._told)


#: Bytes of an upload sent, and told, at a time.
PART = 256 * 1024


def _told_parts(f: IO[bytes], size: int, told: TransferCallback) -> Iterator[bytes]:
    """The file ``f`` (``size`` bytes) sent in parts of :data:`PART`, each part told to ``told``."""
    told(0, size)
    done = 0
    while part := f.read(PART):
        yield part
        done += len(part)
        told(done, size)
