"""Issue 21: a full disk or a database that stops answering must not stop boots.

Each test runs a real ``tunecache serve`` on the test's own database (PostgreSQL: the
test's own schema, which another connection of the test freezes by holding an ACCESS
EXCLUSIVE lock on the tables a request reads, as a frozen server would make them wait).
"""

from __future__ import annotations

import hashlib
import os
import resource
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from urllib.parse import unquote

import httpx
import pytest
from sqlalchemy import create_engine, text

from tests.support.builders import lookup_body, run_payload
from tests.support.paths import CUDNN_FILE
from tests.support.cli import tunecache_executable
from tests.support.serve import (Scrape, admin_token, as_admin, free_port, push_run, share_admin_token, start_server,
                                 stop_server)
from tunecache.store.http import TunecacheClient
from tunecache.contract import EnvironmentMetadata, TuningKey, TuningRunCreate
from tunecache.service import db

PUSHES = 60


@pytest.fixture
def postgres_url(postgres_schema_url) -> str:
    """The test's own PostgreSQL schema, migrated to the head revision."""
    engine = db.create_db_engine(postgres_schema_url)
    db.upgrade(engine)
    engine.dispose()
    return postgres_schema_url


@pytest.mark.postgres
def test_sixty_identical_pushes_at_once_all_succeed(postgres_url, tmp_path):
    """60 pushes of the same run at once on a process of 8 threads: every one is recorded
    within the client's retries (none ends in ``503 no connection free``)."""
    process, server = start_server(postgres_url, tmp_path, "pushes", TUNECACHE_THREADS="8")
    try:
        token = admin_token()
        run = TuningRunCreate.model_validate(run_payload(CUDNN_FILE))
        start = threading.Barrier(PUSHES)

        def push(_: int) -> str:
            with TunecacheClient(server, token=token) as client:
                start.wait(timeout=60)
                try:
                    client.upload_file(CUDNN_FILE)
                    return f"recorded {client.record_run(run).id}"
                except Exception as exc:  # noqa: BLE001 - counted below, named in the failure
                    return f"{type(exc).__name__}: {exc}"

        with ThreadPoolExecutor(PUSHES) as pool:
            outcomes = list(pool.map(push, range(PUSHES)))
        failed = [outcome for outcome in outcomes if not outcome.startswith("recorded")]
        assert not failed, f"{len(failed)} of {PUSHES} pushes failed: {sorted(set(failed))}"
        history = as_admin.get(f"{server}/v1/tunings", params={"limit": 100}, timeout=30).json()
        assert history["total"] == PUSHES
    finally:
        stop_server(process)


#: Largest file the server of the full-disk test may write, bytes (RLIMIT_FSIZE): the admin
#: token fits, no artifact does.
FILE_SIZE_LIMIT = 4096


def _start_server_that_cannot_write_files(database_url: str, tmp_path) -> tuple[subprocess.Popen, str, list[str]]:
    """``tunecache serve`` whose every write past :data:`FILE_SIZE_LIMIT` bytes of a file
    fails in the kernel (``RLIMIT_FSIZE``: write(2) returns EFBIG, Python ignores SIGXFSZ),
    as on a full disk every write of a new artifact file fails. Its log goes through a pipe
    (not a file the limit would cut). Returns (process, URL, log lines)."""
    port = free_port()
    data_dir = tmp_path / "full-data"

    def limit_file_size() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_SIZE_LIMIT, FILE_SIZE_LIMIT))

    process = subprocess.Popen(
        [tunecache_executable(), "serve", "--port", str(port), "--database", database_url],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=limit_file_size,
        env={**os.environ, "TUNECACHE_WORKER": "off", "TUNECACHE_DATA_DIR": str(data_dir)})
    log: list[str] = []
    threading.Thread(target=lambda: log.extend(process.stdout), daemon=True).start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{url}/v1/health", timeout=1).status_code == 200:
                share_admin_token(data_dir)
                return process, url, log
        except httpx.TransportError:
            pass
        assert process.poll() is None and time.monotonic() < deadline, "".join(log)
        time.sleep(0.1)


