"""Where artifact bytes live: one interface (:class:`ArtifactStore`), two implementations.

* :class:`DatabaseStore` (the default, embedded): the bytes are ``artifact_chunks`` rows of
  4 MiB (:mod:`tunecache.service.blobs`, which it wraps).
* :class:`S3Store`: any S3-compatible object store, chosen with
  ``TUNECACHE_ARTIFACT_STORE=s3://bucket/prefix``. The endpoint and the credentials are
  read the way the AWS SDKs read them (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``,
  ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``, or a profile, or an instance role), through
  boto3. An object's key is ``<prefix>/<sha256[:2]>/<sha256>``.

Only the bytes move. The metadata stays in SQL: each blob's ``artifact_blobs`` row (size,
``created_at``, and ``location``, the store its bytes are in), which is what uploads are
idempotent on, what runs refer to and what retention collects. A service whose store is S3
still reads the blobs the database holds (``location`` says where each one is), so a
switch needs no downtime; ``tunecache db move-artifacts`` moves the old ones
(:func:`move_blob`).

An upload into S3 is hashed before anything is written (the route's spooled temporary
file, read twice): bytes that do not hash to their sha256 never reach the bucket, and the
row is written (in the caller's transaction) only after the object is whole. Readers look
the location up in a short transaction and then stream the object without holding a
database connection.

Sessions made by the service's session factory carry its stores (``session.info``,
:func:`stores_of`); elsewhere (the CLI) they are built from the environment.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import BinaryIO
from urllib.parse import urlsplit

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from tunecache.contract import ArtifactStored
from tunecache.service import blobs, dialect
from tunecache.service.models import ArtifactBlob, ArtifactChunk, utcnow

log = logging.getLogger("tunecache")

#: Bytes read, hashed and sent at a time.
PART_BYTES = blobs.CHUNK_BYTES
#: Uploads larger than this go to S3 as multipart uploads, in parts of this size.
MULTIPART_BYTES = 8 * 1024 * 1024


class StoreNotConfigured(RuntimeError):
    """A blob's bytes are in a store this process was not configured with."""


class ArtifactStoreUnavailable(RuntimeError):
    """The object store could not be reached or failed (the request may be retried)."""


class ArtifactStore(ABC):
    """Where the bytes of blobs are kept. Metadata (the ``artifact_blobs`` row) is the
    caller's: a store writes, reads and deletes bytes only."""

    #: What ``artifact_blobs.location`` says of a blob whose bytes are here.
    location: str = ""

    @abstractmethod
    def describe(self) -> str:
        """The store in a few words, for logs and the CLI (no credentials)."""

    @abstractmethod
    def store(self, session: Session, stream: BinaryIO, sha256: str) -> ArtifactStored:
        """Store new bytes under ``sha256`` and add their row (in ``session``'s transaction).

        Raises:
            blobs.DigestMismatch: the bytes hash to something else (nothing is stored).
        """

    @abstractmethod
    def copy_in(self, session: Session, stream: BinaryIO, sha256: str) -> int:
        """Write the bytes of an existing blob (its row is there, recording another store)
        here, verified; returns their size. Used by :func:`move_blob`.

        Raises:
            blobs.DigestMismatch.
        """

    @abstractmethod
    def iter_bytes(self, session: Session, sha256: str) -> Iterator[bytes]:
        """The blob's bytes in order, a part at a time."""

    @abstractmethod
    def delete(self, session: Session, sha256: str) -> None:
        """Delete the blob's bytes here (not its row); nothing there is not an error."""

    def holds(self, session: Session, sha256: str) -> bool:
        """Whether bytes of the blob are here (a move's leftovers are looked for so)."""
        return True

    def presigned_url(self, sha256: str, expires_s: int) -> str | None:
        """A URL the bytes can be fetched from directly for ``expires_s`` seconds, or
        ``None`` where the store has none (the service sends the bytes itself)."""
        return None


