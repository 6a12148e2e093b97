"""What a pod sees when tunecache fails: each case ends in the documented exit code and
message, in bounded time, and leaves nothing half-installed.

Every failure is real: a server process killed mid-download, a proxy answering 503, a
body cut short, a socket that accepts and never answers, a file-size limit on writes.
"""

from __future__ import annotations

import os
import resource
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from tests.support import forked
from tests.support.cli import tunecache_executable
from tests.support.paths import CUDNN_FILE
from tests.support.serve import free_port

# What this module tests happens on the pod: its server runs on SQLite only (tests/conftest.py).
SERVER_DATABASE_INCIDENTAL = True

MODEL = "meta-llama/Llama-3.1-8B"
FAST = {"TUNECACHE_CONNECT_TIMEOUT": "2", "TUNECACHE_READ_TIMEOUT": "2", "TUNECACHE_ATTEMPTS": "2"}


def pull(server, dest, extra_env=None, preexec=None):
    started = time.monotonic()
    result = forked.run(["pull", "--server", server, "--model", MODEL, "--max-num-batched-tokens", "8192",
                         "--dest", str(dest), "--environment", str(CUDNN_FILE)],
                        env={**os.environ, **FAST, **(extra_env or {})}, preexec_fn=preexec)
    return result, time.monotonic() - started


#: A stand-in tunecache server, run as its own process: answers the lookup with a run whose
#: artifact is the real H200 file, and serves that artifact the way MODE says.
FAKE_SERVER = textwrap.dedent('''
    import hashlib, http.server, json, os, signal, sys, time
    port, mode, path = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    data = open(path, "rb").read()
    sha = hashlib.sha256(data).hexdigest()
    metadata = json.loads(data)["_metadata"]
    run = {"id": 1, "summary": {"entries": 42}, "artifacts": [
        {"kind": "flashinfer_autotune_v1", "name": "autotune.json", "media_type": "application/json",
         "sha256": sha, "size_bytes": len(data), "download_path": "/v1/artifacts/" + sha}],
        "key": {"gpu_name": "NVIDIA H200", "arch": "sm90", "model": "meta-llama/Llama-3.1-8B",
                "max_num_batched_tokens": 8192, "dtype": "auto", "quantization": "auto", "tensor_parallel_size": 1},
        "environment": {k: str(metadata[k]) for k in ("flashinfer_version", "cuda_version", "cublas_version",
                        "cudnn_version", "cudnn_frontend_version", "cutlass_dsl_version", "gpu")},
        "environment_hash": "0" * 64, "status": "succeeded", "trigger": "cli", "node": None, "started_at": None,
        "finished_at": None, "duration_s": None, "error": None, "verified": True, "is_current": True,
        "created_at": "2026-11-30T00:00:00Z"}
    lookups = 0

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        def log_message(self, *a): pass
        def answer(self, status, body, length=None, headers=()):
            self.send_response(status)
            for name, value in headers:
                self.send_header(name, value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body) if length is None else length))
            self.end_headers()
            self.wfile.write(body)
            self.wfile.flush()
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            global lookups
            lookups += 1
            if mode == "503":
                return self.answer(503, b'{"detail": "database unavailable"}')
            if mode == "busy" and lookups == 1:  # shed once, asking for 2 s
                return self.answer(503, b'{"detail": "busy"}', headers=[("Retry-After", "2")])
            if mode == "429":
                return self.answer(429, b'{"detail": "too many requests"}', headers=[("Retry-After", "1")])
            if mode == "not-a-run":
                return self.answer(200, b'{"id": 1}')
            self.answer(200, json.dumps(run).encode())
        def do_GET(self):
            if mode == "truncated":
                self.answer(200, data[: len(data) // 2], length=len(data))
                self.close_connection = True
            elif mode == "killed":
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data[:4096])
                self.wfile.flush()
                os.kill(os.getpid(), signal.SIGKILL)  # the server process dies mid-download
            elif mode == "trickle":  # one byte at a time: no single read ever times out
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                for byte in data:
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    time.sleep(0.3)
            elif mode == "corrupt":
                self.answer(200, data.replace(b"Cudnn", b"Cuxnn", 1))
            else:
                self.answer(200, data)

    http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
''')


