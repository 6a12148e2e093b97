"""Two ``tunecache db upgrade`` at once on one PostgreSQL schema (two replicas' init jobs, an
operator and a deploy): the loser printed a raw ``UniqueViolation`` (both created the version
table or inserted its row) and exited 1. They now take turns on an advisory lock, as SQLite's
take turns on a file lock: both exit 0 and the schema is at the head."""

from __future__ import annotations

import subprocess
import uuid

import pytest
from sqlalchemy import create_engine, text

from tests.conftest import POSTGRES_URL, require_postgres
from tests.support.cli import tunecache_executable
from tunecache.service.db import head_revision


@pytest.mark.postgres
def test_two_db_upgrades_at_once_on_postgresql_take_turns():
    require_postgres()
    admin = create_engine(POSTGRES_URL)
    sep = "&" if "?" in POSTGRES_URL else "?"
    try:
        for _ in range(3):
            schema = f"tunecache_race_{uuid.uuid4().hex[:12]}"
            with admin.begin() as connection:
                connection.execute(text(f'CREATE SCHEMA "{schema}"'))
            try:
                url = f"{POSTGRES_URL}{sep}options=-csearch_path%3D{schema}"
                started = [subprocess.Popen([tunecache_executable(), "db", "upgrade", "--database", url],
                                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
                outcomes = [process.communicate(timeout=180) + (process.returncode,) for process in started]
                assert [code for _, _, code in outcomes] == [0, 0], outcomes
                assert not any("Traceback" in err or "UniqueViolation" in err for _, err, _ in outcomes), outcomes
                with admin.connect() as connection:
                    revision = connection.execute(text(f'SELECT version_num FROM "{schema}".alembic_version')).scalar()
                assert revision == head_revision()
            finally:
                with admin.begin() as connection:
                    connection.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
    finally:
        admin.dispose()