class DatabaseStore(ArtifactStore):
    """The bytes as ``artifact_chunks`` rows (:mod:`tunecache.service.blobs`)."""

    location = blobs.LOCATION

    def describe(self) -> str:
        return "database"

    def store(self, session: Session, stream: BinaryIO, sha256: str) -> ArtifactStored:
        return blobs.store_blob(session, stream, sha256)

    def copy_in(self, session: Session, stream: BinaryIO, sha256: str) -> int:
        return blobs.write_chunks(session, stream, sha256)

    def iter_bytes(self, session: Session, sha256: str) -> Iterator[bytes]:
        return blobs.iter_blob(session, sha256)

    def delete(self, session: Session, sha256: str) -> None:
        blobs.delete_chunks(session, sha256)

    def holds(self, session: Session, sha256: str) -> bool:
        return blobs.read_chunk(session, sha256, 0) is not None


def _hash_stream(stream: BinaryIO) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    while part := stream.read(PART_BYTES):
        digest.update(part)
        size += len(part)
    return digest.hexdigest(), size


class _Seekable:
    """``stream`` itself when it can be read twice, else a temporary file holding it."""

    def __init__(self, stream: BinaryIO):
        self.stream, self._spool = stream, None

    def __enter__(self) -> BinaryIO:
        try:
            start = self.stream.tell()
            self.stream.seek(start)
            self._start = start
            return self.stream
        except (AttributeError, OSError, ValueError):
            self._spool = tempfile.SpooledTemporaryFile(max_size=MULTIPART_BYTES)
            shutil.copyfileobj(self.stream, self._spool, PART_BYTES)
            self._spool.seek(0)
            self._start = 0
            return self._spool

    def __exit__(self, *exc: object) -> None:
        if self._spool is not None:
            self._spool.close()


