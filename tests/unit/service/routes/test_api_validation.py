"""Bad input never reaches the database: each case is a JSON 4xx naming the problem,
and what is stored stays as it was. (Cases found by trying to break the API.)"""

from __future__ import annotations

import hashlib
import json

import pytest

from tests.support.builders import make_token
from tests.support.paths import CUBLASLT_FILE, CUDNN_FILE
from tests.support.builders import h200_key, run_payload
from tests.support.builders import record, upload


def post_run(client, payload):
    return client.post("/v1/tunings", json=payload)


def first_error(response):
    body = response.json()
    assert response.headers["content-type"].startswith("application/json")
    return body["detail"][0] if isinstance(body["detail"], list) else body["detail"]


@pytest.mark.parametrize(
    "change, where",
    [
        ({"artifacts": []}, "needs a flashinfer_autotune_v1 artifact"),
        ({"started_at": "2026-01-01T00:00:00", "finished_at": "2026-01-01T00:01:00Z"}, "timezone"),
        ({"started_at": "2026-01-02T00:00:00Z", "finished_at": "2026-01-01T00:00:00Z"}, "earlier than started_at"),
        ({"summary": {"x": float("nan")}}, "NaN"),
        ({"node": "a\x00b"}, "NUL"),
    ],
)
def test_inconsistent_runs_are_422(app_client, change, where):
    previous = record(app_client)
    payload = run_payload(CUDNN_FILE) | change
    # json.dumps writes NaN as a hostile client would; httpx's json= refuses to
    response = app_client.post("/v1/tunings", content=json.dumps(payload).encode(), headers={"content-type": "application/json"})
    assert response.status_code == 422, response.text
    assert where in str(first_error(response))
    current = app_client.get("/v1/tunings", params={"current_only": True}).json()["items"]
    assert [r["id"] for r in current] == [previous["id"]]


def test_duplicate_artifact_names_and_traversal_are_422(app_client):
    upload(app_client, CUDNN_FILE)
    payload = run_payload(CUDNN_FILE)
    payload["artifacts"] = payload["artifacts"] * 2
    assert "unique" in str(first_error(post_run(app_client, payload)))
    for name in ("../../etc/passwd", ".hidden", "a/../b", "/abs"):
        payload = run_payload(CUDNN_FILE)
        payload["artifacts"][0]["name"] = name
        response = post_run(app_client, payload)
        assert response.status_code == 422 and first_error(response)["loc"][-1] == "name", name


@pytest.mark.parametrize("value", ["8192", True, 1e400])
def test_key_numbers_are_strict(app_client, value):
    payload = run_payload(CUDNN_FILE)
    payload["key"]["max_num_batched_tokens"] = value
    body = json.dumps(payload)  # writes Infinity, as a hostile client would
    response = app_client.post("/v1/tunings", content=body.encode(), headers={"content-type": "application/json"})
    assert response.status_code == 422
    assert first_error(response)["loc"] == ["body", "key", "max_num_batched_tokens"]


@pytest.mark.parametrize(
    "path",
    [
        "/v1/tunings/9223372036854775808",
        "/v1/tunings/2147483648",
        "/v1/tunings?offset=9223372036854775808",
        "/v1/tunings?max_num_batched_tokens=99999999999999999999",
        "/v1/tunings?model=%00",
        "/v1/tuning-jobs/2147483648",
    ],
)
def test_out_of_range_queries_are_422(app_client, path):
    response = app_client.get(path)
    assert response.status_code == 422 and response.headers["content-type"].startswith("application/json")


def test_nul_in_key_strings_is_422(app_client):
    response = app_client.post("/v1/tunings/lookup", json={
        "key": h200_key().model_dump() | {"model": "a\x00b"}, "environment": run_payload(CUDNN_FILE)["environment"]})
    assert response.status_code == 422 and first_error(response)["loc"] == ["body", "key", "model"]


