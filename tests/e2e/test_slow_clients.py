"""Slow, idle and unreading clients against a real ``tunecache serve`` (issue 21): they do not
take the in-flight limit from pods that boot, they are timed out
(``TUNECACHE_HEADER_TIMEOUT_SECONDS``, ``TUNECACHE_BODY_TIMEOUT_SECONDS``,
``TUNECACHE_SEND_TIMEOUT_SECONDS``, ``TUNECACHE_KEEP_ALIVE_SECONDS`` for a connection that
sends nothing), one client address cannot take the process's file limit
(``TUNECACHE_MAX_CONNECTIONS_PER_ADDRESS``), and the ``Host`` and ``X-Forwarded-Proto`` a
request carries are believed only as configured (``TUNECACHE_ALLOWED_HOSTS``,
``TUNECACHE_TRUSTED_PROXIES``).

Raw sockets, from 127.0.0.1 and, as "another client address", 127.0.0.2 (Linux answers the
whole of 127.0.0.0/8). The connection layer asks nothing of the database: the servers run on
SQLite only. Every wait is bounded (tens of seconds at most).
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.support.builders import lookup_body
from tests.support.cli import pull, tunecache_executable
from tests.support.serve import as_admin, free_port, push_run, share_admin_token, start_server, stop_server

OTHER_ADDRESS = "127.0.0.2"
BIG_ARTIFACT_BYTES = 16 * 1024 * 1024


def _sqlite(tmp_path: Path, name: str) -> str:
    return f"sqlite:///{tmp_path / f'{name}.db'}"


def _connect(url: str, source: str = "127.0.0.1", rcvbuf: int | None = None) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket()
    if rcvbuf is not None:  # before connecting: the window the client offers stays small
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.bind((source, 0))
    sock.settimeout(10)
    sock.connect((host, int(port)))
    return sock


def _read_until_closed(sock: socket.socket, timeout: float) -> tuple[bytes, bool]:
    """What the service sends until it closes the connection or ``timeout`` passes:
    (bytes, closed?). A reset counts as closed."""
    got = b""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            part = sock.recv(65536)
        except TimeoutError:
            return got, False
        except ConnectionResetError:
            return got, True
        if not part:
            return got, True
        got += part
    return got, False


def _body_of(answer: bytes) -> dict:
    return json.loads(answer.split(b"\r\n\r\n", 1)[1])


def _push_big_artifact(server: str) -> str:
    data = os.urandom(BIG_ARTIFACT_BYTES)
    sha = hashlib.sha256(data).hexdigest()
    assert as_admin.put(f"{server}/v1/artifacts/{sha}", content=data, timeout=60).status_code in (200, 201)
    return sha


def _slow_body(server: str) -> socket.socket:
    """A lookup whose body (1,000 bytes declared) stops after 10."""
    sock = _connect(server)
    sock.sendall(b"POST /v1/tunings/lookup HTTP/1.1\r\nHost: tunecache\r\ncontent-type: application/json\r\n"
                 b"content-length: 1000\r\n\r\n{\"key\": {}")
    return sock


def _unread_download(server: str, sha: str) -> socket.socket:
    """A download of the big artifact whose answer is never read."""
    sock = _connect(server, rcvbuf=4096)
    sock.sendall(f"GET /v1/artifacts/{sha} HTTP/1.1\r\nHost: tunecache\r\n\r\n".encode())
    return sock


@pytest.mark.parametrize("processes", [1, 2])
def test_slow_bodies_and_unread_answers_leave_the_service_answering(tmp_path, processes):
    """Clients that send their bodies slowly and clients that never read their answers, six times the
    in-flight limit of each process, and long timeouts (they stay for the whole test): health
    checks and lookups are answered 200 within 2 s throughout, never 503, and a pod's
    ``tunecache pull`` installs."""
    process, server = start_server(
        _sqlite(tmp_path, "slow"), tmp_path, "slow", TUNECACHE_SERVER_PROCESSES=str(processes),
        TUNECACHE_MAX_IN_FLIGHT="16", TUNECACHE_BODY_TIMEOUT_SECONDS="120", TUNECACHE_SEND_TIMEOUT_SECONDS="120")
    held: list[socket.socket] = []
    try:
        run = push_run(server)
        sha = _push_big_artifact(server)
        for _ in range(48 * processes):
            held.append(_slow_body(server))
        for _ in range(48 * processes):
            held.append(_unread_download(server, sha))
        time.sleep(1)  # every request has started: the bodies wait, the downloads are stuck
        body, statuses, slowest = lookup_body(), [], 0.0
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            for call in (lambda: httpx.get(f"{server}/v1/health", timeout=2),
                         lambda: httpx.post(f"{server}/v1/tunings/lookup", json=body, timeout=2)):
                started = time.monotonic()
                answer = call()
                slowest = max(slowest, time.monotonic() - started)
                statuses.append(answer.status_code)
                if answer.status_code == 200 and answer.request.url.path.endswith("lookup"):
                    assert answer.json()["id"] == run["id"]
            time.sleep(0.2)
        assert set(statuses) == {200}, f"{statuses.count(503)} of {len(statuses)} answered 503"
        assert slowest < 2
        pulled = pull(server, tmp_path / "pulled")  # a pod boots warm, not cold (exit 5)
        assert pulled.returncode == 0, pulled.stderr
    finally:
        for sock in held:
            sock.close()
        stop_server(process)


def test_a_body_that_stops_is_answered_408_and_closed(tmp_path):
    process, server = start_server(_sqlite(tmp_path, "body"), tmp_path, "body", TUNECACHE_BODY_TIMEOUT_SECONDS="1")
    try:
        with _slow_body(server) as sock:
            answer, closed = _read_until_closed(sock, 15)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert "TUNECACHE_BODY_TIMEOUT_SECONDS" in _body_of(answer)["detail"]
        assert closed
        # a body that arrives, however it is split, is not cut
        with _connect(server) as sock:
            payload = json.dumps(lookup_body()).encode()
            sock.sendall(b"POST /v1/tunings/lookup HTTP/1.1\r\nHost: tunecache\r\ncontent-type: application/json\r\n"
                         b"connection: close\r\ncontent-length: %d\r\n\r\n" % len(payload) + payload[:20])
            time.sleep(0.5)
            sock.sendall(payload[20:])
            answer, _ = _read_until_closed(sock, 15)
        assert answer.startswith(b"HTTP/1.1 404"), answer[:200]  # no run of that key: a clean miss
    finally:
        stop_server(process)


def test_an_answer_the_client_does_not_read_is_dropped(tmp_path):
    process, server = start_server(_sqlite(tmp_path, "send"), tmp_path, "send", TUNECACHE_SEND_TIMEOUT_SECONDS="1")
    try:
        sha = _push_big_artifact(server)
        with _unread_download(server, sha) as sock:
            time.sleep(4)  # reads nothing for four times the setting
            answer, closed = _read_until_closed(sock, 30)
        assert closed
        assert len(answer) < BIG_ARTIFACT_BYTES  # dropped, not sent whole
        # a client that reads gets the whole artifact
        assert len(httpx.get(f"{server}/v1/artifacts/{sha}", timeout=30).content) == BIG_ARTIFACT_BYTES
    finally:
        stop_server(process)


def test_idle_and_slow_header_connections_are_closed(tmp_path):
    process, server = start_server(_sqlite(tmp_path, "idle"), tmp_path, "idle", TUNECACHE_KEEP_ALIVE_SECONDS="1",
                                   TUNECACHE_HEADER_TIMEOUT_SECONDS="1")
    try:
        with _connect(server) as sock:  # sends nothing at all
            answer, closed = _read_until_closed(sock, 15)
        assert closed and answer == b""
        with _connect(server) as sock:  # headers a line every 0.3 s, never complete
            sock.sendall(b"GET /v1/health HTTP/1.1\r\nHost: tunecache\r\n")
            deadline = time.monotonic() + 15
            try:
                while time.monotonic() < deadline:
                    sock.sendall(b"x-slow: 1\r\n")
                    time.sleep(0.3)
            except (BrokenPipeError, ConnectionResetError):
                pass
            answer, closed = _read_until_closed(sock, 5)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert "TUNECACHE_HEADER_TIMEOUT_SECONDS" in _body_of(answer)["detail"]
        assert closed
        assert httpx.get(f"{server}/v1/health", timeout=5).status_code == 200
    finally:
        stop_server(process)


def _start_with_file_limit(tmp_path: Path, files: int, **env: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    log = open(tmp_path / "limited.log", "w")

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (files, files))

    process = subprocess.Popen(
        [tunecache_executable(), "serve", "--port", str(port), "--database", _sqlite(tmp_path, "limited")],
        stdout=log, stderr=log, preexec_fn=limit,
        env={**os.environ, "TUNECACHE_WORKER": "off", "TUNECACHE_DATA_DIR": str(tmp_path / "limited-data"), **env})
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            if httpx.get(f"{url}/v1/health", timeout=1).status_code == 200:
                share_admin_token(tmp_path / "limited-data")
                return process, url
        except httpx.TransportError:
            pass
        assert process.poll() is None, (tmp_path / "limited.log").read_text()
        time.sleep(0.1)
    pytest.fail((tmp_path / "limited.log").read_text())


def test_one_address_cannot_take_the_file_limit(tmp_path):
    """300 idle connections from one address against a process of 256 files: past the cap
    of that address they get 429 and are closed, and another address is answered."""
    process, server = _start_with_file_limit(tmp_path, 256, TUNECACHE_MAX_CONNECTIONS_PER_ADDRESS="100",
                                             TUNECACHE_KEEP_ALIVE_SECONDS="60")
    held: list[socket.socket] = []
    try:
        for _ in range(300):
            held.append(_connect(server))
        time.sleep(1)
        other = httpx.Client(transport=httpx.HTTPTransport(local_address=OTHER_ADDRESS), timeout=10)
        with other:
            assert other.get(f"{server}/v1/health").status_code == 200
        with _connect(server) as sock:  # one more from the same address
            answer, closed = _read_until_closed(sock, 15)
        assert answer.startswith(b"HTTP/1.1 429"), answer[:200]
        assert "TUNECACHE_MAX_CONNECTIONS_PER_ADDRESS" in _body_of(answer)["detail"]
        assert closed
    finally:
        for sock in held:
            sock.close()
        stop_server(process)


def test_the_host_header_is_checked_against_the_allowed_hosts(tmp_path):
    process, server = start_server(_sqlite(tmp_path, "hosts"), tmp_path, "hosts",
                                   TUNECACHE_ALLOWED_HOSTS="tunecache.internal, 127.0.0.1")
    try:
        rebound = httpx.get(f"{server}/v1/health", headers={"Host": "rebound.example"}, timeout=5)
        assert rebound.status_code == 400
        assert "TUNECACHE_ALLOWED_HOSTS" in rebound.json()["detail"] and "rebound.example" in rebound.json()["detail"]
        assert httpx.get(f"{server}/", headers={"Host": "rebound.example"}, timeout=5).status_code == 400
        assert httpx.get(f"{server}/v1/health", headers={"Host": "tunecache.internal:8321"}, timeout=5).status_code == 200
        assert httpx.get(f"{server}/v1/health", timeout=5).status_code == 200  # Host: 127.0.0.1:<port>
    finally:
        stop_server(process)
    process, server = start_server(_sqlite(tmp_path, "hosts"), tmp_path, "any-host")
    try:  # unset: any Host, as before the setting
        assert httpx.get(f"{server}/v1/health", headers={"Host": "rebound.example"}, timeout=5).status_code == 200
    finally:
        stop_server(process)


def _cookies_secure(server: str, source: str, proto: str) -> list[bool]:
    with httpx.Client(transport=httpx.HTTPTransport(local_address=source), timeout=5) as client:
        answer = client.get(f"{server}/sign-in", headers={"X-Forwarded-Proto": proto})
    assert answer.status_code == 200, answer.text
    cookies = answer.headers.get_list("set-cookie")
    assert cookies
    return ["secure" in [part.strip().lower() for part in cookie.split(";")] for cookie in cookies]


def test_the_dashboard_cookie_is_secure_behind_a_trusted_tls_proxy(tmp_path):
    """A TLS proxy at 127.0.0.2 (``TUNECACHE_TRUSTED_PROXIES``) forwards plain HTTP with
    ``X-Forwarded-Proto: https``: the cookies are ``Secure``; the same header from an
    address not named there (loopback too) is not believed."""
    process, server = start_server(_sqlite(tmp_path, "proxy"), tmp_path, "proxy",
                                   TUNECACHE_TRUSTED_PROXIES=OTHER_ADDRESS)
    try:
        assert all(_cookies_secure(server, OTHER_ADDRESS, "https"))
        assert not any(_cookies_secure(server, OTHER_ADDRESS, "http"))
        assert not any(_cookies_secure(server, "127.0.0.1", "https"))
    finally:
        stop_server(process)


@pytest.mark.parametrize(("variable", "value"), [
    ("TUNECACHE_ALLOWED_HOSTS", "tune*cache.internal"), ("TUNECACHE_ALLOWED_HOSTS", " , "),
    ("TUNECACHE_MAX_CONNECTIONS_PER_ADDRESS", "0"), ("TUNECACHE_HEADER_TIMEOUT_SECONDS", "0"),
    ("TUNECACHE_BODY_TIMEOUT_SECONDS", "-1"), ("TUNECACHE_SEND_TIMEOUT_SECONDS", "never"),
    ("TUNECACHE_TRUSTED_PROXIES", "*"), ("TUNECACHE_TRUSTED_PROXIES", "10.0.0.1,proxy.internal"),
])
def test_serve_refuses_a_bad_connection_setting_in_one_line(tmp_path, variable, value):
    with socket.socket() as busy:  # were the setting taken, serve would exit 11 on this port, not hang
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        result = subprocess.run(
            [tunecache_executable(), "serve", "--port", str(busy.getsockname()[1]), "--database", _sqlite(tmp_path, "bad")],
            capture_output=True, text=True, timeout=60, env={**os.environ, "TUNECACHE_WORKER": "off", variable: value})
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"({variable})" in lines[0], result.stderr
