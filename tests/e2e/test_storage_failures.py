"""Issue 21: a full disk or a database that stops answering must not stop boots.

Each test runs a real ``tunecache serve`` on the test's own database (PostgreSQL: the
test's own schema, which another connection of the test freezes by holding an ACCESS
EXCLUSIVE lock on the tables a request reads, as a frozen server would make them wait).
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from sqlalchemy import create_engine, text

from tests.support.builders import lookup_body, run_payload
from tests.support.paths import CUDNN_FILE
from tests.support.serve import Scrape, admin_token, as_admin, push_run, start_server, stop_server
from tunecache.client.http import TunecacheClient
from tunecache.contract import TuningRunCreate
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
