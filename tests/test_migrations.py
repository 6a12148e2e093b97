"""Alembic migrations on SQLite and PostgreSQL: from empty, single head, down to base and back."""

from __future__ import annotations

import datetime as dt
import hashlib

import pytest
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text

from helpers import run_payload, store_file
from conftest import CUDNN_FILE
from tunecache.service import blobs, db, repository
from tunecache.contract import TuningRunCreate

TABLES = {
    "environments", "tuning_keys", "tuning_runs", "artifact_blobs", "artifact_chunks", "run_artifacts",
    "current_tunings", "tuning_jobs", "tuning_generation",
}


def test_single_head():
    config = Config()
    config.set_main_option("script_location", str(db.migrations_dir()))
    assert len(ScriptDirectory.from_config(config).get_heads()) == 1


def test_empty_database_is_refused_until_upgraded(database_url):
    engine = db.create_db_engine(database_url)
    with pytest.raises(db.SchemaOutOfDate, match="run `tunecache db upgrade"):
        db.check_schema(engine)
    db.upgrade(engine)
    assert db.check_schema(engine) == db.head_revision()
    assert TABLES <= set(inspect(engine).get_table_names())
    engine.dispose()


def test_downgrade_to_base_and_back_with_data(engine):
    with db.session_factory(engine)() as session:
        store_file(session, CUDNN_FILE)
        repository.record_run(session, TuningRunCreate.model_validate(run_payload(CUDNN_FILE)))
        session.commit()
    db.downgrade(engine, "base")
    assert not TABLES & set(inspect(engine).get_table_names())
    db.upgrade(engine)
    assert TABLES <= set(inspect(engine).get_table_names())
    with db.session_factory(engine)() as session:
        assert repository.list_runs(session).total == 0


def test_artifact_bytes_survive_the_chunk_migration_both_ways(database_url):
    """0002 stored bytes in artifact_blobs.content; 0003 moves them into chunks and back."""
    engine = db.create_db_engine(database_url)
    db.upgrade(engine, "0002")
    data = CUDNN_FILE.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    with engine.begin() as connection:
        connection.execute(
            text("INSERT INTO artifact_blobs (sha256, size_bytes, content, created_at) VALUES (:s, :n, :c, :t)"),
            {"s": digest, "n": len(data), "c": data, "t": dt.datetime.now(dt.timezone.utc)},
        )
    db.upgrade(engine)
    with db.session_factory(engine)() as session:
        assert blobs.read_blob(session, digest) == data
    db.downgrade(engine, "0002")
    with engine.connect() as connection:
        assert connection.execute(text("SELECT content FROM artifact_blobs")).scalar_one() == data
    engine.dispose()
