"""A private PostgreSQL server (Debian's ``postgresql`` binaries, run as the ``postgres`` user)
on a free port in a temporary directory, for tests and benches that freeze, stop or restart
their database: the shared server is never touched. Used by tests/e2e/test_frozen_database.py
and bench/chaos.py."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.support.serve import free_port


def postgres_bin() -> Path | None:
    """The newest ``/usr/lib/postgresql/*/bin`` holding ``initdb``, or ``None``."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    return found[-1].parent if found else None


def unavailable_reason() -> str | None:
    """Why a private server cannot be started here, or ``None`` when it can."""
    if postgres_bin() is None or shutil.which("runuser") is None or os.geteuid() != 0:
        return "needs Debian's PostgreSQL binaries (/usr/lib/postgresql/*/bin), runuser and root"
    return None


@dataclass
class PrivatePostgres:
    """A running private server: ``url`` (SQLAlchemy, database ``postgres``), its data
    directory, port and binaries."""

    url: str
    data: Path
    root: Path
    port: int
    binaries: Path

    def pg_ctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(["runuser", "-u", "postgres", "--", str(self.binaries / "pg_ctl"), "-D", str(self.data), *args],
                              check=check, capture_output=True, timeout=120)

    def start(self) -> None:
        self.pg_ctl("-w", "-l", str(self.root / "log"), "-o",
                    f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off", "start")

    def stop(self, mode: str = "immediate") -> None:
        self.pg_ctl("-m", mode, "stop", check=False)

    def pids(self) -> list[int]:
        """The postmaster and its children (none when it is not running)."""
        return server_pids(self.data)

    def signal_all(self, signum: int) -> list[int]:
        """Send ``signum`` to every process of the server; the pids signalled."""
        pids = self.pids()
        for pid in pids:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass
        return pids


def server_pids(data: Path) -> list[int]:
    pid_file = data / "postmaster.pid"
    if not pid_file.exists():
        return []
    postmaster = int(pid_file.read_text().split()[0])
    children = subprocess.run(["pgrep", "-P", str(postmaster)], capture_output=True, text=True).stdout.split()
    return [postmaster, *map(int, children)]


@contextmanager
def private_postgres() -> Iterator[PrivatePostgres]:
    """Start a private server; on exit, resume (SIGCONT) any stopped process, stop it
    (``-m immediate``) and remove its directory."""
    binaries = postgres_bin()
    if binaries is None:
        raise RuntimeError(unavailable_reason())
    root = Path(tempfile.mkdtemp(prefix="tunecache-pg-", dir="/tmp"))
    os.chmod(root, 0o755)
    shutil.chown(root, "postgres")
    port = free_port()
    server = PrivatePostgres(f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres", root / "data", root, port, binaries)
    try:
        subprocess.run(["runuser", "-u", "postgres", "--", str(binaries / "initdb"), "-D", str(server.data), "-A", "trust",
                        "-U", "postgres", "--no-sync"], check=True, capture_output=True, timeout=120)
        server.start()
        yield server
    finally:
        server.signal_all(signal.SIGCONT)  # never leave it stopped
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