@pytest.mark.postgres
def test_artifacts_are_served_from_the_database_when_the_mirror_cannot_be_written(postgres_url, tmp_path):
    """A node whose artifact mirror cannot be written (full disk) serves every artifact from
    the database (a small one from memory after the first read, a large one streamed), and
    its /v1/health says degraded and why; no 500 reaches a pod."""
    process, server, log = _start_server_that_cannot_write_files(postgres_url, tmp_path)
    try:
        run = push_run(server)
        small = CUDNN_FILE.read_bytes()
        small_sha = run["artifacts"][0]["sha256"]
        large = os.urandom(3 * 1024 * 1024 + 17)  # over the 1 MiB held in memory: streamed from the database
        large_sha = hashlib.sha256(large).hexdigest()
        assert as_admin.put(f"{server}/v1/artifacts/{large_sha}", content=large, timeout=60).status_code == 201
        assert httpx.get(f"{server}/v1/health", timeout=5).json() == {"status": "ok"}

        for _ in range(3):  # the first read fills memory from the database, the next come from memory
            answer = httpx.get(f"{server}/v1/artifacts/{small_sha}", timeout=30)
            assert answer.status_code == 200, answer.text
            assert answer.content == small and answer.headers["etag"] == f'"{small_sha}"'
        for headers in ({}, {"Range": "bytes=0-99"}):  # a range is answered with the whole artifact
            answer = httpx.get(f"{server}/v1/artifacts/{large_sha}", headers=headers, timeout=60)
            assert answer.status_code == 200, answer.text
            assert answer.content == large and answer.headers["content-length"] == str(len(large))
        with TunecacheClient(server) as client:  # what a booting pod does
            found = client.lookup(TuningKey.model_validate(run["key"]), EnvironmentMetadata.model_validate(run["environment"]))
            assert found.id == run["id"]
            assert client.download_artifact(small_sha) == small

        assert httpx.get(f"{server}/v1/health", timeout=5).json() == {"status": "degraded"}
        detail = as_admin.get(f"{server}/v1/health", timeout=5).json()
        assert detail["status"] == "degraded"
        assert any("artifact mirror" in problem and "served from the database" in problem
                   for problem in detail["problems"]), detail
        assert not list((tmp_path / "full-data" / "artifact-cache").rglob("*" + small_sha))  # really never written
    finally:
        stop_server(process)
    assert "internal error" not in "".join(log)


@contextmanager
def tables_locked(schema_url: str, only: tuple[str, ...] | None = None) -> Iterator[int]:
    """Every table of the test's own PostgreSQL schema (or those named in ``only``) held
    ACCESS EXCLUSIVE by another connection (its backend's pid is yielded): every statement
    that reads one waits, as on a frozen server, until the lock is let go (at the end of
    the block)."""
    schema = unquote(schema_url.rsplit("search_path%3D", 1)[1])
    engine = create_engine(schema_url.rsplit("?", 1)[0])
    try:
        with engine.connect() as connection:
            transaction = connection.begin()
            tables = connection.scalars(text("SELECT tablename FROM pg_tables WHERE schemaname = :schema"),
                                        {"schema": schema}).all()
            tables = [table for table in tables if only is None or table in only]
            assert tables
            connection.execute(text("SET LOCAL lock_timeout = '30s'"))
            connection.execute(text(f"LOCK TABLE {', '.join(f'{schema}.{t}' for t in tables)} IN ACCESS EXCLUSIVE MODE"))
            try:
                yield connection.scalar(text("SELECT pg_backend_pid()"))
            finally:
                transaction.rollback()
    finally:
        engine.dispose()


def _timed(call) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    answer = call()
    return answer, time.monotonic() - started


#: Seconds an answer bounded by a 2 s lock timeout (or the 1 s health bound) may take on a
#: loaded CI machine: generous, but far below the statement timeout (30 s) they replace.
BOUND_S = 8


#: Seconds /v1/health may take with its 1 s bound on a loaded CI machine.
HEALTH_BOUND_S = 3


