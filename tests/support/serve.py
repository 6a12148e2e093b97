"""Live `tunecache serve` processes: free ports, the admin token a server wrote, starting and
stopping servers of one's own, and reading their ``/metrics``."""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.builders import run_payload
from tests.support import forked
from tests.support.paths import CUDNN_FILE


#: The first port :func:`free_port` hands out, and how many each test process has: below the
#: kernel's ephemeral range (32768 and up by default), from which outgoing connections take
#: theirs.
PORT_BASE, PORTS_PER_PROCESS = 20_000, 1_000
_handed_out = 0


def free_port() -> int:
    """A free port for a server this test starts, that no other test process of the run
    hands out: each xdist worker (``PYTEST_XDIST_WORKER`` ``gw<N>``) takes its ports in turn
    from a range of its own, below the ephemeral range. A port the kernel picked (``bind`` to
    port 0) could be picked again for another worker's server or for a client's connection
    before this test's server binds it."""
    global _handed_out
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    first = PORT_BASE + (index % 12) * PORTS_PER_PROCESS
    for _ in range(PORTS_PER_PROCESS):
        port = first + _handed_out % PORTS_PER_PROCESS
        _handed_out += 1
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:  # taken (another program, or a port still in TIME_WAIT)
                continue
            return port
    raise RuntimeError(f"no free port in {first}..{first + PORTS_PER_PROCESS - 1}")


def admin_token() -> str:
    """The admin token ``tunecache serve`` wrote in this test's data dir on its first start."""
    return (Path(os.environ["TUNECACHE_DATA_DIR"]) / "admin.token").read_text().strip()


def admin_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {admin_token()}"}


class AsAdmin:
    """``httpx.get/put/post/delete`` with the admin token of this test's ``tunecache serve``."""

    def __getattr__(self, method: str):
        def call(url, **kwargs):
            return getattr(httpx, method)(url, headers={**admin_headers(), **kwargs.pop("headers", {})}, **kwargs)

        return call


as_admin = AsAdmin()


def start_server(database_url: str, tmp_path, name: str, **env: str) -> tuple[forked.Forked, str]:
    """A `tunecache serve` of the test's own (log ``<name>.log``, data dir ``<name>-data``):
    (the process, its URL) once it answers ``/v1/health``."""
    port = free_port()
    process = forked.popen(["serve", "--port", str(port), "--database", database_url],
                           {**os.environ, "TUNECACHE_WORKER": "off", "TUNECACHE_DATA_DIR": str(tmp_path / f"{name}-data"),
                            **env}, tmp_path / f"{name}.log")
    url = f"http://127.0.0.1:{port}"
    wait_healthy(process, url, tmp_path / f"{name}.log")
    share_admin_token(tmp_path / f"{name}-data")
    return process, url


def wait_healthy(process: forked.Forked | subprocess.Popen, url: str, log: Path, tries: int = 300) -> None:
    """Until the server at ``url`` answers ``/v1/health`` (``tries`` times, 0.1 s apart); the test
    fails with the server's ``log`` where the process ends or never answers."""
    for _ in range(tries):
        try:
            if httpx.get(f"{url}/v1/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert process.poll() is None, log.read_text()
        time.sleep(0.1)
    pytest.fail("tunecache serve did not become healthy: " + log.read_text())


def share_admin_token(data_dir: Path) -> None:
    """The first replica on a database writes the admin token into its own data dir; put it
    where this test's clients look for it (``$TUNECACHE_DATA_DIR/admin.token``), with the record
    of where that replica listens (client commands send it to that service only)."""
    written = data_dir / "admin.token"
    if written.exists():
        shared = Path(os.environ["TUNECACHE_DATA_DIR"]) / "admin.token"
        shared.parent.mkdir(parents=True, exist_ok=True)
        shared.write_text(written.read_text())
        record = data_dir / "admin.token.json"
        if record.exists():
            (shared.parent / record.name).write_text(record.read_text())


def stop_server(process: forked.Forked) -> None:
    process.terminate()
    process.wait(timeout=30)


def push_run(server: str, path=CUDNN_FILE) -> dict:
    """Upload ``path`` and record it as a run on a live server (admin token); returns the run."""
    data = path.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    assert as_admin.put(f"{server}/v1/artifacts/{sha}", content=data, timeout=30).status_code in (200, 201)
    recorded = as_admin.post(f"{server}/v1/tunings", json=run_payload(path), timeout=30)
    assert recorded.status_code == 201, recorded.text
    return recorded.json()


class Scrape:
    """One ``GET /metrics``, parsed: every sample by name and labels."""

    def __init__(self, exposition: str):
        self.text = exposition
        self.samples: dict[tuple[str, frozenset], float] = {}
        for family in text_string_to_metric_families(exposition):
            for sample in family.samples:
                self.samples[(sample.name, frozenset(sample.labels.items()))] = sample.value

    def names(self) -> set[str]:
        return {name for name, _ in self.samples}

    def value(self, name: str, **labels: str) -> float:
        """The sample's value; 0 for a labelled series that has not appeared yet."""
        return self.samples.get((name, frozenset(labels.items())), 0.0)

    def total(self, name: str, **labels: str) -> float:
        """Sum of the samples of ``name`` whose labels include ``labels``."""
        wanted = set(labels.items())
        return sum(v for (n, have), v in self.samples.items() if n == name and wanted <= have)


def scrape(server: str, **kwargs) -> Scrape:
    answer = httpx.get(f"{server}/metrics", timeout=30, **kwargs)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
    return Scrape(answer.text)
