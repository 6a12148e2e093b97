"""One deadline for a pod's whole install (``TUNECACHE_INSTALL_DEADLINE``): the lookup and
every artifact download share it, so a server that accepts and never answers, or one that
trickles its answer, cannot hold a pod's boot past it. Real sockets and the real CLI.
"""

from __future__ import annotations

import hashlib
import http.server
import os
import socket
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.support.cli import tunecache, tunecache_executable
from tests.support.paths import CUDNN_FILE
from tests.support.builders import file_environment, h200_key

# What this module tests happens on the pod: its server runs on SQLite only (tests/conftest.py).
SERVER_DATABASE_INCIDENTAL = True

MODEL = "meta-llama/Llama-3.1-8B"
DEFAULT_DEADLINE_S = 30
#: How far past the deadline a pull may end, counted from the server's first sight of
#: it: the client's own work, process exit, a loaded CI machine.
SLACK_S = 10
#: Process start-up and imports before the pull's first request (minutes on a loaded machine).
STARTUP_S = 120


def pod_environment(url: str, **settings: str) -> dict[str, str]:
    """This process's environment with no client setting but ``TUNECACHE_URL`` and
    ``settings`` (the test's own data dir is kept: it only says where a token file would be)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNECACHE_") or k == "TUNECACHE_DATA_DIR"}
    return {**env, "TUNECACHE_URL": url, **settings}


def start_pull(url: str, dest: Path, **settings: str) -> tuple[subprocess.Popen, float]:
    process = subprocess.Popen(
        [tunecache_executable(), "pull", "--model", MODEL, "--max-num-batched-tokens", "8192",
         "--dest", str(dest), "--environment", str(CUDNN_FILE)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=pod_environment(url, **settings),
    )
    return process, time.monotonic()


def finish(started: tuple[subprocess.Popen, float], limit_s: float) -> tuple[int, str, float]:
    """Exit code, stderr and the monotonic time a pull ended; fails the test when it
    outlives ``limit_s`` from its start."""
    process, t0 = started
    try:
        _, stderr = process.communicate(timeout=max(0.0, limit_s - (time.monotonic() - t0)))
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        pytest.fail(f"tunecache pull still running after {time.monotonic() - t0:.1f} s (limit {limit_s} s)")
    return process.returncode, stderr, time.monotonic()


class SilentServer:
    """Accepts every connection and never reads or writes."""

    def __init__(self):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.accepted: list[socket.socket] = []
        self.first_at: float | None = None  # monotonic time of the first connection
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"

    def _accept(self):
        while not self.stop.is_set():
            try:
                self.accepted.append(self.listener.accept()[0])
            except OSError:
                continue
            self.first_at = self.first_at or time.monotonic()

    def close(self):
        self.stop.set()
        self.thread.join()
        for conn in self.accepted:
            conn.close()
        self.listener.close()


class TricklingServer(SilentServer):
    """Reads each request's head, answers valid HTTP/1.1 headers for a 100 kB body, then
    sends one byte every ``every_s`` seconds: no single read ever waits long."""

    def __init__(self, every_s: float = 0.5):
        self.every_s = every_s
        self.bytes_sent = 0
        super().__init__()

    def _accept(self):
        while not self.stop.is_set():
            try:
                conn = self.listener.accept()[0]
            except OSError:
                continue
            self.first_at = self.first_at or time.monotonic()
            self.accepted.append(conn)
            threading.Thread(target=self._trickle, args=(conn,), daemon=True).start()

    def _trickle(self, conn: socket.socket):
        try:
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                head += chunk
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n")
            while not self.stop.is_set():
                conn.sendall(b" ")
                self.bytes_sent += 1
                time.sleep(self.every_s)
        except OSError:  # the client gave up and closed
            pass


def test_a_silent_and_a_trickling_server_are_given_up_on_at_the_default_deadline(tmp_path):
    """Default settings (only ``TUNECACHE_URL``): both pulls end at the 30 s install
    deadline with exit 4 and one line naming it, and install nothing. Run side by side,
    so the suite waits for the deadline once."""
    silent, trickling = SilentServer(), TricklingServer(every_s=0.5)
    try:
        pulls = {
            "silent": start_pull(silent.url, tmp_path / "silent"),
            "trickling": start_pull(trickling.url, tmp_path / "trickling"),
        }
        results = {name: finish(started, STARTUP_S + DEFAULT_DEADLINE_S + SLACK_S) for name, started in pulls.items()}
    finally:
        silent.close()
        trickling.close()
    for name, first_at in (("silent", silent.first_at), ("trickling", trickling.first_at)):
        assert first_at is not None, name
        code, stderr, ended = results[name]
        seconds = ended - first_at  # from the pull's first request to its exit
        assert code == 4, (name, code, stderr)
        assert stderr.count("\n") == 1 and stderr.startswith(
            f"tunecache: error: gave up after {DEFAULT_DEADLINE_S} s (TUNECACHE_INSTALL_DEADLINE): tunecache server "
        ), (name, stderr)
        assert "Traceback" not in stderr and "nothing was installed" in stderr
        assert DEFAULT_DEADLINE_S - 5 < seconds < DEFAULT_DEADLINE_S + SLACK_S, (name, seconds)
        assert not (tmp_path / name).exists(), name
    assert "did not answer" in results["silent"][1], results["silent"][1]
    assert "answered too slowly" in results["trickling"][1], results["trickling"][1]
    assert len(silent.accepted) == 1  # the deadline, not the attempts, ended it
    assert trickling.bytes_sent >= 20  # it did trickle for the whole deadline


class _Proxy(http.server.BaseHTTPRequestHandler):
    """In front of a real ``tunecache serve``: passes lookups through, and serves artifact
    bodies one byte every ``trickle_s`` seconds (0: at once)."""

    protocol_version = "HTTP/1.1"
    upstream = ""
    trickle_s = 0.0
    lookups = 0
    downloads = 0
    lookup_at = 0.0  # monotonic time of the latest lookup

    def log_message(self, *args):
        pass

    def _relay(self, upstream: httpx.Response, every_s: float = 0.0):
        self.send_response(upstream.status_code)
        self.send_header("Content-Type", upstream.headers.get("content-type", "application/json"))
        self.send_header("Content-Length", str(len(upstream.content)))
        self.end_headers()
        try:
            if not every_s:
                self.wfile.write(upstream.content)
                return
            for byte in upstream.content:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(every_s)
        except OSError:  # the pod gave up
            self.close_connection = True

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path.startswith("/v1/tunings/lookup"):  # not the install's report (POST /v1/reports)
            type(self).lookups += 1
            type(self).lookup_at = time.monotonic()
        self._relay(httpx.post(self.upstream + self.path, content=body,
                               headers={"Content-Type": self.headers["Content-Type"]}))

    def do_GET(self):  # noqa: N802
        type(self).downloads += 1
        self._relay(httpx.get(self.upstream + self.path), type(self).trickle_s)


@pytest.fixture
def proxy(server):
    handler = type("Proxy", (_Proxy,), {"upstream": server})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield handler, f"http://127.0.0.1:{httpd.server_port}"
    httpd.shutdown()
    httpd.server_close()


def test_the_lookup_and_the_download_share_one_deadline(server, proxy, tmp_path):
    pushed = tunecache("push", str(CUDNN_FILE), "--server", server, "--model", MODEL, "--max-num-batched-tokens", "8192")
    assert pushed.returncode == 0, pushed.stderr
    handler, url = proxy

    # the stand-in is sound: passed through at once, the same pull installs within 2 s
    code, stderr, _ = finish(start_pull(url, tmp_path / "direct", TUNECACHE_INSTALL_DEADLINE="2"), STARTUP_S)
    assert code == 0, stderr
    assert (tmp_path / "direct").is_dir() and handler.lookups == 1 and handler.downloads == 1

    # the lookup answers; the artifact trickles (0.2 s a byte: ~30 min for the file)
    handler.trickle_s = 0.2
    code, stderr, ended = finish(start_pull(url, tmp_path / "dest", TUNECACHE_INSTALL_DEADLINE="2"), STARTUP_S + 2 + SLACK_S)
    assert code == 4, stderr
    assert stderr.startswith("tunecache: error: gave up after 2 s (TUNECACHE_INSTALL_DEADLINE): ") and stderr.count("\n") == 1
    assert "answered too slowly" in stderr and "nothing was installed" in stderr
    assert handler.lookups == 2 and handler.downloads == 2  # one deadline over both requests, no retry past it
    assert ended - handler.lookup_at < 2 + SLACK_S  # from its lookup to its exit
    assert not (tmp_path / "dest").exists()


def test_a_body_that_stops_after_a_trickle_is_cut_at_the_deadline(tmp_path):
    """A server that trickles and then goes silent: each read may wait the read timeout
    (30 s), but the install deadline still ends the download on time."""
    from tunecache.store.http import InstallDeadlineExceeded, TunecacheClient

    data = b"x" * 1000
    sha = hashlib.sha256(data).hexdigest()
    listener = socket.create_server(("127.0.0.1", 0))
    held = []

    def serve():
        conn = listener.accept()[0]
        held.append(conn)
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
        for byte in data[:8]:  # 1.6 s of trickle, then nothing
            conn.sendall(bytes([byte]))
            time.sleep(0.2)

    threading.Thread(target=serve, daemon=True).start()
    client = TunecacheClient(f"http://127.0.0.1:{listener.getsockname()[1]}", install_deadline_s=2.5)
    started = time.monotonic()
    try:
        with client, client.deadline_scope(), pytest.raises(InstallDeadlineExceeded) as error:
            client.download_artifact(sha)
    finally:
        for conn in held:
            conn.close()
        listener.close()
    seconds = time.monotonic() - started
    assert str(error.value).startswith("gave up after 2.5 s (TUNECACHE_INSTALL_DEADLINE): ")
    assert "answered too slowly" in str(error.value)
    assert 2.4 < seconds < 3.5, seconds


def test_no_retry_is_started_that_could_not_end_before_the_deadline():
    """A 503 asking to come back in 20 s, with 3 s of deadline: the pod gives up at once
    with the server's error (exit 5 in the CLI), naming the deadline, instead of sleeping."""
    from tunecache.store.http import ServerError, TunecacheClient

    class Busy(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        hits = 0

        def log_message(self, *args):
            pass

        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            type(self).hits += 1
            body = b'{"detail": "busy"}'
            self.send_response(503)
            self.send_header("Retry-After", "20")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Busy)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    started = time.monotonic()
    try:
        with TunecacheClient(f"http://127.0.0.1:{httpd.server_port}", install_deadline_s=3, max_retry_after_s=60) as client:
            with client.deadline_scope(), pytest.raises(ServerError) as error:
                client.lookup(h200_key(), file_environment(CUDNN_FILE))
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert time.monotonic() - started < 2
    assert Busy.hits == 1 and error.value.status_code == 503
    assert "TUNECACHE_INSTALL_DEADLINE" in str(error.value) and "busy" in str(error.value)


