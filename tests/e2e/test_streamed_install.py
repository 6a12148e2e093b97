"""A pod without a node cache streams each tarball from the wire into its one pass
(:mod:`tunecache.client.artifact_stream`): nothing of it is placed before its sha256 checks,
a download that breaks off is resumed without giving the unpacker a byte twice, and a retry
that sends other bytes than those already unpacked is refused. The real CLI and server; a
proxy between them plays the broken wire."""

from __future__ import annotations

import hashlib
import http.server
import io
import os
import subprocess
import tarfile
import threading

import httpx
import pytest

from tests.support.cli import tunecache_executable
from tests.support.paths import CUDNN_FILE
from tests.support.warm_runs import record_triton_run, triton_cache

SERVER_DATABASE_INCIDENTAL = True
KERNELS, KERNEL_BYTES = 3, 3 << 20
#: Where the first answer of the tarball breaks off (the unpacker has had bytes by then).
CUT_AT = 4 << 20


class _Wire(http.server.BaseHTTPRequestHandler):
    """In front of a real ``tunecache serve``: passes every request through, but answers the
    tarball's first ``broken`` downloads with ``first(blob)`` (its whole length announced),
    cut off after :data:`CUT_AT` bytes when ``cut``."""

    protocol_version = "HTTP/1.1"
    upstream, sha, broken, cut = "", "", 1, True
    first = staticmethod(lambda blob: blob)
    downloads = 0

    def log_message(self, *args):
        pass

    def _relay(self, answer: httpx.Response) -> None:
        self.send_response(answer.status_code)
        self.send_header("Content-Type", answer.headers.get("content-type", "application/json"))
        self.send_header("Content-Length", str(len(answer.content)))
        self.end_headers()
        self.wfile.write(answer.content)

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self._relay(httpx.post(self.upstream + self.path, content=body, timeout=30,
                               headers={k: v for k, v in self.headers.items() if k.lower() in ("content-type", "authorization")}))

    def do_GET(self):  # noqa: N802
        answer = httpx.get(self.upstream + self.path, timeout=30)
        if not self.path.endswith(self.sha):
            return self._relay(answer)
        type(self).downloads += 1
        if type(self).downloads > type(self).broken:
            return self._relay(answer)
        sent = type(self).first(answer.content)
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(answer.content)))
        self.end_headers()
        self.wfile.write(sent[:CUT_AT] if type(self).cut else sent)
        self.wfile.flush()
        self.close_connection = True


@pytest.fixture
def wire(server, node_signing_key):
    blob = triton_cache(KERNELS, KERNEL_BYTES)
    sha = record_triton_run(server, node_signing_key, blob)
    handler = type("Wire", (_Wire,), {"upstream": server, "sha": sha})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield handler, f"http://127.0.0.1:{httpd.server_port}", blob
    httpd.shutdown()
    httpd.server_close()


def _pull(url: str, tmp_path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TUNECACHE_NODE_CACHE_DIR"}
    return subprocess.run([tunecache_executable(), "pull", "--server", url, "--model", "meta-llama/Llama-3.1-8B",
                           "--max-num-batched-tokens", "8192", "--environment", str(CUDNN_FILE),
                           "--dest", str(tmp_path / "tactics"), "--warm-state", "--vllm-cache-root", str(tmp_path / "vllm"),
                           "--triton-cache-dir", str(tmp_path / "triton")],
                          capture_output=True, text=True, env={**env, "TUNECACHE_REPORT": "0"}, timeout=300)


def _kernels(blob: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def test_a_download_that_breaks_off_is_resumed_into_the_same_pass(wire, tmp_path):
    handler, url, blob = wire
    done = _pull(url, tmp_path)
    assert done.returncode == 0, done.stderr
    assert handler.downloads == 2  # broken off once, then whole
    for name, data in _kernels(blob).items():
        assert (tmp_path / "triton" / name).read_bytes() == data  # each byte once, in its place


def test_a_retry_that_sends_other_bytes_than_those_unpacked_is_refused(wire, tmp_path):
    handler, url, blob = wire
    handler.first = staticmethod(lambda blob: blob[:CUT_AT - 1000] + bytes(1000))  # zeros inside a kernel's bytes
    done = _pull(url, tmp_path)
    assert done.returncode == 6, done.stderr
    assert "a retried download sent other bytes than the" in done.stderr and "nothing was installed" in done.stderr
    assert not (tmp_path / "triton").exists() and not (tmp_path / "tactics").exists()


def test_bytes_damaged_on_the_way_are_reported_as_such_not_as_a_bad_artifact(wire, tmp_path):
    handler, url, blob = wire
    handler.cut, handler.broken = False, 3  # every answer whole, one byte of the first header's changed
    handler.first = staticmethod(lambda blob: blob[:20] + bytes([blob[20] ^ 0xFF]) + blob[21:])
    done = _pull(url, tmp_path)
    assert done.returncode == 6, done.stderr
    assert f"artifact {hashlib.sha256(blob).hexdigest()} arrived as {len(blob)} bytes hashing to" in done.stderr
    assert "not a gzipped tarball" not in done.stderr
    assert not (tmp_path / "triton").exists() and not (tmp_path / "tactics").exists()
