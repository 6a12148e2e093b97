"""A database whose disk is full says so, naming the directory (issue 39, Why 8: it said
"database unavailable, try again", as for a database that is down).

The full disk is SQLite's own: ``PRAGMA max_page_count`` capped at the file's size makes
SQLite fail every write that would grow the file with SQLITE_FULL, "database or disk is full",
the very error (and code) it gives when the disk has no room left. Deterministic, no root, no
tmpfs; PostgreSQL's counterpart (SQLSTATE 53100, disk_full) cannot be made without filling
the server's disk, so only the SQLite case runs here."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event

from tests.conftest import make_token


def test_a_database_on_a_full_disk_says_the_disk_is_full_naming_the_directory(engine, tmp_path):
    if engine.dialect.name != "sqlite":
        pytest.skip("SQLite's own full condition (see the module docstring)")
    from tunecache.service.app import create_app
    from tunecache.service.settings import Settings

    token = make_token(engine, "test-admin", "admin")

    @event.listens_for(engine, "connect")
    def _no_room_to_grow(dbapi_connection, _record):
        pages = dbapi_connection.execute("PRAGMA page_count").fetchone()[0]
        dbapi_connection.execute(f"PRAGMA max_page_count = {pages}")

    engine.dispose()  # every connection from here on is capped
    settings = Settings(database_url=str(engine.url), max_upload_bytes=1_000_000, max_json_bytes=1_000_000,
                        worker="off", data_dir=tmp_path / "data")
    data = os.urandom(400_000)
    with TestClient(create_app(settings, engine=engine)) as client:
        client.headers["Authorization"] = f"Bearer {token}"
        answer = client.put(f"/v1/artifacts/{hashlib.sha256(data).hexdigest()}", content=data)
    directory = Path(engine.url.database).resolve().parent
    assert answer.status_code == 503, answer.text
    assert answer.json()["detail"] == (f"database disk full: no room left to write the database in {directory}; "
                                       "free space there (nothing was stored)")
