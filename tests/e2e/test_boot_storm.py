"""A fleet booting at once, against real ``tunecache serve`` processes on PostgreSQL and
SQLite: every request is answered (200, or a fast 503 with ``Retry-After``), the service
answers normally right after, two replicas behave as one service, and artifacts carry the
HTTP caching headers any cache in front can use.

The throughput figures live in ``bench/boot_storm.py``; nothing here is timed beyond
"answered at all" and "answered within 2 s after the storm".
"""

from __future__ import annotations

import asyncio
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tunecache.store.http import KEEPALIVE_EXPIRY_S

from tests.support.cli import tunecache
from tests.support.serve import as_admin, push_run, start_server, stop_server
from tests.support.builders import h200_key, lookup_body

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

        job = {"key": h200_key(model="replicated").model_dump(), "hf_config": {"model_type": "llama", "hidden_size": 8}}
        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(lambda i: as_admin.post(f"{(url_a, url_b)[i % 2]}/v1/tuning-jobs", json=job, timeout=30),
                                    range(40)))
        assert {r.status_code for r in answers} == {202} and len({r.json()["id"] for r in answers}) == 1
    finally:
        stop_server(a)
        stop_server(b)
