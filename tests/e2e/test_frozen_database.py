"""A PostgreSQL that stops answering (SIGSTOP: the kernel still accepts its connections,
nothing replies): a lookup answered before is served from memory (``Tunecache-Stale``),
other lookups get 503 with ``Retry-After`` within the configured timeouts instead of
hanging, ``/v1/health`` says degraded, artifacts already mirrored are still served, and
the service recovers by itself when the database does. The test runs a private PostgreSQL
server of its own (Debian's ``postgresql`` binaries, as the ``postgres`` user)."""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest

from tests.support import postgres
from tests.support.cli import tunecache
from tests.support.paths import CUDNN_FILE
from tests.support.serve import as_admin
from tests.support.builders import lookup_body
from tests.support.serve import push_run, start_server, stop_server

pytestmark = pytest.mark.postgres


@pytest.fixture
def private_postgres():
    """A PostgreSQL server of the test's own on a free port: (URL, data directory)."""
    if (reason := postgres.unavailable_reason()) is not None:
        pytest.skip(reason)
    with postgres.private_postgres() as server:
        yield server.url, server.data


def test_a_frozen_database_gives_fast_503s_and_the_service_recovers(private_postgres, tmp_path):
    url, data = private_postgres
    tunecache("db", "upgrade", "--database", url, check=True)
    process, server = start_server(url, tmp_path, "frozen", TUNECACHE_DB_STATEMENT_TIMEOUT="1", TUNECACHE_DB_POOL_TIMEOUT="1")
    try:
        run = push_run(server)
        sha = run["artifacts"][0]["sha256"]
        body = lookup_body()
        assert as_admin.post(f"{server}/v1/tunings/lookup", json=body).json()["id"] == run["id"]
        assert httpx.get(f"{server}/v1/artifacts/{sha}").status_code == 200  # now mirrored

        pids = postgres.server_pids(data)
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        started = time.monotonic()
        stale = httpx.post(f"{server}/v1/tunings/lookup", json=body, timeout=30)  # answered before: from memory
        assert stale.status_code == 200 and stale.json()["id"] == run["id"] and "tunecache-stale" in stale.headers
        frozen = httpx.post(f"{server}/v1/tunings/lookup", json=lookup_body(max_num_batched_tokens=4096), timeout=30)
        waited = time.monotonic() - started
        assert frozen.status_code == 503 and frozen.headers["retry-after"] == "1", frozen.text
        assert waited < 5, waited
        assert "127.0.0.1" not in frozen.text and "psycopg" not in frozen.text
        health = httpx.get(f"{server}/v1/health", timeout=30)  # within its 1 s bound, while no statement ends
        assert health.status_code == 200 and health.json() == {"status": "degraded"}
        artifact = httpx.get(f"{server}/v1/artifacts/{sha}", timeout=10)
        assert artifact.status_code == 200 and artifact.content == CUDNN_FILE.read_bytes()

        for pid in pids:
            os.kill(pid, signal.SIGCONT)
        deadline = time.monotonic() + 15
        while True:  # no restart: the next lookups find the database again
            answer = as_admin.post(f"{server}/v1/tunings/lookup", json=body, timeout=30)
            if answer.status_code == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert answer.status_code == 200 and answer.json()["id"] == run["id"]
    finally:
        stop_server(process)