@pytest.fixture
def fake_server(tmp_path):
    processes = []

    def start(mode):
        port = free_port()
        script = tmp_path / "fake_server.py"
        script.write_text(FAKE_SERVER)
        process = subprocess.Popen([sys.executable, str(script), str(port), mode, str(CUDNN_FILE)])
        processes.append(process)
        for _ in range(100):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return f"http://127.0.0.1:{port}", process
            time.sleep(0.05)
        pytest.fail("fake server did not start")

    yield start
    for process in processes:
        process.kill()
        process.wait()


def test_server_killed_mid_download(fake_server, tmp_path):
    url, process = fake_server("killed")
    result, _ = pull(url, tmp_path / "dest")
    assert process.wait(timeout=10) == -signal.SIGKILL
    # the first attempt is cut off when the process dies; the retry finds nobody listening
    assert result.returncode in (4, 6), result.stderr
    assert result.stderr.startswith("tunecache: error:") and "Traceback" not in result.stderr
    assert not (tmp_path / "dest").exists() or not any((tmp_path / "dest").iterdir())


def test_truncated_body_is_retried_then_reported(fake_server, tmp_path):
    url, _ = fake_server("truncated")
    result, _ = pull(url, tmp_path / "dest")
    assert result.returncode == 6
    assert "closed the connection before the whole answer arrived" in result.stderr or "received" in result.stderr
    assert "after 2 attempts" in result.stderr and "nothing was installed" in result.stderr
    assert not (tmp_path / "dest").exists()


def test_corrupt_artifact_is_refused(fake_server, tmp_path):
    url, _ = fake_server("corrupt")
    result, _ = pull(url, tmp_path / "dest")
    assert result.returncode == 6 and "hashing to" in result.stderr
    assert not (tmp_path / "dest").exists()


def test_proxy_answering_503_is_retried_then_reported(fake_server, tmp_path):
    url, _ = fake_server("503")
    result, seconds = pull(url, tmp_path / "dest")
    assert result.returncode == 5
    assert "server answered 503: database unavailable (after 2 attempts)" in result.stderr
    assert seconds < 30


def test_retry_after_is_waited_for_before_the_next_attempt(fake_server, tmp_path):
    url, _ = fake_server("busy")
    result, seconds = pull(url, tmp_path / "dest")
    assert result.returncode == 0, result.stderr
    assert seconds >= 2  # the jittered backoff alone would retry within 0.5 s


def test_no_retry_is_started_past_the_total_timeout(fake_server, tmp_path):
    """A 503 asking for 2 s under a 1 s TUNECACHE_TOTAL_TIMEOUT: no second attempt."""
    url, _ = fake_server("busy")
    result, _ = pull(url, tmp_path / "dest", {"TUNECACHE_TOTAL_TIMEOUT": "1"})
    assert result.returncode == 5, result.stderr
    assert ("server answered 503: busy (after 1 of 2 attempts: the next would start past the 1 s "
            "TUNECACHE_TOTAL_TIMEOUT)") in result.stderr


def test_a_command_without_an_install_deadline_retries_then_reports(tmp_path):
    """history has no install deadline: its retries are bounded by the attempts and the total timeout only."""
    result = subprocess.run([tunecache_executable(), "history", "--server", f"http://127.0.0.1:{free_port()}"],
                            capture_output=True, text=True, timeout=120, env={**os.environ, **FAST})
    assert result.returncode == 4 and "Traceback" not in result.stderr, result.stderr
    assert "unreachable" in result.stderr and "(after 2 attempts)" in result.stderr


def test_429_is_retried_then_reported(fake_server, tmp_path):
    url, _ = fake_server("429")
    result, seconds = pull(url, tmp_path / "dest")
    assert result.returncode == 5
    assert "server answered 429: too many requests (after 2 attempts)" in result.stderr
    assert seconds >= 1


