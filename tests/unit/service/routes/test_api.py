"""HTTP API against a real database (SQLite and PostgreSQL) with the real H200 files."""

from __future__ import annotations

import hashlib
import threading
from concurrent.futures import ThreadPoolExecutor

from tests.support.paths import CUBLASLT_FILE, CUDNN_FILE
from tunecache.service import db
from tests.support.builders import h200_key, run_payload
from tests.support.builders import record, upload


def test_health_and_openapi(app_client):
    health = app_client.get("/v1/health").json()
    assert health["status"] == "ok" and health["schema_revision"] == db.head_revision()
    assert health["database"] in ("sqlite", "postgresql")
    paths = app_client.get("/openapi.json").json()["paths"]
    assert {"/v1/tunings", "/v1/tunings/lookup", "/v1/artifacts/{sha256}", "/v1/health"} <= set(paths)


def test_upload_lookup_download_round_trip(app_client):
    run = record(app_client)
    body = {"key": h200_key().model_dump(), "environment": run_payload(CUDNN_FILE)["environment"]}
    found = app_client.post("/v1/tunings/lookup", json=body)
    assert found.status_code == 200
    assert found.json()["id"] == run["id"]
    artifact = found.json()["artifacts"][0]
    download = app_client.get(artifact["download_path"])
    assert download.status_code == 200
    assert download.content == CUDNN_FILE.read_bytes()
    assert hashlib.sha256(download.content).hexdigest() == artifact["sha256"]
    assert download.headers["etag"] == f'"{artifact["sha256"]}"'
    assert app_client.get(f"/v1/tunings/{run['id']}").json()["is_current"] is True


def test_upload_is_idempotent(app_client):
    data = CUBLASLT_FILE.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    assert app_client.put(f"/v1/artifacts/{digest}", content=data).status_code == 201
    again = app_client.put(f"/v1/artifacts/{digest}", content=data)
    assert again.status_code == 200 and again.json()["created"] is False
    wrong = app_client.put(f"/v1/artifacts/{digest}", content=b"hello")  # stored already, other bytes
    assert wrong.status_code == 422 and "hashes to sha256" in wrong.json()["detail"]
    assert app_client.get(f"/v1/artifacts/{digest}").content == data


def test_summary_nested_too_deep_is_422_not_500(app_client):
    nested: list = []
    for _ in range(300):
        nested = [nested]
    body = run_payload(CUDNN_FILE, summary={"a": nested})
    response = app_client.post("/v1/tunings", json=body)
    assert response.status_code == 422 and response.json()["detail"][0]["loc"] == ["body", "summary"]
    assert "nested deeper than 64 levels" in response.json()["detail"][0]["msg"]


def test_lookup_miss_is_404_with_differences(app_client):
    run = record(app_client)
    environment = run_payload(CUDNN_FILE)["environment"] | {"cudnn_version": "91700"}
    miss = app_client.post("/v1/tunings/lookup", json={"key": h200_key().model_dump(), "environment": environment})
    assert miss.status_code == 404
    body = miss.json()
    assert body["closest"][0]["run_id"] == run["id"]
    assert body["closest"][0]["differences"] == [{"field": "cudnn_version", "stored": "91900", "yours": "91700"}]
    assert "cudnn_version: stored 91900, yours 91700" in body["detail"]


def test_invalid_bodies_are_422_naming_the_field(app_client):
    payload = run_payload(CUDNN_FILE)
    payload["key"]["max_num_batched_tokens"] = 0
    response = app_client.post("/v1/tunings", json=payload)
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "key", "max_num_batched_tokens"]

    payload = run_payload(CUDNN_FILE) | {"colour": "blue"}
    response = app_client.post("/v1/tunings", json=payload)
    assert response.status_code == 422 and response.json()["detail"][0]["loc"] == ["body", "colour"]

    payload = run_payload(CUDNN_FILE)
    payload["key"]["arch"] = "hopper"
    response = app_client.post("/v1/tunings", json=payload)
    assert response.status_code == 422 and response.json()["detail"][0]["loc"] == ["body", "key", "arch"]

    response = app_client.post("/v1/tunings/lookup", json={"key": h200_key().model_dump()})
    assert response.status_code == 422 and response.json()["detail"][0]["loc"] == ["body", "environment"]