class S3Store(ArtifactStore):
    """Objects in an S3-compatible store: ``s3://bucket/prefix`` (the prefix may be empty).

    Args:
        url: ``s3://bucket[/prefix]``.
        client: a boto3 S3 client (default: one made from the environment, as the AWS SDKs
            read it: :func:`s3_client`).
    """

    location = "s3"

    def __init__(self, url: str, client=None):
        parts = urlsplit(url)
        if parts.scheme != "s3" or not parts.netloc:
            raise ValueError(f"artifact store {url!r} must look like s3://bucket/prefix")
        self.url = url
        self.bucket = parts.netloc
        self.prefix = parts.path.strip("/")
        self._client = client

    @property
    def client(self):
        if self._client is None:
            self._client = s3_client()
        return self._client

    def describe(self) -> str:
        endpoint = self.client.meta.endpoint_url
        return f"{self.url} at {endpoint}"

    def key(self, sha256: str) -> str:
        """The object key of a blob: ``<prefix>/<sha256[:2]>/<sha256>``."""
        return "/".join(p for p in (self.prefix, sha256[:2], sha256) if p)

    def _unavailable(self, exc: Exception, doing: str) -> ArtifactStoreUnavailable:
        return ArtifactStoreUnavailable(f"object store {self.url}: {doing} failed: {type(exc).__name__}: "
                                        f"{str(exc).splitlines()[0] if str(exc) else ''}")

    def _put(self, stream: BinaryIO, sha256: str, size: int) -> None:
        """Upload the (already verified) bytes to the blob's key, multipart past
        :data:`MULTIPART_BYTES`, and check that the object is whole."""
        from boto3.s3.transfer import TransferConfig
        from botocore.exceptions import BotoCoreError, ClientError

        config = TransferConfig(multipart_threshold=MULTIPART_BYTES, multipart_chunksize=MULTIPART_BYTES,
                                max_concurrency=4)
        try:
            self.client.upload_fileobj(stream, self.bucket, self.key(sha256), Config=config,
                                       ExtraArgs={"ContentType": "application/octet-stream"})
            stored = self.client.head_object(Bucket=self.bucket, Key=self.key(sha256))["ContentLength"]
        except (BotoCoreError, ClientError) as exc:
            raise self._unavailable(exc, f"upload of {sha256}") from exc
        if stored != size:
            raise ArtifactStoreUnavailable(f"object store {self.url}: {sha256} stored as {stored} bytes, not {size}")

    def _verified_put(self, stream: BinaryIO, sha256: str) -> int:
        with _Seekable(stream) as seekable:
            start = seekable.tell()
            digest, size = _hash_stream(seekable)
            if digest != sha256:
                raise blobs.DigestMismatch(f"body hashes to sha256 {digest}, not {sha256}")
            seekable.seek(start)
            self._put(seekable, sha256, size)
        return size

    def store(self, session: Session, stream: BinaryIO, sha256: str) -> ArtifactStored:
        size = self._verified_put(stream, sha256)
        dialect.insert_or_ignore(
            session, ArtifactBlob.__table__,
            {"sha256": sha256, "size_bytes": size, "created_at": utcnow(), "location": self.location}, ["sha256"])
        session.flush()
        return ArtifactStored(sha256=sha256, size_bytes=size, created=True)

    def copy_in(self, session: Session, stream: BinaryIO, sha256: str) -> int:
        return self._verified_put(stream, sha256)

    def iter_bytes(self, session: Session | None, sha256: str) -> Iterator[bytes]:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            body = self.client.get_object(Bucket=self.bucket, Key=self.key(sha256))["Body"]
        except (BotoCoreError, ClientError) as exc:
            raise self._unavailable(exc, f"read of {sha256}") from exc
        try:
            yield from body.iter_chunks(PART_BYTES)
        except (BotoCoreError, ClientError) as exc:
            raise self._unavailable(exc, f"read of {sha256}") from exc
        finally:
            body.close()

    def delete(self, session: Session | None, sha256: str) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.delete_object(Bucket=self.bucket, Key=self.key(sha256))
        except (BotoCoreError, ClientError) as exc:
            raise self._unavailable(exc, f"deletion of {sha256}") from exc

    def holds(self, session: Session | None, sha256: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.head_object(Bucket=self.bucket, Key=self.key(sha256))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise
        return True

    def presigned_url(self, sha256: str, expires_s: int) -> str:
        return self.client.generate_presigned_url(
            "get_object", Params={"Bucket": self.bucket, "Key": self.key(sha256)}, ExpiresIn=int(expires_s))


def s3_client():
    """A boto3 S3 client configured the way the AWS SDKs read the environment:
    ``AWS_ENDPOINT_URL`` (or ``AWS_ENDPOINT_URL_S3``) for a store other than AWS's, then
    path-style addressing (what self-hosted stores answer); ``AWS_ACCESS_KEY_ID`` /
    ``AWS_SECRET_ACCESS_KEY`` (or a profile, or an instance role); ``AWS_REGION`` (else
    ``AWS_DEFAULT_REGION``, else us-east-1). Short timeouts: a store that is down fails a
    request in seconds, not minutes."""
    import boto3
    from botocore.config import Config

    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    config = Config(
        signature_version="s3v4",
        s3={"addressing_style": "path" if endpoint else "auto"},
        connect_timeout=3, read_timeout=30,
        retries={"max_attempts": 2, "mode": "standard"},
        max_pool_connections=32,
    )
    return boto3.session.Session().client("s3", region_name=region, endpoint_url=endpoint or None, config=config)


class ArtifactStores:
    """The store new bytes go to (``default``) and every store this process can read from:
    the database always, and the object store when one is configured."""

    def __init__(self, default: ArtifactStore, *others: ArtifactStore):
        self.default = default
        self._by_location = {store.location: store for store in (*others, default)}
        self._by_location.setdefault(blobs.LOCATION, DatabaseStore())

    @property
    def database(self) -> ArtifactStore:
        return self._by_location[blobs.LOCATION]

    @property
    def locations(self) -> frozenset[str]:
        """The locations this process can read blobs from (``artifact_blobs.location``)."""
        return frozenset(self._by_location)

    @property
    def object_store(self) -> S3Store | None:
        store = self._by_location.get(S3Store.location)
        return store if isinstance(store, S3Store) else None

    def at(self, location: str) -> ArtifactStore:
        """The store of ``location``.

        Raises:
            StoreNotConfigured: that store is not configured here.
        """
        store = self._by_location.get(location)
        if store is None:
            raise StoreNotConfigured(f"artifact bytes are in the {location!r} store, and this process has none "
                                     "(set TUNECACHE_ARTIFACT_STORE and the AWS_* variables)")
        return store


def stores_for_url(url: str | None) -> ArtifactStores:
    """The stores of ``TUNECACHE_ARTIFACT_STORE``'s value (``None``, empty or ``database``:
    the database alone).

    Raises:
        ValueError: not ``s3://bucket[/prefix]`` nor ``database``.
    """
    if not url or url == "database":
        return ArtifactStores(DatabaseStore())
    return ArtifactStores(S3Store(url))


@functools.lru_cache(maxsize=8)
def _environment_stores(url: str | None) -> ArtifactStores:
    return stores_for_url(url)


def stores_of(session: Session) -> ArtifactStores:
    """The stores of the session's factory (the service's: ``session.info``), else those
    the environment's ``TUNECACHE_ARTIFACT_STORE`` names."""
    stores = session.info.get("artifact_stores")
    if stores is None:
        stores = _environment_stores(os.environ.get("TUNECACHE_ARTIFACT_STORE") or None)
    return stores


# --- what callers use: metadata from SQL, bytes from the blob's store ---------------------------


def locate(session: Session, sha256: str, hold: bool = False) -> tuple[int, str] | None:
    """``(size, location)`` of a stored blob, or ``None`` if none is stored.

    ``hold``: on PostgreSQL, key-share lock the row to the end of the transaction, so that a
    move (:func:`move_blob`, which locks it for update) cannot delete the chunks a reader of
    the database's bytes is reading, and a reader that waited for a move reads where the
    blob went (SQLite's read transactions see one snapshot anyway)."""
    query = select(ArtifactBlob.size_bytes, ArtifactBlob.location).where(ArtifactBlob.sha256 == sha256)
    if hold:
        query = query.with_for_update(read=True, key_share=True)
    row = session.execute(query).first()
    return (row[0], row[1]) if row is not None else None


def blob_size(session: Session, sha256: str) -> int | None:
    """Size in bytes of a stored blob, or ``None`` if it is not stored."""
    return blobs.blob_size(session, sha256)


def store_blob(session: Session, stream: BinaryIO, expected_sha256: str) -> ArtifactStored:
    """Store the bytes read from ``stream`` under ``expected_sha256`` in the configured store,
    or, when the blob is stored already (wherever), only hash them (and renew its
    ``created_at``: :func:`tunecache.service.blobs.store_blob`). Idempotent.

    Raises:
        blobs.DigestMismatch: nothing is stored (the caller rolls back).
        ArtifactStoreUnavailable: the object store failed.
    """
    store = stores_of(session).default
    if store.location == blobs.LOCATION or session.get(ArtifactBlob, expected_sha256) is not None:
        return blobs.store_blob(session, stream, expected_sha256)
    return store.store(session, stream, expected_sha256)


def iter_blob(session: Session, sha256: str) -> Iterator[bytes]:
    """A stored blob's bytes in order (nothing when none is stored)."""
    found = locate(session, sha256, hold=True)
    if found is None:
        return iter(())
    return stores_of(session).at(found[1]).iter_bytes(session, sha256)


def read_blob(session: Session, sha256: str) -> bytes | None:
    """The whole blob, or ``None`` if it is not stored (for small blobs)."""
    found = locate(session, sha256, hold=True)
    if found is None:
        return None
    return b"".join(stores_of(session).at(found[1]).iter_bytes(session, sha256))


def presigned_url(session: Session, sha256: str, expires_s: int) -> tuple[int, str | None] | None:
    """``(size, URL)`` of a stored blob: the URL its store signs for ``expires_s`` seconds,
    ``None`` for a blob in the database. ``None`` if it is not stored."""
    found = locate(session, sha256)
    if found is None:
        return None
    size, location = found
    return size, stores_of(session).at(location).presigned_url(sha256, expires_s)


def delete_bytes(stores: ArtifactStores, session: Session, sha256: str, location: str) -> None:
    """Delete a collected blob's bytes from an object store (the database's chunks go with
    the row: ``ON DELETE CASCADE``). The caller has committed the row's deletion first: bytes
    are never deleted while a row refers to them."""
    if location != blobs.LOCATION:
        stores.at(location).delete(session, sha256)


def move_blob(session: Session, stores: ArtifactStores, sha256: str, to: ArtifactStore) -> str | None:
    """Move one blob's bytes into ``to``: copied (verified against its sha256) and its
    ``location`` set, in ``session``'s transaction (the blob's row locked meanwhile), which
    the caller commits before it deletes the source's copy with
    :meth:`ArtifactStore.delete`; chunks in the database are deleted in the same transaction
    already. Returns the location it moved from (``None``: it is in ``to`` already, or no
    longer stored).

    Each step is safe to repeat, so a move killed anywhere loses nothing and a new one
    finishes it: before the commit the row names the source, which has the bytes (what
    was copied is written again); after it, the row names the target, which has them, and
    an object left in the store is a leftover (:func:`delete_leftovers`).

    Raises:
        blobs.DigestMismatch: the source's bytes are not the blob's (nothing changes).
        ArtifactStoreUnavailable, StoreNotConfigured.
    """
    row = session.execute(select(ArtifactBlob.location).where(ArtifactBlob.sha256 == sha256)
                          .with_for_update()).first()
    if row is None or row[0] == to.location:
        return None
    source = stores.at(row[0])
    with tempfile.SpooledTemporaryFile(max_size=MULTIPART_BYTES) as spool:
        for part in source.iter_bytes(session, sha256):
            spool.write(part)
        spool.seek(0)
        to.copy_in(session, spool, sha256)
    session.execute(update(ArtifactBlob).where(ArtifactBlob.sha256 == sha256).values(location=to.location))
    if source.location == blobs.LOCATION:
        source.delete(session, sha256)
    return source.location


def delete_leftovers(session: Session, stores: ArtifactStores) -> int:
    """Delete bytes a killed move left behind in the store its blob moved from: chunks of
    blobs in the object store, objects of blobs in the database (never an object without
    a row: that may be an upload about to record its row). Returns how many."""
    deleted = 0
    moved_out = select(ArtifactBlob.sha256).where(ArtifactBlob.location != blobs.LOCATION)
    deleted += session.execute(
        ArtifactChunk.__table__.delete().where(ArtifactChunk.sha256.in_(moved_out))).rowcount or 0
    store = stores.object_store
    if store is None:
        return deleted
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        pages = store.client.get_paginator("list_objects_v2").paginate(
            Bucket=store.bucket, Prefix=f"{store.prefix}/" if store.prefix else "")
        keys = {key["Key"].rsplit("/", 1)[-1]: key["Key"] for page in pages for key in page.get("Contents", [])}
    except (BotoCoreError, ClientError) as exc:
        raise store._unavailable(exc, "listing") from exc
    shas = [sha for sha in keys if len(sha) == 64]
    for start in range(0, len(shas), 500):
        batch = shas[start:start + 500]
        for sha in session.scalars(select(ArtifactBlob.sha256).where(ArtifactBlob.sha256.in_(batch),
                                                                     ArtifactBlob.location == blobs.LOCATION)):
            store.delete(None, sha)
            deleted += 1
    return deleted