def test_the_deadline_comes_from_the_settings():
    from tunecache.store.http import TunecacheClient
    from tunecache.client.settings import ClientSettings

    assert ClientSettings().install_deadline == DEFAULT_DEADLINE_S
    with TunecacheClient.from_settings(ClientSettings(install_deadline=7.5), "http://127.0.0.1:1") as client:
        assert client.install_deadline_s == 7.5


@pytest.mark.parametrize("value, message", [
    ("x", "Input should be a valid number"),
    ("0", "Input should be greater than 0"),
    ("-1", "Input should be greater than 0"),
    ("1e9", "Input should be less than or equal to"),
])
def test_a_bad_deadline_is_a_one_line_usage_error(monkeypatch, tmp_path, value, message):
    from tunecache.client.settings import load_client_settings

    monkeypatch.setenv("TUNECACHE_INSTALL_DEADLINE", value)
    with pytest.raises(ValueError, match=f"^TUNECACHE_INSTALL_DEADLINE={value!r}: ") as error:
        load_client_settings()
    assert message in str(error.value) and "\n" not in str(error.value)
    code, stderr, _ = finish(start_pull("http://127.0.0.1:1", tmp_path / "dest", TUNECACHE_INSTALL_DEADLINE=value), STARTUP_S)
    assert code == 2 and stderr == f"tunecache: error: {error.value}\n"
    assert not (tmp_path / "dest").exists()
