"""A fleet booting at once, against real ``tunecache serve`` processes on PostgreSQL and
SQLite: every request is answered (200, or a fast 503 with ``Retry-After``), the service
answers normally right after, two replicas behave as one service, and artifacts carry the
HTTP caching headers any cache in front can use.

The throughput figures live in ``bench/boot_storm.py``; nothing here is timed beyond
"answered at all" and "answered within 2 s after the storm".
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from pathlib import Path

from tunecache.client.http import KEEPALIVE_EXPIRY_S

from tests.support.builders import make_token
from tests.support.cli import tunecache, tunecache_executable
from tests.support.paths import CUDNN_FILE, CUBLASLT_FILE
from tests.support.serve import as_admin, free_port, push_run, start_server, stop_server
from tests.support.builders import h200_key, lookup_body, run_payload

PODS = 300
STORM_SECONDS = 4


async def _storm(server: str, body: dict, sha: str) -> list[tuple[int, str | None]]:
    """PODS pods booting over and over for STORM_SECONDS: (status, Retry-After) of every answer."""
    answers: list[tuple[int, str | None]] = []
    deadline = time.monotonic() + STORM_SECONDS
    # Idle connections are dropped before the service's keep-alive (5 s) closes them, as
    # tunecache's client does (KEEPALIVE_EXPIRY_S): with httpx's default of 5 s, a pod now and
    # then reused a connection at the moment the service closed it and read a reset.
    limits = httpx.Limits(max_connections=PODS, max_keepalive_connections=PODS, keepalive_expiry=KEEPALIVE_EXPIRY_S)
    async with httpx.AsyncClient(base_url=server, limits=limits, timeout=30) as client:

        async def pod() -> None:
            while time.monotonic() < deadline:
                for response in (await client.post("/v1/tunings/lookup", json=body), await client.get(f"/v1/artifacts/{sha}")):
                    answers.append((response.status_code, response.headers.get("retry-after")))

        await asyncio.gather(*(pod() for _ in range(PODS)))
    return answers


def test_three_hundred_pods_booting_at_once_are_all_answered(database_url, tmp_path):
    """Few threads, few connections and a low in-flight limit, so the storm saturates the
    service: it must shed with 503 + Retry-After, never hang, and answer right after."""
    if database_url.startswith("postgresql"):
        tunecache("db", "upgrade", "--database", database_url, check=True)
    process, server = start_server(database_url, tmp_path, "storm", TUNECACHE_THREADS="4", TUNECACHE_MAX_IN_FLIGHT="64",
                             TUNECACHE_DB_POOL_TIMEOUT="1")
    try:
        run = push_run(server)
        body, sha = lookup_body(), run["artifacts"][0]["sha256"]
        answers = asyncio.run(_storm(server, body, sha))
        statuses = {status for status, _ in answers}
        assert statuses <= {200, 503}, statuses
        assert sum(1 for status, _ in answers if status == 200) > PODS  # pods did boot
        assert all(retry is not None for status, retry in answers if status == 503)
        started = time.monotonic()
        after = as_admin.post(f"{server}/v1/tunings/lookup", json=body, timeout=2)
        assert after.status_code == 200 and after.json()["id"] == run["id"]
        assert time.monotonic() - started < 2
    finally:
        stop_server(process)


def _idle_connection_closed_after(url: str, seconds: float) -> bool:
    """One HTTP/1.1 request on a raw socket, then ``seconds`` idle: has the service closed it?"""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(b"GET /v1/health HTTP/1.1\r\nHost: tunecache\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        time.sleep(seconds)
        sock.settimeout(0.5)
        try:
            while sock.recv(65536):  # the rest of the answer, if it came in more than one segment
                pass
            return True  # then the service's close
        except TimeoutError:
            return False


def test_idle_connections_are_closed_after_the_keep_alive_setting(tmp_path):
    """``TUNECACHE_KEEP_ALIVE_SECONDS`` reaches uvicorn: behind a proxy it must outlast the
    proxy's idle timeout, and tunecache's client expires its idle connections before it."""
    sqlite_url = f"sqlite:///{tmp_path / 'keep-alive.db'}"
    assert KEEPALIVE_EXPIRY_S < 5
    short, short_url = start_server(sqlite_url, tmp_path, "short", TUNECACHE_KEEP_ALIVE_SECONDS="1")
    try:
        assert _idle_connection_closed_after(short_url, 2.5)
    finally:
        stop_server(short)
    default, default_url = start_server(sqlite_url, tmp_path, "default")
    try:
        assert not _idle_connection_closed_after(default_url, 2.5)
    finally:
        stop_server(default)


@pytest.mark.postgres
def test_two_replicas_on_one_postgres_behave_as_one_service(postgres_schema_url, tmp_path):
    tunecache("db", "upgrade", "--database", postgres_schema_url, check=True)
    a, url_a = start_server(postgres_schema_url, tmp_path, "replica-a")
    b, url_b = start_server(postgres_schema_url, tmp_path, "replica-b")
    try:
        body = lookup_body()
        assert as_admin.post(f"{url_b}/v1/tunings/lookup", json=body).status_code == 404  # B caches the miss
        first = push_run(url_a)
        assert as_admin.post(f"{url_b}/v1/tunings/lookup", json=body).json()["id"] == first["id"]
        second = push_run(url_a)  # a newer run of the key, recorded through the other replica
        assert as_admin.post(f"{url_b}/v1/tunings/lookup", json=body).json()["id"] == second["id"]
        assert as_admin.post(f"{url_a}/v1/tunings/lookup", json=body).json()["id"] == second["id"]

        job = {"key": h200_key(model="replicated").model_dump(), "hf_config": {"hidden_size": 8}}
        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(lambda i: as_admin.post(f"{(url_a, url_b)[i % 2]}/v1/tuning-jobs", json=job, timeout=30),
                                    range(40)))
        assert {r.status_code for r in answers} == {202} and len({r.json()["id"] for r in answers}) == 1
    finally:
        stop_server(a)
        stop_server(b)


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
    job = {"key": h200_key().model_dump(), "hf_config": {"hidden_size": 8}}
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

    shutil.rmtree(app_client.app.state.artifact_files.root)
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
