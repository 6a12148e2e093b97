"""The local admin token stays local (issue 39, row 6), with real ``tunecache serve`` processes
and the installed ``tunecache`` command: it goes to the service that wrote it and to nothing
else on the machine (a listener on another port, one relaying the real service from an
address the service once listened on); two services on one machine keep their own tokens; a
401 names the token sent; an open read never fails because of the token sent along."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.support import forked
from tests.support.cli import tunecache_executable
from tests.support.relay import pump
from tests.support.serve import free_port
from tunecache.formats.local_token import ADMIN_TOKEN, Listener, read_record, with_listener, write_record
from tunecache.service import db

UNKNOWN_TOKEN = "tc_0123456789abcdef_" + "u" * 43


def _cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    return forked.run(list(args), env={**os.environ, **env})


class PlainListener:
    """A plain TCP listener on a loopback port of its own (the kernel's pick, held from the
    start): keeps every byte it is sent; answers each request with a 404, or passes the
    connection on to ``relay_to`` (host, port) both ways."""

    def __init__(self, relay_to: tuple[str, int] | None = None):
        self.received = bytearray()
        self.relay_to = relay_to
        self._socket = socket.create_server(("127.0.0.1", 0))
        self.port = self._socket.getsockname()[1]
        self._socket.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                connection, _ = self._socket.accept()
            except TimeoutError:
                continue
            threading.Thread(target=self._handle, args=(connection,), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, keep: bool) -> None:
        pump(source, sink, 65536, self.received.extend if keep else None)

    def _handle(self, connection: socket.socket) -> None:
        if self.relay_to is not None:
            upstream = socket.create_connection(self.relay_to)
            threading.Thread(target=self._pump, args=(upstream, connection, False), daemon=True).start()
            self._pump(connection, upstream, True)
            return
        with connection:
            connection.settimeout(5)
            request = bytearray()
            try:
                while b"\r\n\r\n" not in request:
                    data = connection.recv(65536)
                    if not data:
                        return
                    request.extend(data)
                    self.received.extend(data)
                body = b'{"detail": "nothing here"}'
                connection.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: "
                                   + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
            except OSError:
                pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._socket.close()


def _local_token() -> str:
    return (Path(os.environ["TUNECACHE_DATA_DIR"]) / ADMIN_TOKEN).read_text().strip()


def test_a_listener_on_another_loopback_port_gets_no_token(server):
    """Before: every loopback URL got the admin token of the machine's ``tunecache serve``."""
    assert _cli("token", "list", "--server", server).returncode == 0  # the service that wrote it: yes
    listener = PlainListener()
    try:
        answer = _cli("token", "list", "--server", f"http://127.0.0.1:{listener.port}")
    finally:
        listener.close()
    assert answer.returncode == 5 and "server answered 404" in answer.stderr, answer.stderr  # the listener's answer
    received = bytes(listener.received)
    assert b"GET /v1/tokens" in received  # the command did reach it
    assert b"authorization" not in received.lower()
    assert _local_token().split("_", 2)[2].encode() not in received


def test_a_listener_relaying_the_service_from_an_address_it_once_listened_on_gets_no_token(server):
    """A port the service listened on at an earlier start (still in the record beside the token),
    now another process's that relays the real service: the service proves it holds the token,
    but for the address it listens on now, so the proof does not match and no token goes."""
    token_file = Path(os.environ["TUNECACHE_DATA_DIR"]) / ADMIN_TOKEN
    record = read_record(token_file)
    assert record is not None and [listener.url for listener in record.listeners] == [server]
    relay = PlainListener(relay_to=("127.0.0.1", int(server.rsplit(":", 1)[1])))
    old_port = relay.port
    write_record(token_file, with_listener(record, record.database, Listener(scheme="http", host="127.0.0.1",
                                                                             port=old_port)))
    try:
        answer = _cli("token", "list", "--server", f"http://127.0.0.1:{old_port}")
    finally:
        relay.close()
    received = bytes(relay.received)
    assert b"GET /v1/token-proof?" in received  # it was asked, and the real service answered through the relay
    assert b"authorization" not in received.lower()
    assert answer.returncode == 13 and "token sent: no token (the service at" in answer.stderr, answer.stderr


