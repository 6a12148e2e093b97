"""A push over the size limit is refused before anything is uploaded (issue 39, Why 8): a 130
MB push was uploaded whole before the 422 (exit 5), and its bytes stayed in the database until
the retention grace ended. Real ``tunecache serve`` processes on SQLite and PostgreSQL."""

from __future__ import annotations

import hashlib
import json
import socket

import httpx
import pytest
from sqlalchemy import func, select

from tests.support.cli import push
from tests.support.paths import CUDNN_FILE
from tests.support.serve import admin_headers, as_admin, scrape, start_server, stop_server
from tunecache.cli_kit import ExitCode
from tunecache.contract import MAX_AUTOTUNE_FILE_BYTES
from tunecache.service import db
from tunecache.service.models import ArtifactBlob

#: The upload limit of the limited server: below CUDNN_FILE's 20,697 bytes.
LIMIT = 10_000


@pytest.fixture
def limited(database_url, tmp_path):
    """A server taking uploads of at most :data:`LIMIT` bytes, its upload spool (``TMPDIR``)
    a directory of the test's own: (URL, spool, database URL)."""
    if database_url.startswith("postgresql"):
        engine = db.create_db_engine(database_url)
        try:
            db.upgrade(engine)
        finally:
            engine.dispose()
    spool = tmp_path / "spool"
    spool.mkdir()
    process, url = start_server(database_url, tmp_path, "limited", TUNECACHE_MAX_UPLOAD_BYTES=str(LIMIT),
                                TMPDIR=str(spool))
    try:
        yield url, spool, database_url
    finally:
        stop_server(process)


def _blobs_stored(database_url: str) -> int:
    engine = db.create_db_engine(database_url)
    try:
        with engine.connect() as connection:
            return connection.scalar(select(func.count()).select_from(ArtifactBlob))
    finally:
        engine.dispose()


def _uploads(server: str) -> float:
    return scrape(server, headers=admin_headers()).total("tunecache_http_requests_total", method="PUT")


def test_a_push_over_the_servers_upload_limit_exits_7_before_uploading(limited):
    server, spool, database_url = limited
    pushed = push(server, CUDNN_FILE)
    assert pushed.returncode == int(ExitCode.BAD_INPUT), pushed.stderr
    assert pushed.stderr.splitlines() == [
        f"tunecache: error: {CUDNN_FILE} is 20,697 bytes; the server takes uploads of at most 10,000 bytes "
        "(its TUNECACHE_MAX_UPLOAD_BYTES); nothing was uploaded"], pushed.stderr
    assert _uploads(server) == 0  # the server received no upload at all
    assert _blobs_stored(database_url) == 0 and list(spool.iterdir()) == []


def test_a_push_over_the_autotune_file_limit_exits_7_before_reading_or_uploading(server, database_url, tmp_path):
    """The issue's 130 MB push: a file FlashInfer would load, over the most the service reads
    of an autotune file (:data:`~tunecache.contract.MAX_AUTOTUNE_FILE_BYTES`; under the
    default upload limit)."""
    doc = json.loads(CUDNN_FILE.read_text())
    first = next(name for name in doc if name != "_metadata")
    big = {"_metadata": doc["_metadata"]}
    for m in range(1, 14_000):  # distinct shapes of one real entry
        big[first.replace("((1, 4096)", f"(({m}, 4096)")] = doc[first]
    path = tmp_path / "big.json"
    path.write_text(json.dumps(big))
    size = path.stat().st_size
    assert size > MAX_AUTOTUNE_FILE_BYTES

    pushed = push(server, path)
    assert pushed.returncode == int(ExitCode.BAD_INPUT), pushed.stderr
    assert pushed.stderr.splitlines() == [
        f"tunecache: error: {path} is {size:,} bytes; a FlashInfer autotune file is at most "
        f"{MAX_AUTOTUNE_FILE_BYTES:,} bytes (the most the service reads of one); nothing was uploaded"], pushed.stderr
    assert _uploads(server) == 0
    assert _blobs_stored(database_url) == 0


def test_a_push_within_the_limit_is_uploaded(limited, tmp_path):
    server, _, database_url = limited
    doc = json.loads(CUDNN_FILE.read_text())
    small = {name: value for i, (name, value) in enumerate(doc.items()) if i < 10}
    path = tmp_path / "small.json"
    path.write_text(json.dumps(small))
    assert path.stat().st_size <= LIMIT
    pushed = push(server, path)
    assert pushed.returncode == 0, pushed.stderr
    assert _uploads(server) == 1 and _blobs_stored(database_url) == 1


def test_the_upload_route_answers_413_before_the_body_arrives(limited):
    """A declared ``Content-Length`` over the limit is answered at once: the body is never
    sent (a raw socket sends the headers only, and the answer comes)."""
    server, spool, database_url = limited
    host, port = server.removeprefix("http://").split(":")
    sha = "0" * 64
    with socket.create_connection((host, int(port)), timeout=10) as connection:
        connection.sendall((f"PUT /v1/artifacts/{sha} HTTP/1.1\r\nHost: {host}:{port}\r\n"
                            f"Authorization: {admin_headers()['Authorization']}\r\n"
                            f"Content-Type: application/octet-stream\r\nContent-Length: {130 * 1024 * 1024}\r\n\r\n")
                           .encode())
        connection.sendall(b"x" * 1000)  # a first piece; the rest never comes
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            piece = connection.recv(65536)
            if not piece:
                break
            answer += piece
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413"), answer
    assert json.loads(body)["detail"] == (f"request body of {130 * 1024 * 1024} bytes exceeds the limit of {LIMIT} "
                                          "bytes (setting TUNECACHE_MAX_UPLOAD_BYTES)")
    assert _blobs_stored(database_url) == 0 and list(spool.iterdir()) == []


def test_nothing_of_a_refused_upload_stays_in_the_database_or_the_spool(limited):
    """Streamed without a length (chunked) past the limit, and whole but not hashing to its
    name: both refused, and neither leaves a blob, a chunk or a spool file."""
    server, spool, database_url = limited
    data = CUDNN_FILE.read_bytes()
    sha = hashlib.sha256(data).hexdigest()

    def pieces():
        for start in range(0, len(data), 4096):
            yield data[start:start + 4096]

    streamed = as_admin.put(f"{server}/v1/artifacts/{sha}", content=pieces(), timeout=30)
    assert streamed.status_code == 413, streamed.text
    assert "TUNECACHE_MAX_UPLOAD_BYTES" in streamed.json()["detail"]
    mismatched = as_admin.put(f"{server}/v1/artifacts/{sha}", content=data[:5000], timeout=30)
    assert mismatched.status_code == 422, mismatched.text
    assert as_admin.head(f"{server}/v1/artifacts/{sha}").status_code == 404
    assert _blobs_stored(database_url) == 0
    assert list(spool.iterdir()) == []
    assert httpx.get(f"{server}/v1/health", timeout=10).json()["status"] == "ok"