def test_times_keep_their_instant_on_every_database(app_client):
    upload(app_client, CUDNN_FILE)
    run = post_run(app_client, run_payload(CUDNN_FILE, started_at="2026-01-01T02:00:00+02:00",
                                           finished_at="2026-01-01T00:30:00Z")).json()
    stored = app_client.get(f"/v1/tunings/{run['id']}").json()
    assert stored["started_at"] in ("2026-01-01T00:00:00Z", "2026-01-01T00:00:00+00:00")
    assert stored["finished_at"] in ("2026-01-01T00:30:00Z", "2026-01-01T00:30:00+00:00")
    assert stored["duration_s"] == 1800


def test_chunked_oversized_json_is_413(app_client):
    def chunks():
        yield b'{"key": {"model": "'
        for _ in range(11):
            yield b"x" * 100_000
        yield b'"}}'

    response = app_client.post("/v1/tunings", content=chunks(), headers={"content-type": "application/json"})
    assert response.status_code == 413 and "TUNECACHE_MAX_JSON_BYTES" in response.json()["detail"]


def test_head_says_whether_bytes_are_stored(app_client):
    digest = upload(app_client, CUBLASLT_FILE)
    present = app_client.head(f"/v1/artifacts/{digest}")
    assert present.status_code == 200 and int(present.headers["content-length"]) == len(CUBLASLT_FILE.read_bytes())
    assert app_client.head(f"/v1/artifacts/{hashlib.sha256(b'x').hexdigest()}").status_code == 404


def test_large_artifact_streams_through_several_chunks(engine):
    from fastapi.testclient import TestClient

    from tunecache.service.app import create_app
    from tunecache.service.settings import Settings

    data = hashlib.sha256(b"seed").digest() * (9 * 1024 * 1024 // 32 + 7)  # ~9 MiB: 3 chunks
    digest = hashlib.sha256(data).hexdigest()
    settings = Settings(database_url=str(engine.url), max_upload_bytes=64 * 1024 * 1024, worker="off")
    with TestClient(create_app(settings, engine=engine)) as client:
        client.headers["Authorization"] = f"Bearer {make_token(engine, 'test-admin', 'admin')}"
        assert client.put(f"/v1/artifacts/{digest}", content=iter([data[i:i + 65536] for i in range(0, len(data), 65536)])).status_code == 201
        download = client.get(f"/v1/artifacts/{digest}")
    assert download.status_code == 200 and int(download.headers["content-length"]) == len(data)
    assert hashlib.sha256(download.content).hexdigest() == digest


def test_job_requests_are_bounded_and_valid(engine):
    from fastapi.testclient import TestClient

    from tunecache.service.app import create_app
    from tunecache.service.settings import Settings

    settings = Settings(database_url=str(engine.url), max_upload_bytes=8 * 1024 * 1024, worker="off")
    with TestClient(create_app(settings, engine=engine)) as client:
        client.headers["Authorization"] = f"Bearer {make_token(engine, 'test-admin', 'admin')}"
        check_job_bounds(client)


def check_job_bounds(app_client):
    key = h200_key().model_dump()
    big = {"k": "x" * (1024 * 1024 + 1)}
    for body, where in (
        ({"key": key, "hf_config": big}, "at most"),
        ({"key": key, "stages": []}, "at least 1"),
    ):
        response = app_client.post("/v1/tuning-jobs", json=body)
        assert response.status_code == 422 and where in str(first_error(response)), response.text
    nan = app_client.post("/v1/tuning-jobs", content=json.dumps({"key": key, "hf_config": {"x": float("nan")}}).encode(),
                          headers={"content-type": "application/json"})
    assert nan.status_code == 422 and "NaN" in str(first_error(nan))
    assert app_client.get("/v1/tuning-jobs").json()["total"] == 0


def test_lone_surrogates_are_a_422_not_a_crash(app_client):
    body = '{"key": {"gpu_name": "NVIDIA H200", "arch": "sm90", "model": "\\ud800", "max_num_batched_tokens": 8}}'
    for path in ("/v1/tuning-jobs", "/v1/tunings/lookup", "/v1/tunings"):
        response = app_client.post(path, content=body.encode(), headers={"content-type": "application/json"})
        assert response.status_code == 422, (path, response.text)