def _serve(data_dir: Path, port: int, *database: str) -> subprocess.Popen:
    log = open(data_dir.parent / f"serve-{port}.log", "w")
    process = subprocess.Popen([tunecache_executable(), "serve", "--port", str(port), *database], stdout=log, stderr=log,
                               env={**os.environ, "TUNECACHE_WORKER": "off", "TUNECACHE_DATA_DIR": str(data_dir)})
    for _ in range(300):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/health", timeout=1).status_code == 200:
                return process
        except httpx.TransportError:
            pass
        assert process.poll() is None, (data_dir.parent / f"serve-{port}.log").read_text()
        time.sleep(0.1)
    pytest.fail((data_dir.parent / f"serve-{port}.log").read_text())


def test_two_serve_on_one_machine_keep_both_tokens(database_url, tmp_path):
    """The quick start's SQLite service, then a second one on another database (the step to
    PostgreSQL) with the same data dir: before, the second overwrote ``admin.token`` and even
    the first one's open reads failed 401 (exit 13) without saying which token was sent."""
    if database_url.startswith("postgresql"):  # an operator runs `tunecache db upgrade` first
        engine = db.create_db_engine(database_url)
        try:
            db.upgrade(engine)
        finally:
            engine.dispose()
    else:
        database_url = f"sqlite:///{tmp_path / 'second.db'}"
    data_dir = tmp_path / "machine-data"
    env = {"TUNECACHE_DATA_DIR": str(data_dir)}
    first_port, second_port = free_port(), free_port()
    first = _serve(data_dir, first_port)  # the embedded SQLite default
    try:
        second = _serve(data_dir, second_port, "--database", database_url)
        try:
            files = sorted(p.name for p in data_dir.glob("admin*.token"))
            assert len(files) == 2 and ADMIN_TOKEN in files, files
            for port in (first_port, second_port):
                url = f"http://127.0.0.1:{port}"
                listed = _cli("token", "list", "--server", url, **env)  # admin: each its own token
                assert listed.returncode == 0, listed.stderr
                assert _cli("history", "--server", url, **env).returncode == 0
        finally:
            second.terminate()
            second.wait(timeout=30)
        # a restart of the first one on another port: still its token, and the record says where
        first.terminate()
        first.wait(timeout=30)
        moved = free_port()
        first = _serve(data_dir, moved)
        assert _cli("token", "list", "--server", f"http://127.0.0.1:{moved}", **env).returncode == 0
        assert sorted(p.name for p in data_dir.glob("admin*.token")) == files
    finally:
        first.terminate()
        first.wait(timeout=30)


def test_a_401_names_the_token_sent(server, tmp_path):
    token_file = tmp_path / "ops.token"
    token_file.write_text(UNKNOWN_TOKEN + "\n")
    for args, env, named in (
        (["--token", UNKNOWN_TOKEN], {}, "[token sent: --token]"),
        ([], {"TUNECACHE_TOKEN": UNKNOWN_TOKEN}, "[token sent: TUNECACHE_TOKEN]"),
        ([], {"TUNECACHE_TOKEN_FILE": str(token_file)}, f"[token sent: TUNECACHE_TOKEN_FILE={str(token_file)!r}]"),
        ([], {"TUNECACHE_DATA_DIR": str(tmp_path / "empty")}, "[token sent: no token]"),
    ):
        refused = _cli(*args, "token", "list", "--server", server, **env)
        assert refused.returncode == 13, refused.stderr
        lines = refused.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("tunecache: error: server answered 401") and named in lines[0], \
            refused.stderr


def test_an_open_read_with_a_token_the_server_does_not_know_succeeds(server):
    """A stale token, or another service's: the read is open, so it is answered (as anonymous)."""
    assert _cli("history", "--server", server, TUNECACHE_TOKEN=UNKNOWN_TOKEN).returncode == 0
    assert _cli("--token", UNKNOWN_TOKEN, "history", "--server", server).returncode == 0
    refused = _cli("--token", UNKNOWN_TOKEN, "token", "list", "--server", server)  # a write needs a token it knows
    assert refused.returncode == 13 and "[token sent: --token]" in refused.stderr