@pytest.mark.postgres
def test_a_frozen_database_still_answers_boots_health_and_files(postgres_url, tmp_path):
    """The test's tables locked (a frozen database for every reader): a lookup answered
    before is served from memory, marked Tunecache-Stale; any other lookup, the history and
    the dashboard get 503 with Retry-After within the lock timeout, each lookup 503 counted as an
    error; /v1/health says degraded within its 1 s bound; /metrics answers; mirrored
    artifacts are served (GET and HEAD). Afterwards everything answers as before."""
    process, server = start_server(postgres_url, tmp_path, "frozen", TUNECACHE_DB_LOCK_TIMEOUT="2",
                                   TUNECACHE_DB_STATEMENT_TIMEOUT="30", TUNECACHE_DB_POOL_TIMEOUT="30")
    try:
        run = push_run(server)
        sha = run["artifacts"][0]["sha256"]
        body, other = lookup_body(), lookup_body(max_num_batched_tokens=4096)
        assert httpx.post(f"{server}/v1/tunings/lookup", json=body, timeout=30).json()["id"] == run["id"]
        assert httpx.get(f"{server}/v1/artifacts/{sha}", timeout=30).status_code == 200  # now mirrored
        before = Scrape(httpx.get(f"{server}/metrics", timeout=30).text)

        with tables_locked(postgres_url):
            for _ in range(3):
                stale, waited = _timed(lambda: httpx.post(f"{server}/v1/tunings/lookup", json=body, timeout=60))
                assert stale.status_code == 200 and stale.json()["id"] == run["id"], stale.text
                assert float(stale.headers["tunecache-stale"]) >= 0 and waited < BOUND_S, (stale.headers, waited)
            unknown, waited = _timed(lambda: httpx.post(f"{server}/v1/tunings/lookup", json=other, timeout=60))
            assert unknown.status_code == 503 and unknown.headers["retry-after"] == "1", unknown.text
            assert waited < BOUND_S and "detail" in unknown.json()
            health, waited = _timed(lambda: httpx.get(f"{server}/v1/health", timeout=60))
            assert health.status_code == 200 and health.json() == {"status": "degraded"} and waited < HEALTH_BOUND_S, waited
            history, waited = _timed(lambda: httpx.get(f"{server}/v1/tunings", timeout=60))
            assert history.status_code == 503 and history.headers["retry-after"] == "1" and waited < BOUND_S, history.text
            page, waited = _timed(lambda: httpx.get(f"{server}/history", timeout=60))  # the dashboard
            assert page.status_code == 503 and page.headers["retry-after"] == "1" and waited < BOUND_S, page.text
            scrape, waited = _timed(lambda: httpx.get(f"{server}/metrics", timeout=60))
            assert scrape.status_code == 200 and waited < BOUND_S
            assert Scrape(scrape.text).value("tunecache_database_up") == 0
            head, waited = _timed(lambda: httpx.head(f"{server}/v1/artifacts/{sha}", timeout=60))
            assert head.status_code == 200 and waited < BOUND_S
            assert httpx.get(f"{server}/v1/artifacts/{sha}", timeout=60).content == CUDNN_FILE.read_bytes()
        after = Scrape(httpx.get(f"{server}/metrics", timeout=30).text)
        assert after.total("tunecache_lookups_total", outcome="error") - before.total("tunecache_lookups_total", outcome="error") == 1
        assert after.value("tunecache_database_up") == 1

        fresh = httpx.post(f"{server}/v1/tunings/lookup", json=body, timeout=30)
        assert fresh.status_code == 200 and "tunecache-stale" not in fresh.headers
        assert httpx.get(f"{server}/v1/health", timeout=30).json() == {"status": "ok"}
    finally:
        stop_server(process)


@pytest.mark.postgres
def test_file_serving_never_waits_for_routes_stuck_on_the_database(postgres_url, tmp_path):
    """Every thread of a 2-thread process waits on a locked table (history requests, with a
    30 s lock timeout): a mirrored artifact's file is still served, whole and by range,
    HEAD answers, and /v1/health (whose database still answers) says ok, while those
    requests still wait."""
    process, server = start_server(postgres_url, tmp_path, "stuck", TUNECACHE_THREADS="2",
                                   TUNECACHE_DB_LOCK_TIMEOUT="30", TUNECACHE_DB_STATEMENT_TIMEOUT="60")
    try:
        large = os.urandom(2 * 1024 * 1024 + 5)  # over the 1 MiB held in memory: served from its file
        sha = hashlib.sha256(large).hexdigest()
        assert as_admin.put(f"{server}/v1/artifacts/{sha}", content=large, timeout=60).status_code == 201
        assert httpx.get(f"{server}/v1/artifacts/{sha}", timeout=60).content == large  # now mirrored

        with ThreadPoolExecutor(4) as pool, tables_locked(postgres_url, only=("tuning_runs",)) as locker:  # released first
            stuck = [pool.submit(httpx.get, f"{server}/v1/tunings", timeout=120) for _ in range(4)]
            _wait_for_lock_waiters(postgres_url, locker, 2)
            whole = httpx.get(f"{server}/v1/artifacts/{sha}", timeout=10)
            assert whole.status_code == 200 and whole.content == large
            part = httpx.get(f"{server}/v1/artifacts/{sha}", headers={"Range": "bytes=10-19"}, timeout=10)
            assert part.status_code == 206 and part.content == large[10:20]
            assert httpx.head(f"{server}/v1/artifacts/{sha}", timeout=10).headers["content-length"] == str(len(large))
            assert httpx.get(f"{server}/v1/health", timeout=10).json() == {"status": "ok"}
            assert not any(future.done() for future in stuck)  # all this while the history still waited
        assert all(future.result().status_code == 200 for future in stuck)
    finally:
        stop_server(process)


def _wait_for_lock_waiters(schema_url: str, locker: int, count: int) -> None:
    """Until ``count`` sessions wait for the lock of backend ``locker`` (the server's stuck threads)."""
    engine = create_engine(schema_url.rsplit("?", 1)[0], isolation_level="AUTOCOMMIT")  # a fresh view each time
    try:
        deadline = time.monotonic() + 30
        with engine.connect() as connection:
            while connection.scalar(text("SELECT count(*) FROM pg_stat_activity WHERE :locker = ANY(pg_blocking_pids(pid))"),
                                    {"locker": locker}) < count:
                assert time.monotonic() < deadline, "the server's requests never waited for the lock"
                time.sleep(0.1)
    finally:
        engine.dispose()
