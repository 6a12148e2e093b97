"""The install deadline measures progress (``tunecache.store.http.stall``): a body that stalls
ends the install at once with exit 4, whatever is left of the deadline; a slow body that keeps
moving is not cut off by the deadline. Real sockets, a real ``tunecache serve`` behind a small
relay that paces the artifact bodies, and the real CLI."""

from __future__ import annotations

import hashlib
import http.server
import socket
import threading
import time

import httpx
import pytest

from tests.e2e.test_install_deadline import MODEL, STARTUP_S, finish, start_pull
from tests.support.cli import tunecache
from tests.support.paths import CUDNN_FILE

SERVER_DATABASE_INCIDENTAL = True


class _Pacer(http.server.BaseHTTPRequestHandler):
    """In front of a real server: passes everything through, and sends artifact bodies in parts
    of ``part`` bytes every ``every_s`` seconds, stopping for good after ``stall_after`` bytes
    (``None``: never)."""

    protocol_version = "HTTP/1.1"
    upstream = ""
    part, every_s, stall_after = 1 << 20, 0.0, None
    lookup_at = 0.0
    downloads = 0

    def log_message(self, *args):
        pass

    def _answer(self, upstream: httpx.Response, paced: bool = False):
        self.send_response(upstream.status_code)
        self.send_header("Content-Type", upstream.headers.get("content-type", "application/json"))
        self.send_header("Content-Length", str(len(upstream.content)))
        self.end_headers()
        body, sent = upstream.content, 0
        try:
            while sent < len(body):
                if paced and self.stall_after is not None and sent >= self.stall_after:
                    time.sleep(3600)  # ends with the test's process, or when the pod closes
                step = self.part if paced else len(body)
                self.wfile.write(body[sent:sent + step])
                self.wfile.flush()
                sent += step
                if paced:
                    time.sleep(self.every_s)
        except OSError:
            self.close_connection = True

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path.startswith("/v1/tunings/lookup"):
            type(self).lookup_at = time.monotonic()
        self._answer(httpx.post(self.upstream + self.path, content=body,
                                headers={"Content-Type": self.headers["Content-Type"]}))

    def do_GET(self):  # noqa: N802
        paced = self.path.startswith("/v1/artifacts/")
        type(self).downloads += paced
        self._answer(httpx.get(self.upstream + self.path), paced)


@pytest.fixture
def pacer(server):
    pushed = tunecache("push", str(CUDNN_FILE), "--server", server, "--model", MODEL, "--max-num-batched-tokens", "8192")
    assert pushed.returncode == 0, pushed.stderr
    handler = type("Pacer", (_Pacer,), {"upstream": server})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield handler, f"http://127.0.0.1:{httpd.server_port}"
    httpd.shutdown()
    httpd.server_close()


def test_a_body_that_stalls_midway_ends_the_pull_long_before_the_deadline(pacer, tmp_path):
    """Half the file, then nothing: with the default 30 s deadline and a 1 s stall window the
    pull gives up after its attempts stall (exit 4, one line naming the stall), well before the
    deadline would have ended it, and installs nothing."""
    handler, url = pacer
    handler.part, handler.every_s, handler.stall_after = 2048, 0.01, CUDNN_FILE.stat().st_size // 2
    code, stderr, ended = finish(start_pull(url, tmp_path / "dest", TUNECACHE_STALL_TIMEOUT="1"), STARTUP_S + 30)
    assert code == 4, stderr
    assert stderr.count("\n") == 1 and stderr.startswith("tunecache: error: download stalled: "), stderr
    assert "TUNECACHE_STALL_TIMEOUT" in stderr and "nothing was installed" in stderr
    assert ended - handler.lookup_at < 12, ended - handler.lookup_at  # three stalled attempts, not 30 s
    assert handler.downloads >= 2  # a stall is retried while the deadline allows
    assert not (tmp_path / "dest").exists()


def test_a_slow_body_that_keeps_moving_completes_past_the_deadline(pacer, tmp_path):
    """A 2 s install deadline and a body that takes about 5 s at 4 kB/s, above a 1 kB/s floor:
    it installs (before, the deadline cut it off at 2 s: exit 4), and says what it took."""
    handler, url = pacer
    handler.part, handler.every_s = 400, 0.1
    started = start_pull(url, tmp_path / "dest", TUNECACHE_INSTALL_DEADLINE="2", TUNECACHE_STALL_TIMEOUT="1",
                         TUNECACHE_MIN_DOWNLOAD_RATE="1000")
    code, stderr, ended = finish(started, STARTUP_S + 30)
    assert code == 0, stderr
    assert ended - handler.lookup_at > 4  # well past the 2 s deadline
    assert (tmp_path / "dest").is_dir()
    line = next(line for line in stderr.splitlines() if line.startswith("tunecache: artifacts downloaded "))
    assert f"{CUDNN_FILE.stat().st_size / 1e6:,.1f} MB in " in line and "MB/s)" in line


def test_a_client_streams_a_stalled_body_to_a_file_and_gives_up_with_the_stall(tmp_path, monkeypatch):
    """The API the pull uses, against a raw socket server that sends headers and 8 bytes, then
    nothing: DownloadStalled after the window, never the bytes."""
    from tunecache.store.http import TunecacheClient
    from tunecache.store.http.stall import DownloadStalled
    from tunecache.client.node_cache import fetch_artifact

    monkeypatch.setenv("TUNECACHE_STALL_TIMEOUT", "1")
    data = b"x" * 1000
    sha = hashlib.sha256(data).hexdigest()
    listener = socket.create_server(("127.0.0.1", 0))
    held = []

    def serve():
        while True:
            try:
                conn = listener.accept()[0]
            except OSError:
                return
            held.append(conn)
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n" + data[:8])

    threading.Thread(target=serve, daemon=True).start()
    client = TunecacheClient(f"http://127.0.0.1:{listener.getsockname()[1]}", install_deadline_s=30, attempts=1)
    started = time.monotonic()
    try:
        with client, client.deadline_scope(), pytest.raises(DownloadStalled, match="download stalled: "):
            fetch_artifact(client, sha)
    finally:
        for conn in held:
            conn.close()
        listener.close()
    assert 0.9 < time.monotonic() - started < 5
