"""Alembic migrations on SQLite and PostgreSQL: from empty, single head, down to base and back."""

from __future__ import annotations

import datetime as dt
import hashlib

import pytest
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text

from tests.support.builders import run_payload, store_file
from tests.support.paths import CUDNN_FILE
from tunecache.service import blobs, db, publishing, repository
from tunecache.contract import TuningRunCreate

TABLES = {
    "environments", "tuning_keys", "tuning_runs", "artifact_blobs", "artifact_chunks", "run_artifacts",
    "current_tunings", "tuning_jobs", "tuning_generation", "workers", "pod_reports",
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
        publishing.record_run(session, TuningRunCreate.model_validate(run_payload(CUDNN_FILE)))
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


def test_job_cancel_and_worker_heartbeats_migration_keeps_jobs_both_ways(database_url):
    """0008 adds the ``cancelled`` status (and the cancel columns) to ``tuning_jobs`` and the
    ``workers`` table; a downgrade keeps every job, a cancelled one as failed ("cancelled")."""
    from sqlalchemy.exc import IntegrityError

    engine = db.create_db_engine(database_url)
    db.upgrade(engine, "0007")
    now = dt.datetime.now(dt.timezone.utc)
    with engine.begin() as connection:
        connection.execute(text(
            "INSERT INTO tuning_keys (id, gpu_name, arch, model, max_num_batched_tokens, dtype, quantization, "
            "tensor_parallel_size, created_at) VALUES (1, 'NVIDIA H200', 'sm90', 'm', 8192, 'auto', 'auto', 1, :t)"), {"t": now})
        for job_id, status in ((1, "queued"), (2, "failed"), (3, "succeeded")):
            connection.execute(text("INSERT INTO tuning_jobs (id, key_id, status, attempts, created_at, error) "
                                    "VALUES (:i, 1, :s, 0, :t, :e)"),
                               {"i": job_id, "s": status, "t": now, "e": "boom" if status == "failed" else None})
    db.upgrade(engine)
    assert "workers" in inspect(engine).get_table_names()
    with engine.begin() as connection:
        rows = connection.execute(text("SELECT id, status, error, cancel_requested_at FROM tuning_jobs ORDER BY id")).all()
        assert [tuple(r) for r in rows] == [(1, "queued", None, None), (2, "failed", "boom", None), (3, "succeeded", None, None)]
        connection.execute(text("UPDATE tuning_jobs SET status = 'cancelled', cancelled_by = 'ops', "
                                "cancel_requested_at = :t WHERE id = 1"), {"t": now})
        connection.execute(text("INSERT INTO workers (name, gpu_name, arch, model_config_dir, heartbeat_s, started_at, "
                                "last_seen) VALUES ('n:1', 'NVIDIA H200', 'sm90', false, 15, :t, :t)"), {"t": now})
    with pytest.raises(IntegrityError):  # the status check still holds after the copy
        with engine.begin() as connection:
            connection.execute(text("UPDATE tuning_jobs SET status = 'paused' WHERE id = 2"))
    with engine.begin() as connection:  # the active-job index still holds: a cancelled job frees its key
        connection.execute(text("INSERT INTO tuning_jobs (id, key_id, status, attempts, created_at) "
                                "VALUES (4, 1, 'queued', 0, :t)"), {"t": now})
    with pytest.raises(IntegrityError):
        with engine.begin() as connection:
            connection.execute(text("INSERT INTO tuning_jobs (id, key_id, status, attempts, created_at) "
                                    "VALUES (5, 1, 'running', 0, :t)"), {"t": now})

    db.downgrade(engine, "0007")
    assert "workers" not in inspect(engine).get_table_names()
    assert "cancelled_by" not in {c["name"] for c in inspect(engine).get_columns("tuning_jobs")}
    with engine.connect() as connection:
        rows = connection.execute(text("SELECT id, status, error FROM tuning_jobs ORDER BY id")).all()
    assert [tuple(r) for r in rows] == [(1, "failed", "cancelled"), (2, "failed", "boom"), (3, "succeeded", None),
                                        (4, "queued", None)]
    with pytest.raises(IntegrityError):
        with engine.begin() as connection:
            connection.execute(text("UPDATE tuning_jobs SET status = 'cancelled' WHERE id = 2"))
    db.upgrade(engine)
    assert db.check_schema(engine) == db.head_revision()
    engine.dispose()


def _run_count(engine) -> int:
    """Runs in the table, read without the ORM (whose model is the head revision's)."""
    with engine.connect() as connection:
        return connection.execute(text("SELECT count(*) FROM tuning_runs")).scalar_one()


def _one_run(engine) -> None:
    """One run recorded at the head revision."""
    with db.session_factory(engine)() as session:
        store_file(session, CUDNN_FILE)
        publishing.record_run(session, TuningRunCreate.model_validate(run_payload(CUDNN_FILE)))
        session.commit()


def test_pod_reports_migration_adds_the_table_and_the_history_indexes_both_ways(database_url):
    """0009: ``pod_reports`` with its two indexes, and the history's indexes on
    ``tuning_runs``; a downgrade drops them and keeps the runs."""
    engine = db.create_db_engine(database_url)
    db.upgrade(engine)
    _one_run(engine)
    db.downgrade(engine, "0008")
    history_indexes = {"ix_tuning_runs_created_id", "ix_tuning_runs_key_created", "ix_tuning_runs_environment_created"}
    db.upgrade(engine, "0009")
    assert {i["name"] for i in inspect(engine).get_indexes("pod_reports")} == {
        "ix_pod_reports_received_key", "ix_pod_reports_outcome_received"}
    assert history_indexes <= {i["name"] for i in inspect(engine).get_indexes("tuning_runs")}
    db.downgrade(engine, "0008")
    assert "pod_reports" not in inspect(engine).get_table_names()
    assert not history_indexes & {i["name"] for i in inspect(engine).get_indexes("tuning_runs")}
    assert _run_count(engine) == 1
    db.upgrade(engine)
    assert db.check_schema(engine) == db.head_revision()
    engine.dispose()


def test_attestation_and_promotion_columns_come_and_go_and_keep_the_rows(database_url):
    """0010: ``pod_reports.compiled`` and ``compiled_total``; 0011: ``tuning_runs.held`` and
    ``signature_verified``. Downgrades drop the columns and keep runs and reports."""
    engine = db.create_db_engine(database_url)
    db.upgrade(engine)
    _one_run(engine)
    columns = lambda table: {c["name"] for c in inspect(engine).get_columns(table)}  # noqa: E731
    assert {"held", "signature_verified"} <= columns("tuning_runs")
    assert {"compiled", "compiled_total"} <= columns("pod_reports")
    db.downgrade(engine, "0010")
    assert not {"held", "signature_verified"} & columns("tuning_runs") and "compiled" in columns("pod_reports")
    db.downgrade(engine, "0009")
    assert not {"compiled", "compiled_total"} & columns("pod_reports")
    assert _run_count(engine) == 1
    db.upgrade(engine)
    assert db.check_schema(engine) == db.head_revision() and _run_count(engine) == 1
    engine.dispose()


def test_the_image_migration_fills_each_images_current_run_from_the_pointers_both_ways(database_url):
    """0019: ``tuning_runs.image``, ``current_images`` and ``pod_reports.missing_kinds``. Upgraded
    over a fleet half upgraded (the new image's run current for the key, the old image's still
    current for its engine variant), the old image's pods get their own run back; a downgrade
    drops the columns and the table and keeps every run."""
    from tests.support.builders import file_environment, h200_key
    from tunecache.formats.dependencies import image_of

    old_versions = {"apache-tvm-ffi": "0.1.4", "torch": "2.9.0", "triton": "3.5.0"}
    new_versions = {"apache-tvm-ffi": "0.1.4", "torch": "2.10.0", "triton": "3.6.0"}
    engine = db.create_db_engine(database_url)
    db.upgrade(engine)
    with db.session_factory(engine)() as session:
        store_file(session, CUDNN_FILE)
        runs = [publishing.record_run(session, TuningRunCreate.model_validate(run_payload(
            CUDNN_FILE, variant=variant, summary={"entries": 43, "dependencies": versions})))
            for variant, versions in (("00000000000000a1", old_versions), ("00000000000000b2", new_versions))]
        session.commit()
    columns = lambda table: {c["name"] for c in inspect(engine).get_columns(table)}  # noqa: E731
    db.downgrade(engine, "0018")
    assert "current_images" not in inspect(engine).get_table_names()
    assert "image" not in columns("tuning_runs") and "missing_kinds" not in columns("pod_reports")
    assert _run_count(engine) == 2
    db.upgrade(engine)
    with db.session_factory(engine)() as session:
        for run, versions in zip(runs, (old_versions, new_versions)):
            assert repository.lookup(session, h200_key(), file_environment(CUDNN_FILE), None,
                                     image_of(versions)).id == run.id
    with engine.connect() as connection:
        assert dict(connection.execute(text("SELECT id, image FROM tuning_runs")).all()) == {
            runs[0].id: image_of(old_versions), runs[1].id: image_of(new_versions)}
    engine.dispose()
