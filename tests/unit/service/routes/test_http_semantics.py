"""HTTP as caches and pods rely on it, in process: artifacts carry caching headers, ranges and
methods answer as HTTP says, a rejected value is not echoed whole, job requests past the rate
get 429 (the boot storm itself, against real servers, is tests/e2e/test_boot_storm.py)."""

from __future__ import annotations

import hashlib


from tests.support.builders import make_token
from tests.support.paths import CUBLASLT_FILE
from tests.support.builders import h200_key, lookup_body


def test_artifacts_carry_http_caching_headers(app_client):
    data = CUBLASLT_FILE.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    app_client.put(f"/v1/artifacts/{sha}", content=data)
    full = app_client.get(f"/v1/artifacts/{sha}")
    assert full.status_code == 200 and full.content == data
    assert full.headers["etag"] == f'"{sha}"'
    assert full.headers["cache-control"] == "public, max-age=31536000, immutable"
    cached = app_client.get(f"/v1/artifacts/{sha}", headers={"If-None-Match": f'"{sha}"'})
    assert cached.status_code == 304 and cached.content == b"" and cached.headers["etag"] == f'"{sha}"'
    other = app_client.get(f"/v1/artifacts/{sha}", headers={"If-None-Match": '"0000"'})
    assert other.status_code == 200 and other.content == data
    part = app_client.get(f"/v1/artifacts/{sha}", headers={"Range": "bytes=100-199"})
    assert part.status_code == 206 and part.content == data[100:200]
    assert part.headers["content-range"] == f"bytes 100-199/{len(data)}"
    beyond = app_client.get(f"/v1/artifacts/{sha}", headers={"Range": f"bytes={len(data) + 10}-"})
    assert beyond.status_code == 416
    head = app_client.head(f"/v1/artifacts/{sha}")
    assert head.status_code == 200 and head.headers["content-type"] == "application/octet-stream"
    assert app_client.get(f"/v1/artifacts/{'0' * 64}").status_code == 404


def test_a_rejected_value_is_not_echoed_whole(app_client):
    body = lookup_body()
    body["key"]["model"] = "m" * 200_000
    response = app_client.post("/v1/tunings/lookup", json=body)
    assert response.status_code == 422 and len(response.content) < 2000
    assert response.json()["detail"][0]["loc"] == ["body", "key", "model"]


def test_job_requests_past_the_rate_get_429(engine, tmp_path):
    from fastapi.testclient import TestClient

    from tunecache.service.app import create_app
    from tunecache.service.settings import Settings

    settings = Settings(database_url=str(engine.url), worker="off", data_dir=tmp_path, job_request_rate="3/minute")
    job = {"key": h200_key().model_dump(), "hf_config": {"model_type": "llama", "hidden_size": 8}}
    with TestClient(create_app(settings, engine=engine)) as client:
        client.headers["Authorization"] = f"Bearer {make_token(engine, 'test-admin', 'admin')}"
        answers = [client.post("/v1/tuning-jobs", json=job) for _ in range(5)]
    assert [a.status_code for a in answers] == [202, 202, 202, 429, 429]
    assert 1 <= int(answers[3].headers["retry-after"]) <= 60
    assert "at most 3/minute" in answers[3].json()["detail"]


def test_ranges_and_methods_answer_as_http_says(app_client, tmp_path):
    data = CUBLASLT_FILE.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    app_client.put(f"/v1/artifacts/{sha}", content=data)
    assert app_client.get(f"/v1/artifacts/{sha}").headers["accept-ranges"] == "bytes"
    for malformed in ("bytes=5-2", "bytes=abc", "items=0-5", "bytes=-"):  # ignored: the whole artifact
        response = app_client.get(f"/v1/artifacts/{sha}", headers={"Range": malformed})
        assert response.status_code == 200 and response.content == data, malformed
    beyond = app_client.get(f"/v1/artifacts/{sha}", headers={"Range": f"bytes={len(data)}-"})
    assert beyond.status_code == 416 and beyond.headers["content-range"] == f"bytes */{len(data)}"
    assert "detail" in beyond.json()
    suffix = app_client.get(f"/v1/artifacts/{sha}", headers={"Range": "bytes=-100"})
    assert suffix.status_code == 206 and suffix.content == data[-100:]

    # the mirror is a cache: removed, it is filled again (ranges come from the file)
    import shutil

    shutil.rmtree(app_client.app.state.tunecache.artifact_files.root)
    again = app_client.get(f"/v1/artifacts/{sha}", headers={"Range": "bytes=0-9"})
    assert again.status_code == 206 and again.content == data[:10]

    for method, path, allowed in (
        ("DELETE", f"/v1/artifacts/{sha}", "GET, HEAD, PUT"),
        ("GET", "/v1/tunings/lookup", "POST"),
        ("PUT", "/v1/tunings", "GET, POST"),
        ("OPTIONS", "/v1/tuning-jobs", "GET, POST"),
        ("POST", "/v1/health", "GET"),
    ):
        response = app_client.request(method, path)
        assert response.status_code == 405 and response.headers["allow"] == allowed, (method, path)
        assert response.json()["detail"]


def test_a_path_no_route_has_is_a_404_naming_what_is_wrong(app_client):
    """``/v1/tunings/abc`` was a bare ``{"detail": "Not Found"}`` (the id ``0`` gets a 422)."""
    answer = app_client.get("/v1/tunings/abc")
    assert answer.status_code == 404
    assert answer.json() == {"detail": "no such route: /v1/tunings/abc ('abc' is not an id: ids are positive whole "
                                       "numbers)"}
    assert app_client.get("/v1/nothing-here").json() == {"detail": "no such route: /v1/nothing-here"}
    missing = app_client.get("/v1/tunings/424242")  # a route's own 404 keeps its own words
    assert missing.status_code == 404 and "no such route" not in missing.json()["detail"]