@pytest.fixture
def silent_server():
    """A socket that accepts connections and never reads or writes: (its URL, the
    connections it accepted)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    accepted = []
    stop = threading.Event()

    def accept_forever():
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])  # never read, never write
            except OSError:
                continue

    thread = threading.Thread(target=accept_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", accepted
    finally:
        stop.set()
        thread.join()
        for conn in accepted:
            conn.close()
        listener.close()


def test_socket_that_accepts_and_never_answers(silent_server, tmp_path):
    url, accepted = silent_server
    result, seconds = pull(url, tmp_path / "dest")
    assert result.returncode == 4
    assert "accepted the connection but sent no answer within 2 s (after 2 attempts)" in result.stderr
    assert seconds < 30 and len(accepted) == 2


@pytest.mark.parametrize("command", ["pull", "push"])
def test_the_total_timeout_bounds_the_wait_for_the_first_byte_over_every_attempt(silent_server, tmp_path, command):
    """Issue 21: with TUNECACHE_TOTAL_TIMEOUT=3 and the other timeouts at their defaults
    (30 s per read, 3 attempts, a 30 s install deadline), a server that accepts and never
    answers held pull for 31.7 s and push for 92 s; every attempt together now ends within
    the 3 s (12 s of slack here for the command's start on a loaded machine)."""
    url, _ = silent_server
    env = {name: value for name, value in os.environ.items() if name not in FAST}
    env |= {"TUNECACHE_TOTAL_TIMEOUT": "3", "TUNECACHE_DATA_DIR": str(tmp_path / "no-token")}
    options = ["--server", url, "--model", MODEL, "--max-num-batched-tokens", "8192"]
    args = (["pull", *options, "--dest", str(tmp_path / "dest"), "--environment", str(CUDNN_FILE)] if command == "pull"
            else ["push", str(CUDNN_FILE), *options])
    started = time.monotonic()
    result = forked.run(args, env=env)
    seconds = time.monotonic() - started
    assert result.returncode == 4, result.stderr
    assert f"tunecache server {url} sent no answer within 3 s (TUNECACHE_TOTAL_TIMEOUT)" in result.stderr
    assert seconds < 15 and not (tmp_path / "dest").exists()


def test_nobody_listening(tmp_path):
    result, seconds = pull(f"http://127.0.0.1:{free_port()}", tmp_path / "dest")
    assert result.returncode == 4 and "unreachable" in result.stderr and "(after 2 attempts)" in result.stderr


def test_disk_full_leaves_nothing_half_written(fake_server, tmp_path):
    url, _ = fake_server("ok")
    dest = tmp_path / "dest"
    dest.mkdir()
    previous = dest / "autotune.json"

    def small_disk():  # writes past 4 kB fail with EFBIG, as a full disk fails with ENOSPC
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    started = time.monotonic()
    result = subprocess.run(
        [tunecache_executable(), "pull", "--server", url, "--model", MODEL, "--max-num-batched-tokens", "8192",
         "--dest", str(dest), "--environment", str(CUDNN_FILE), "--file-name", "autotune.json"],
        capture_output=True, text=True, timeout=120, env={**os.environ, **FAST}, preexec_fn=small_disk,
    )
    assert time.monotonic() - started < 60
    assert result.returncode == 12, result.stderr
    assert "cannot write the install" in result.stderr and "File too large" in result.stderr
    assert list(dest.iterdir()) == [] and not previous.exists()


def test_healthy_fake_server_installs(fake_server, tmp_path):
    """The stand-in itself is sound: the same pull succeeds when nothing fails."""
    url, _ = fake_server("ok")
    result, _ = pull(url, tmp_path / "dest")
    assert result.returncode == 0, result.stderr
    assert open(result.stdout.strip(), "rb").read() == CUDNN_FILE.read_bytes()


def test_a_trickling_server_is_cut_off_at_the_total_timeout(fake_server, tmp_path):
    url, _ = fake_server("trickle")
    result, seconds = pull(url, tmp_path / "dest", {"TUNECACHE_TOTAL_TIMEOUT": "2"})
    assert result.returncode == 4 and "answered too slowly: no complete answer within 2 s" in result.stderr
    assert seconds < 20 and not (tmp_path / "dest").exists()


def test_an_answer_that_is_not_a_tuning_run_exits_5(fake_server, tmp_path):
    url, _ = fake_server("not-a-run")
    result, _ = pull(url, tmp_path / "dest")
    assert result.returncode == 5 and "not a tunecache answer" in result.stderr and "Traceback" not in result.stderr


def test_bad_client_settings_are_usage_errors(tmp_path):
    result, _ = pull("http://127.0.0.1:1", tmp_path / "dest", {"TUNECACHE_ATTEMPTS": "abc"})
    assert result.returncode == 2 and "TUNECACHE_ATTEMPTS='abc': Input should be a valid integer" in result.stderr
    result, _ = pull("http://[::1", tmp_path / "dest")
    assert result.returncode == 2 and "is not a URL" in result.stderr
