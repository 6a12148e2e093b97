"""The key names its engine in the database (0021) and the API. Keys and reports stored before get ``vllm``; the key's
unique constraint takes the engine in; a downgrade refuses while another engine is named."""

from __future__ import annotations

import pytest
from sqlalchemy import inspect, text
from sqlalchemy.exc import IntegrityError

from tests.support.builders import file_environment, h200_key, run_payload, store_file
from tests.support.paths import CUDNN_FILE
from tunecache.contract import KEY_FIELDS, PodReportCreate, ReportOutcome, ReportSource, TuningRunCreate
from tunecache.service import db, publishing, reports


def _columns(engine, table: str) -> set[str]:
    return {c["name"] for c in inspect(engine).get_columns(table)}


def _key_copy(connection, engine_name: str) -> None:
    """A copy of the one stored key that differs from it in ``engine`` only (raw SQL: the
    contract knows one engine so far, the schema any)."""
    fields = [f for f in KEY_FIELDS if f != "engine"]
    connection.execute(text(
        f"INSERT INTO tuning_keys ({', '.join(fields)}, engine, created_at) "
        f"SELECT {', '.join(fields)}, :engine, created_at FROM tuning_keys"), {"engine": engine_name})


def test_stored_keys_and_reports_get_vllm_and_the_engine_joins_the_unique_key(database_url):
    engine = db.create_db_engine(database_url)
    db.upgrade(engine)
    with db.session_factory(engine)() as session:
        store_file(session, CUDNN_FILE)
        publishing.record_run(session, TuningRunCreate.model_validate(run_payload(CUDNN_FILE)))
        reports.record_report(session, PodReportCreate(
            key=h200_key(), environment_hash=file_environment(CUDNN_FILE).environment_hash(),
            outcome=ReportOutcome.ERROR, error_kind="OSError", install_seconds=0.1, pod="pod-a",
            source=ReportSource.CLI))
        session.commit()
    db.downgrade(engine, "0020")
    assert "engine" not in _columns(engine, "tuning_keys") and "engine" not in _columns(engine, "pod_reports")
    with engine.begin() as connection:  # before: a key's copy is the same key
        with pytest.raises(IntegrityError):
            with connection.begin_nested():
                connection.execute(text(
                    f"INSERT INTO tuning_keys ({', '.join(KEY_FIELDS[:-1])}, created_at) "
                    f"SELECT {', '.join(KEY_FIELDS[:-1])}, created_at FROM tuning_keys"))
    db.upgrade(engine)
    with engine.begin() as connection:
        assert connection.execute(text("SELECT engine FROM tuning_keys")).scalars().all() == ["vllm"]
        assert connection.execute(text("SELECT engine FROM pod_reports")).scalars().all() == ["vllm"]
        _key_copy(connection, "sglang")  # another engine's key is another key
        with pytest.raises(IntegrityError):
            with connection.begin_nested():
                _key_copy(connection, "sglang")
    with pytest.raises(RuntimeError, match="name an engine other than vllm"):
        db.downgrade(engine, "0020")
    with engine.begin() as connection:
        connection.execute(text("DELETE FROM tuning_keys WHERE engine <> 'vllm'"))
    db.downgrade(engine, "0020")
    assert "engine" not in _columns(engine, "tuning_keys")
    db.upgrade(engine)
    assert db.check_schema(engine) == db.head_revision()
    engine.dispose()


def test_the_api_takes_the_keys_engine_and_names_an_unknown_one(app_client):
    """A key without ``engine`` means vLLM's; ``engine`` is stored, read back and filtered on;
    an engine tunecache has no adaptor for is a 422 naming the field."""
    from tests.support.builders import lookup_body, upload

    upload(app_client, CUDNN_FILE)
    body = run_payload(CUDNN_FILE)
    body["key"].pop("engine", None)
    recorded = app_client.post("/v1/tunings", json=body)
    assert recorded.status_code == 201 and recorded.json()["key"]["engine"] == "vllm", recorded.text
    named = lookup_body()
    assert named["key"]["engine"] == "vllm"
    assert app_client.post("/v1/tunings/lookup", json=named).json()["id"] == recorded.json()["id"]
    assert [r["id"] for r in app_client.get("/v1/tunings", params={"engine": "vllm"}).json()["items"]] == [
        recorded.json()["id"]]
    for refused in (app_client.post("/v1/tunings/lookup", json=lookup_body() | {
                        "key": {**named["key"], "engine": "sglang"}}),
                    app_client.get("/v1/tunings", params={"engine": "sglang"})):
        assert refused.status_code == 422 and "engine" in refused.text, refused.text