def test_run_referring_to_missing_bytes_is_422_and_stores_nothing(app_client):
    payload = run_payload(CUDNN_FILE)
    response = app_client.post("/v1/tunings", json=payload)
    assert response.status_code == 422
    assert response.json()["missing"] == [payload["artifacts"][0]["sha256"]]
    assert app_client.get("/v1/tunings").json()["total"] == 0


def test_unknown_environment_is_422(app_client):
    upload(app_client, CUDNN_FILE)
    payload = run_payload(CUDNN_FILE)
    payload["environment"]["gpu"] = "unknown"
    response = app_client.post("/v1/tunings", json=payload)
    assert response.status_code == 422 and "gpu" in response.json()["detail"]


def test_artifact_digest_mismatch_and_bad_sha(app_client):
    data = CUDNN_FILE.read_bytes()
    wrong = hashlib.sha256(b"other").hexdigest()
    response = app_client.put(f"/v1/artifacts/{wrong}", content=data)
    assert response.status_code == 422 and "hashes to sha256" in response.json()["detail"]
    assert app_client.get(f"/v1/artifacts/{wrong}").status_code == 404
    bad = app_client.get("/v1/artifacts/not-a-sha")
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["path", "sha256"]


def test_upload_over_limit_is_413_and_stores_nothing(app_client):
    # app_client's limit is 1,000,000 bytes
    data = b"x" * 1_000_001
    digest = hashlib.sha256(data).hexdigest()
    response = app_client.put(f"/v1/artifacts/{digest}", content=data)
    assert response.status_code == 413
    assert "TUNECACHE_MAX_UPLOAD_BYTES" in response.json()["detail"]

    def chunks():  # no Content-Length: counted as it streams
        for _ in range(11):
            yield b"y" * 100_000

    streamed = app_client.put(f"/v1/artifacts/{digest}", content=chunks())
    assert streamed.status_code == 413
    assert app_client.get(f"/v1/artifacts/{digest}").status_code == 404


def test_list_filters_and_pages(app_client):
    first = record(app_client, key=h200_key(max_num_batched_tokens=4096))
    second = record(app_client, CUBLASLT_FILE)
    third = record(app_client)
    everything = app_client.get("/v1/tunings").json()
    assert [r["id"] for r in everything["items"]] == [third["id"], second["id"], first["id"]]
    only_8192 = app_client.get("/v1/tunings", params={"max_num_batched_tokens": 8192}).json()
    assert only_8192["total"] == 2
    current = app_client.get("/v1/tunings", params={"current_only": True}).json()
    assert {r["id"] for r in current["items"]} == {first["id"], third["id"]}
    page = app_client.get("/v1/tunings", params={"limit": 1, "offset": 1}).json()
    assert [r["id"] for r in page["items"]] == [second["id"]] and page["total"] == 3
    assert app_client.get("/v1/tunings", params={"limit": 0}).status_code == 422
    assert app_client.get("/v1/tunings/999999").status_code == 404


def test_a_diff_asked_while_the_process_computes_another_is_503_with_retry_after(app_client, monkeypatch):
    """A diff holds both files and their parsed entries (tens of MiB at the file bound) and a
    core for seconds, and anyone may ask for one: a server process computes one at a time,
    and tells another meanwhile to retry rather than hold one more pair of files."""
    from tunecache.service import run_diff

    a, b = record(app_client)["id"], record(app_client, CUBLASLT_FILE)["id"]
    first_inside, release = threading.Event(), threading.Event()
    real = run_diff.diff_runs

    def first_one_waits(*args):
        if not first_inside.is_set():
            first_inside.set()
            release.wait(10)
        return real(*args)

    monkeypatch.setattr(run_diff, "diff_runs", first_one_waits)
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(app_client.get, f"/v1/tunings/{a}/diff/{b}")
        assert first_inside.wait(10)
        second = app_client.get(f"/v1/tunings/{a}/diff/{b}")
        release.set()
        assert second.status_code == 503, second.text[:200]
        assert second.headers["retry-after"] == "1" and "another diff" in second.json()["detail"]
        assert first.result().status_code == 200
    assert app_client.get(f"/v1/tunings/{a}/diff/{b}").status_code == 200  # the process's slot is free again
