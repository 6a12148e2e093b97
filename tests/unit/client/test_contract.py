"""The contract both distributions speak, and the schema the service builds from it."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from sqlalchemy import inspect, text
from sqlalchemy.exc import IntegrityError

from tests.support.paths import CUDNN_FILE
from tests.support.builders import file_environment, h200_key, run_payload, store_file
from tunecache.contract import (
    KEY_FIELDS,
    TUNER_EVENT,
    ArtifactKind,
    JobStatus,
    RunStatus,
    RunTrigger,
    StageChanged,
    StageProgress,
    TunerFinished,
    TuningJobCreate,
    TuningRunCreate,
    TuningRunQuery,
    TuningRunRead,
)
from tunecache.service import db
from tunecache.service.store import SqlTuningStore
from tunecache.store import ArtifactsMissing, NoCompatibleTuning, TuningStore


def test_tuner_events_are_one_discriminated_union():
    assert TUNER_EVENT.validate_json('{"event": "progress", "stage": "gemm", "step": 3, "total": 8}') == StageProgress(
        stage="gemm", step=3, total=8
    )
    done = TUNER_EVENT.validate_python({"event": "stage", "stage": "harvest", "status": "done", "seconds": 1.5, "modules": ["m"]})
    assert isinstance(done, StageChanged) and done.modules == ["m"]
    assert isinstance(TUNER_EVENT.validate_json(TunerFinished(summary={"entries": 1}).model_dump_json()), TunerFinished)
    with pytest.raises(ValidationError):
        TUNER_EVENT.validate_json('{"event": "progress", "stage": "no-such-stage", "step": 1, "total": 1}')
    with pytest.raises(ValidationError):
        TUNER_EVENT.validate_json('{"event": "finished"}')


def test_write_models_refuse_unknown_kinds_and_stages():
    body = run_payload(CUDNN_FILE)
    body["artifacts"][0]["kind"] = "flashinfer_autotune_v9"
    with pytest.raises(ValidationError, match="artifacts.0.kind"):
        TuningRunCreate.model_validate(body)
    with pytest.raises(ValidationError, match="stages"):
        TuningJobCreate(key=h200_key(), stages=["gemm", "warmup"])
    assert ArtifactKind.FLASHINFER_JIT_MODULE.media_type == "application/gzip"


def test_read_models_ignore_fields_a_newer_server_adds(engine):
    with db.session_factory(engine).begin() as session:
        store_file(session, CUDNN_FILE)
    run = SqlTuningStore(db.session_factory(engine)).record_run(TuningRunCreate.model_validate(run_payload(CUDNN_FILE)))
    newer = {**run.model_dump(mode="json"), "attestation": {"kind": "slsa", "digest": "..."}}
    assert TuningRunRead.model_validate(newer) == run
    assert run.status is RunStatus.SUCCEEDED and run.trigger is RunTrigger.UPLOAD


def test_the_sql_store_is_a_tuning_store_with_one_transaction_per_call(engine, tmp_path):
    store = SqlTuningStore(db.session_factory(engine))
    assert isinstance(store, TuningStore)
    key, environment = h200_key(), file_environment(CUDNN_FILE)
    with pytest.raises(NoCompatibleTuning) as miss:
        store.lookup(key, environment)
    assert miss.value.miss.detail == "no tuning is stored yet"
    with pytest.raises(ArtifactsMissing):  # the bytes were not uploaded: nothing recorded
        store.record_run(TuningRunCreate.model_validate(run_payload(CUDNN_FILE)))
    assert store.list_runs().total == 0
    assert store.upload_file(CUDNN_FILE) == run_payload(CUDNN_FILE)["artifacts"][0]["sha256"]
    recorded = store.record_run(TuningRunCreate.model_validate(run_payload(CUDNN_FILE)))
    assert store.lookup(key, environment) == recorded  # committed: a new transaction sees it
    assert [r.id for r in store.list_runs(TuningRunQuery(status=RunStatus.SUCCEEDED, current_only=True)).items] == [recorded.id]


def test_status_and_trigger_columns_hold_only_the_contracts_values(engine):
    """The CHECK constraints come from the enums: every value is accepted, anything else refused."""
    checks = {c["name"] for table in ("tuning_runs", "tuning_jobs") for c in inspect(engine).get_check_constraints(table)}
    assert {"ck_tuning_runs_status", "ck_tuning_runs_trigger", "ck_tuning_jobs_status"} <= checks
    with db.session_factory(engine).begin() as session:
        store_file(session, CUDNN_FILE)
    run = SqlTuningStore(db.session_factory(engine)).record_run(TuningRunCreate.model_validate(run_payload(CUDNN_FILE)))
    for column, values in (("status", RunStatus), ("trigger", RunTrigger)):
        with engine.begin() as connection:
            for value in values:
                connection.execute(text(f"UPDATE tuning_runs SET {column} = :v WHERE id = :id"), {"v": value.value, "id": run.id})
        with pytest.raises(IntegrityError), engine.begin() as connection:
            connection.execute(text(f"UPDATE tuning_runs SET {column} = 'bogus' WHERE id = :id"), {"id": run.id})
    with engine.begin() as connection:
        key_id = connection.execute(text("SELECT id FROM tuning_keys")).scalar_one()
        for n, value in enumerate(JobStatus):
            connection.execute(
                text("INSERT INTO tuning_jobs (key_id, status, attempts, created_at) VALUES (:k, :s, 0, CURRENT_TIMESTAMP)"),
                {"k": key_id, "s": value.value if not value.active else "failed"},
            )
    with pytest.raises(IntegrityError), engine.begin() as connection:
        connection.execute(
            text("INSERT INTO tuning_jobs (key_id, status, attempts, created_at) VALUES (:k, 'paused', 0, CURRENT_TIMESTAMP)"),
            {"k": key_id},
        )


def test_the_key_unique_constraint_is_built_from_the_key_fields(engine):
    unique = {u["name"]: u["column_names"] for u in inspect(engine).get_unique_constraints("tuning_keys")}
    assert tuple(unique["uq_tuning_keys_identity"]) == KEY_FIELDS
