"""Chaos run: a steady boot load of pods against ``tunecache serve --processes 2`` on a private
PostgreSQL while its parts fail and hostile clients connect, beside the static baseline
(the Python stdlib server and nginx serving the same bodies) under the same load in the same
run.

    python bench/chaos.py [--seconds 20] [--freeze-seconds 60] [--phases a,b,c,d,e,f]
                          [--boots-per-s 20] [--unheld-fraction 0.1] [--deadline 30]
                          [--warmup 5] [--out FILE.json]

Needs root (a private PostgreSQL cluster run as the ``postgres`` user with ``runuser``,
Debian's ``/usr/lib/postgresql/*/bin``: tests/support/postgres.py; a tmpfs mount for the data
directory), ``nginx``, and ``tunecache`` installed. The shared PostgreSQL server is never
touched.

The load: pods start on a fixed schedule (``--boots-per-s`` against each server, new pods
whatever the earlier ones are doing, as a fleet's pods do), each from an address of its own
in 127.0.1.0/24, on a connection of its own. A boot is what the vLLM plugin does: the lookup,
then the artifact the answer names (its sha256 checked), within the pod's deadline
(``--deadline``, the client's ``TUNECACHE_INSTALL_DEADLINE``, 30 s), retrying 429/502/503/504,
refused or reset connections and timeouts as the client does (waiting the ``Retry-After``,
else a jittered backoff). Most pods ask the key seeded at the start, whose answer and
artifact the service holds (``held``); ``--unheld-fraction`` of them ask a key never asked
before (``not held``: only the database can answer it, with a 404 miss, and the pod then
boots without a tuning). A boot is lost when the pod has not its answer (and artifact)
within its deadline. As in the client, a connection has 5 s and an answer 30 s (within the
deadline).

Phases, one after the other, each a fault followed by ``--seconds`` of recovery under the
same load:

* ``a``: hostile clients from one other address (127.0.0.2), against each server:
  200 sending a request body one byte every 2 s, 200 asking for the artifact 64 times
  pipelined and never reading the answers (4 KiB receive buffer), 1,000 idle connections;
  each reconnects when the server closes it; for ``--seconds``.
* ``b``: the database frozen: SIGSTOP on every process of the cluster for
  ``--freeze-seconds`` (longer than a pod's deadline), then SIGCONT.
* ``c``: the database stopped (``pg_ctl stop -m immediate``) for ``--seconds``, then started.
* ``d``: one server process (a uvicorn worker that does not hold the job worker's lock)
  killed with SIGKILL; the supervisor starts another.
* ``e``: the process holding the job worker's lock (``<data dir>/worker.lock``; on a node
  without a GPU it holds the lock and runs no tuner) killed with SIGKILL.
* ``f``: the data directory full: it is a tmpfs mount of its own (``--data-dir-mib``), filled
  with a file until ``ENOSPC``, for ``--seconds``, then the file removed. At the fault's
  start a new current tuning of the seeded key is recorded (admin, forced), so pods need an
  artifact the full disk cannot mirror.

Printed per phase and server: boots started, lost (held / not held), the statuses of every
attempt that was not an answer (and socket errors), the time from the fault's end to the
first fully good boot (a boot answered at its first attempts, not stale) and to a steady rate
(the first second from which every second of the next three has at least 80 % of the offered
boots fully good), and the RSS of every process (serve supervisor, each server process,
PostgreSQL's processes, the baselines, this load generator) at the phase's start and end.
A figure here is a measurement of this machine, not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import hashlib
import json
import os
import random
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from boot_storm import ARTIFACT, MODEL, free_port, start_nginx, static_root, stop_group, wait_http  # noqa: E402
from tests.support.postgres import private_postgres, unavailable_reason  # noqa: E402

RETRY_STATUSES = {429, 502, 503, 504}
ATTACKER_ADDRESS = "127.0.0.2"
PHASES = {
    "a": "hostile clients (200 slow bodies, 200 unread answers, 1,000 idle, one address)",
    "b": "database frozen (SIGSTOP)",
    "c": "database stopped (-m immediate) and started",
    "d": "a server process killed (SIGKILL)",
    "e": "the job worker's process killed (SIGKILL)",
    "f": "data dir full (tmpfs, ENOSPC)",
}


# ---------------------------------------------------------------- the pods


@dataclass
class Target:
    name: str
    host: str
    port: int
    lookup: tuple[str, str, bytes]  # method, path, body
    static: bool


@dataclass
class Boot:
    target: str
    held: bool
    started: float
    ended: float = 0.0
    ok: bool = False
    first_try: bool = True
    stale: bool = False
    failures: dict[str, int] = field(default_factory=dict)


class Answer(Exception):
    """A request's outcome that is not an answer the pod can use: a status to retry or a socket error."""

    def __init__(self, label: str, retry_after: float | None = None):
        self.label, self.retry_after = label, retry_after


async def _request(reader, writer, host: str, method: str, path: str, body: bytes, headers: dict[str, str] | None = None):
    head = f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: chaos-pod\r\n"
    if body or method == "POST":
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    for k, v in (headers or {}).items():
        head += f"{k}: {v}\r\n"
    writer.write(head.encode() + b"\r\n" + body)
    await writer.drain()
    status_line = await reader.readuntil(b"\r\n")
    version, status = status_line.split()[0], int(status_line.split()[1])
    fields: dict[str, str] = {}
    while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
        name, _, value = line.decode("latin-1").partition(":")
        fields[name.strip().lower()] = value.strip()
    if fields.get("transfer-encoding", "").lower() == "chunked":
        data = b""
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            data += await reader.readexactly(size + 2)
            if size == 0:
                break
        data = data[:-2]
    else:
        data = await reader.readexactly(int(fields.get("content-length", "0")))
    if version == b"HTTP/1.0" and fields.get("connection", "").lower() != "keep-alive":
        fields["connection"] = "close"  # the stdlib server's HTTP/1.0: one request a connection
    return status, fields, data


class Pod:
    """One boot on a connection of its own (reopened after an error or a close)."""

    def __init__(self, target: Target, held: bool, deadline: float, unheld_body: bytes | None):
        self.target, self.deadline = target, deadline
        self.boot = Boot(target.name, held, time.monotonic())
        self.body = target.lookup[2] if held or unheld_body is None else unheld_body
        self.conn = None
        self.address = f"127.0.1.{random.randint(1, 254)}"

    async def _connection(self, timeout: float):
        if self.conn is None:
            self.conn = await asyncio.wait_for(
                asyncio.open_connection(self.target.host, self.target.port, local_addr=(self.address, 0)), timeout)
        return self.conn

    def _close(self) -> None:
        if self.conn is not None:
            self.conn[1].close()
            self.conn = None

    async def _ask(self, method: str, path: str, body: bytes, expect: set[int]):
        end = self.boot.started + self.deadline
        attempt = 0
        while True:
            left = end - time.monotonic()
            if left <= 0:
                raise TimeoutError
            attempt += 1
            try:
                reader, writer = await self._connection(min(5.0, left))
                status, fields, data = await asyncio.wait_for(
                    _request(reader, writer, self.target.host, method, path, body), min(30.0, end - time.monotonic()))
                if fields.get("connection", "").lower() == "close":
                    self._close()
                if status in expect:
                    if attempt > 1:
                        self.boot.first_try = False
                    if "tunecache-stale" in fields:
                        self.boot.stale = True
                    return status, data
                retry_after = fields.get("retry-after")
                raise Answer(str(status), float(retry_after) if retry_after and retry_after.isdigit() else None)
            except Answer as answer:
                label, wait = answer.label, answer.retry_after
                if int(label) not in RETRY_STATUSES:
                    self.boot.failures[label] = self.boot.failures.get(label, 0) + 1
                    raise
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, IndexError) as exc:
                label, wait = _socket_label(exc), None
                self._close()
            except asyncio.TimeoutError:
                label, wait = "timeout", None
                self._close()
            self.boot.failures[label] = self.boot.failures.get(label, 0) + 1
            self.boot.first_try = False
            backoff = wait if wait is not None else random.uniform(0, min(4.0, 0.25 * 2 ** attempt))
            await asyncio.sleep(max(0.0, min(backoff, end - time.monotonic())))

    async def run(self) -> Boot:
        method, path, _ = self.target.lookup
        try:
            status, data = await self._ask(method, path, self.body, {200} if self.boot.held else {200, 404})
            if status == 200:
                answer = json.loads(data)
                sha = answer["artifacts"][0]["sha256"]
                prefix = "/artifacts/" if self.target.static else "/v1/artifacts/"
                _, artifact = await self._ask("GET", prefix + sha, b"", {200})
                if hashlib.sha256(artifact).hexdigest() != sha:
                    self.boot.failures["wrong bytes"] = self.boot.failures.get("wrong bytes", 0) + 1
                    raise Answer("wrong bytes")
            self.boot.ok = True
        except (Answer, TimeoutError, asyncio.TimeoutError, KeyError, IndexError, json.JSONDecodeError):
            pass
        finally:
            self._close()
            self.boot.ended = time.monotonic()
        return self.boot


def _socket_label(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "refused"
    if isinstance(exc, ConnectionResetError):
        return "reset"
    if isinstance(exc, asyncio.IncompleteReadError):
        return "closed"
    if isinstance(exc, OSError) and exc.errno == errno.EADDRNOTAVAIL:
        return "no address"
    return type(exc).__name__


class Fleet:
    """Pods starting on a fixed schedule against every target until stopped."""

    def __init__(self, targets: list[Target], rate: float, unheld_fraction: float, deadline: float):
        self.targets, self.rate, self.unheld_fraction, self.deadline = targets, rate, unheld_fraction, deadline
        self.boots: list[Boot] = []
        self.tasks: set[asyncio.Task] = set()
        self.running = True

    def _unheld_body(self, target: Target) -> bytes | None:
        if target.static:
            return None
        key = {"gpu_name": "NVIDIA H200", "arch": "sm90", "model": f"chaos/unseen-{uuid.uuid4().hex[:12]}",
               "max_num_batched_tokens": 8192}
        body = json.loads(target.lookup[2])
        return json.dumps({**body, "key": key}).encode()

    async def run(self) -> None:
        interval = 1.0 / self.rate
        next_slot = time.monotonic()
        while self.running:
            for target in self.targets:
                held = target.static or random.random() >= self.unheld_fraction
                pod = Pod(target, held, self.deadline, None if held else self._unheld_body(target))
                task = asyncio.create_task(pod.run())
                self.tasks.add(task)
                task.add_done_callback(lambda t: (self.tasks.discard(t), self.boots.append(t.result())))
            next_slot += interval
            await asyncio.sleep(max(0.0, next_slot - time.monotonic()))

    async def drain(self) -> None:
        self.running = False
        if self.tasks:
            await asyncio.wait(list(self.tasks))


# ---------------------------------------------------------------- hostile clients


class Hostiles:
    """Phase a's clients against one target, from ATTACKER_ADDRESS, each reconnecting (1 s,
    doubling to 8 s) when the server closes it, until stopped."""

    def __init__(self, target: Target, artifact_path: str, slow: int = 200, unread: int = 200, idle: int = 1000):
        self.target, self.artifact_path = target, artifact_path
        self.counts = {"slow": slow, "unread": unread, "idle": idle}
        self.closed_by_server = {kind: 0 for kind in self.counts}
        self.connect_failures = 0
        self.stop = asyncio.Event()
        self.sockets: set[socket.socket] = set()

    async def _connect(self, rcvbuf: int | None = None) -> socket.socket:
        loop = asyncio.get_running_loop()
        sock = socket.socket()
        sock.setblocking(False)
        if rcvbuf:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.bind((ATTACKER_ADDRESS, 0))
        try:
            await asyncio.wait_for(loop.sock_connect(sock, (self.target.host, self.target.port)), 5)
        except BaseException:
            sock.close()
            raise
        self.sockets.add(sock)
        return sock

    async def _one(self, kind: str) -> None:
        loop = asyncio.get_running_loop()
        pause = 1.0
        while not self.stop.is_set():
            try:
                sock = await self._connect(4096 if kind == "unread" else None)
            except (OSError, asyncio.TimeoutError):
                self.connect_failures += 1
                await self._wait(pause)
                pause = min(8.0, pause * 2)
                continue
            try:
                if kind == "slow":
                    await loop.sock_sendall(sock, (f"POST {self.target.lookup[1]} HTTP/1.1\r\nHost: x\r\n"
                                                   "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{").encode())
                    while not self.stop.is_set():
                        await self._wait(2.0)
                        await loop.sock_sendall(sock, b" ")
                elif kind == "unread":
                    request = f"GET {self.artifact_path} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
                    await loop.sock_sendall(sock, request * 64)
                    await self._wait(None)
                else:
                    recv = asyncio.ensure_future(loop.sock_recv(sock, 1))
                    stop = asyncio.ensure_future(self.stop.wait())
                    await asyncio.wait({recv, stop}, return_when=asyncio.FIRST_COMPLETED)
                    recv.cancel()
                    stop.cancel()
                    if not self.stop.is_set():
                        raise ConnectionResetError
            except OSError:
                if not self.stop.is_set():
                    self.closed_by_server[kind] += 1
                    await self._wait(pause)
                    pause = min(8.0, pause * 2)
            finally:
                self.sockets.discard(sock)
                sock.close()

    async def _wait(self, seconds: float | None) -> None:
        try:
            await asyncio.wait_for(self.stop.wait(), seconds)
        except asyncio.TimeoutError:
            pass

    async def run(self) -> None:
        await asyncio.gather(*(self._one(kind) for kind, n in self.counts.items() for _ in range(n)))


# ---------------------------------------------------------------- processes and memory


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


def _cmd(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def lock_holder(lock_file: Path) -> int | None:
    """The pid holding an flock on ``lock_file`` (from /proc/locks), if any."""
    try:
        inode = lock_file.stat().st_ino
    except OSError:
        return None
    for line in Path("/proc/locks").read_text().splitlines():
        parts = line.split()
        if len(parts) > 5 and parts[1] == "FLOCK" and parts[5].split(":")[-1] == str(inode):
            return int(parts[4])
    return None


@dataclass
class Parts:
    serve: subprocess.Popen
    data_dir: Path
    pg: object
    stdlib: subprocess.Popen
    nginx: subprocess.Popen
    log: object  # the serve log file, closed at the end

    def server_processes(self) -> list[int]:
        """The serve supervisor's uvicorn workers (multiprocessing's own helpers left out)."""
        return [p for p in _children(self.serve.pid) if "resource_tracker" not in _cmd(p) and not _zombie(p)]

    def memory(self) -> dict[str, float | str]:
        """RSS in MiB of each process; for PostgreSQL and nginx the sum over their processes
        (shared memory counted in each) with the number of processes in brackets."""
        mib = lambda kib: round(kib / 1024, 1)  # noqa: E731
        holder = lock_holder(self.data_dir / "worker.lock")
        found = {"serve supervisor": mib(_rss_kib(self.serve.pid))}
        for pid in self.server_processes():
            found[f"server process {pid}{' (job worker lock)' if pid == holder else ''}"] = mib(_rss_kib(pid))
        pg = self.pg.pids()
        found["postgresql (sum of its processes)"] = f"{mib(sum(_rss_kib(p) for p in pg))} ({len(pg)})"
        found["stdlib baseline"] = mib(_rss_kib(self.stdlib.pid))
        nginx = [self.nginx.pid, *_children(self.nginx.pid)]
        found["nginx baseline (sum)"] = f"{mib(sum(_rss_kib(p) for p in nginx))} ({len(nginx)})"
        found["load generator (this process)"] = mib(_rss_kib(os.getpid()))
        return found


# ---------------------------------------------------------------- faults


def _fill(path: Path) -> int:
    """Write zeros to ``path`` until the file system is full; the bytes written."""
    written = 0
    block = b"\0" * (1024 * 1024)
    with open(path, "wb", buffering=0) as out:
        while True:
            try:
                written += out.write(block)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                small = b"\0" * 4096
                try:
                    while True:
                        written += out.write(small)
                except OSError:
                    return written


async def fault(phase: str, parts: Parts, args, targets: list[Target], artifact_paths: dict[str, str],
                seed_new_run) -> dict:
    """Run phase ``phase``'s fault; returns what was done (and when it ended: ``end``)."""
    note: dict = {}
    if phase == "a":
        hostiles = [Hostiles(t, artifact_paths[t.name]) for t in targets]
        tasks = [asyncio.create_task(h.run()) for h in hostiles]
        await asyncio.sleep(args.seconds)
        note["held_open_at_end"] = {h.target.name: len(h.sockets) for h in hostiles}
        for h in hostiles:
            h.stop.set()
        await asyncio.gather(*tasks)
        note["closed_by_server"] = {h.target.name: h.closed_by_server for h in hostiles}
        note["connect_failures"] = {h.target.name: h.connect_failures for h in hostiles}
    elif phase == "b":
        note["stopped_pids"] = len(parts.pg.signal_all(signal.SIGSTOP))
        await asyncio.sleep(args.freeze_seconds)
        parts.pg.signal_all(signal.SIGCONT)
    elif phase == "c":
        await asyncio.to_thread(parts.pg.stop, "immediate")
        await asyncio.sleep(args.seconds)
        started = time.monotonic()
        await asyncio.to_thread(parts.pg.start)
        note["pg_start_s"] = round(time.monotonic() - started, 2)
    elif phase in ("d", "e"):
        holder = lock_holder(parts.data_dir / "worker.lock")
        workers = parts.server_processes()
        if phase == "d":
            victims = [p for p in workers if p != holder] or workers
        else:
            victims = [holder] if holder else []
        if not victims:
            note["skipped"] = "no such process found"
        else:
            os.kill(victims[0], signal.SIGKILL)
            note["killed"] = victims[0]
            note["lock_holder_before"] = holder

            async def replaced() -> None:
                started = time.monotonic()
                while time.monotonic() - started < 60:
                    now = parts.server_processes()
                    if len(now) == len(workers) and victims[0] not in now:
                        note["replacement_seen_s"] = round(time.monotonic() - started, 2)
                        await asyncio.sleep(1)
                        note["lock_holder_after"] = lock_holder(parts.data_dir / "worker.lock")
                        return
                    await asyncio.sleep(0.1)

            asyncio.create_task(replaced())
    elif phase == "f":
        note["new_run"] = await asyncio.to_thread(seed_new_run)
        note["filled_bytes"] = await asyncio.to_thread(_fill, parts.data_dir / "chaos-filler")
        await asyncio.sleep(args.seconds)
        (parts.data_dir / "chaos-filler").unlink()
    note["end"] = time.monotonic()
    return note


# ---------------------------------------------------------------- figures


def summarize(boots: list[Boot], target: str, start: float, stop: float, fault_end: float, rate: float) -> dict:
    mine = [b for b in boots if b.target == target and start <= b.started < stop]
    held = [b for b in mine if b.held]
    unheld = [b for b in mine if not b.held]
    failures: dict[str, int] = {}
    for b in mine:
        for label, n in b.failures.items():
            failures[label] = failures.get(label, 0) + n
    good = sorted(b.ended for b in mine if b.ok and b.first_try and not b.stale and b.started >= fault_end)
    first_good = round(good[0] - fault_end, 2) if good else None
    steady = None
    horizon = stop - fault_end
    per_second = [0] * (int(horizon) + 1)
    for t in good:
        i = int(t - fault_end)
        if 0 <= i < len(per_second):
            per_second[i] += 1
    need = 0.8 * rate
    for i in range(0, len(per_second) - 3):
        if all(n >= need for n in per_second[i:i + 3]):
            steady = i
            break
    return {
        "boots": len(mine), "lost_held": sum(not b.ok for b in held), "lost_not_held": sum(not b.ok for b in unheld),
        "held": len(held), "not_held": len(unheld), "stale_answers": sum(b.stale for b in mine),
        "retried": sum(not b.first_try for b in mine), "failures": failures,
        "first_good_boot_s": first_good, "steady_rate_s": steady,
        "held_boot_s_p50": _pct([b.ended - b.started for b in held if b.ok], 50),
        "held_boot_s_max": _pct([b.ended - b.started for b in held if b.ok], 100),
    }


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return round(values[min(len(values) - 1, int(len(values) * q / 100))], 3)


# ---------------------------------------------------------------- the run


def start_parts(work: Path, pg) -> tuple[Parts, list[Target], dict[str, str], callable]:
    exe = shutil.which("tunecache") or sys.exit("tunecache is not installed")
    data_dir = work / "data"
    env = {**os.environ, "TUNECACHE_DATA_DIR": str(data_dir), "TUNECACHE_JOB_WORKER": "auto",
           "TUNECACHE_GPU_LOCK_DIR": str(work)}
    subprocess.run([exe, "db", "upgrade", "--database", pg.url], check=True, env=env, capture_output=True)
    port = free_port()
    log = open(work / "serve.log", "w")
    serve = subprocess.Popen([exe, "serve", "--port", str(port), "--database", pg.url, "--processes", "2"],
                             env=env, stdout=log, stderr=log, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    wait_http(f"{base}/v1/health", 120)
    subprocess.run([exe, "push", str(ARTIFACT), "--server", base, "--model", MODEL, "--max-num-batched-tokens", "8192"],
                   check=True, env=env, capture_output=True)
    metadata = json.loads(ARTIFACT.read_text())["_metadata"]
    body = json.dumps({"key": {"gpu_name": "NVIDIA H200", "arch": "sm90", "model": MODEL, "max_num_batched_tokens": 8192},
                       "environment": {k: str(v) for k, v in metadata.items()}}).encode()
    sha = hashlib.sha256(ARTIFACT.read_bytes()).hexdigest()

    def seed_new_run() -> str:
        """A new current run of the seeded key (admin, forced), with another artifact."""
        other = ARTIFACT.with_name("mm_bf16-cublaslt.json")
        fixture = json.loads(other.read_text())
        fixture["_metadata"] = metadata
        data = json.dumps(fixture, indent=1).encode()
        new_sha = hashlib.sha256(data).hexdigest()
        admin = {"Authorization": f"Bearer {(data_dir / 'admin.token').read_text().strip()}"}
        put = httpx.put(f"{base}/v1/artifacts/{new_sha}", content=data, headers=admin, timeout=30)
        run = {"key": json.loads(body)["key"], "environment": json.loads(body)["environment"], "trigger": "upload",
               "summary": {"entries": len(fixture) - 1},
               "artifacts": [{"kind": "flashinfer_autotune_v1", "name": "autotune.json",
                              "media_type": "application/json", "sha256": new_sha}]}
        posted = httpx.post(f"{base}/v1/tunings", params={"force": "true"}, json=run, headers=admin, timeout=30)
        return f"PUT {put.status_code}, POST {posted.status_code} (artifact {new_sha[:12]})"

    root, lookup, artifact = static_root(work)
    stdlib_port, nginx_port = free_port(), free_port()
    stdlib = subprocess.Popen([sys.executable, "-m", "http.server", str(stdlib_port), "--bind", "127.0.0.1",
                               "--directory", str(root)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    nginx = start_nginx(work, nginx_port, root, connections=8192)
    wait_http(f"http://127.0.0.1:{stdlib_port}{lookup}")
    wait_http(f"http://127.0.0.1:{nginx_port}{lookup}")
    targets = [Target("tunecache", "127.0.0.1", port, ("POST", "/v1/tunings/lookup", body), False),
               Target("stdlib", "127.0.0.1", stdlib_port, ("GET", lookup, b""), True),
               Target("nginx", "127.0.0.1", nginx_port, ("GET", lookup, b""), True)]
    artifact_paths = {"tunecache": f"/v1/artifacts/{sha}", "stdlib": artifact, "nginx": artifact}
    parts = Parts(serve, data_dir, pg, stdlib, nginx, log)
    return parts, targets, artifact_paths, seed_new_run


def stop_parts(parts: Parts) -> None:
    for process in (parts.stdlib, parts.nginx):
        process.terminate()
        process.wait(timeout=30)
    stop_group(parts.serve)
    parts.log.close()


async def chaos(args, parts: Parts, targets: list[Target], artifact_paths: dict[str, str], seed_new_run) -> dict:
    fleet = Fleet(targets, args.boots_per_s, args.unheld_fraction, args.deadline)
    load = asyncio.create_task(fleet.run())
    await asyncio.sleep(args.warmup)
    phases = []
    for phase in args.phases.split(","):
        memory_start = parts.memory()
        start = time.monotonic()
        print(f"phase {phase}: {PHASES[phase]} ...", file=sys.stderr, flush=True)
        note = await fault(phase, parts, args, targets, artifact_paths, seed_new_run)
        fault_end = note.pop("end")
        await asyncio.sleep(args.seconds)
        phases.append({"phase": phase, "fault": PHASES[phase], "start": start, "fault_end": fault_end,
                       "stop": time.monotonic(), "note": note, "memory_start": memory_start, "memory_end": parts.memory()})
    load.cancel()
    try:
        await load
    except asyncio.CancelledError:
        pass
    await fleet.drain()
    for p in phases:
        p["fault_s"] = round(p["fault_end"] - p["start"], 1)
        p["servers"] = {t.name: summarize(fleet.boots, t.name, p["start"], p["stop"], p["fault_end"], args.boots_per_s)
                        for t in targets}
    return {"phases": phases}


def print_report(result: dict) -> None:
    print("\n| phase | server | boots | lost (held) | lost (not held) | stale | retried | failed attempts | "
          "first good boot s | steady rate s | held boot s p50 / max |")
    print("|" + "---|" * 11)
    for p in result["phases"]:
        for name, s in p["servers"].items():
            failures = ", ".join(f"{k}: {v}" for k, v in sorted(s["failures"].items())) or "—"
            lost_unheld = f"{s['lost_not_held']} of {s['not_held']}" if s["not_held"] else "—"
            print(f"| {p['phase']} {p['fault']} ({p['fault_s']} s) | {name} | {s['boots']} | "
                  f"{s['lost_held']} of {s['held']} | {lost_unheld} | {s['stale_answers']} | {s['retried']} | {failures} | "
                  f"{_dash(s['first_good_boot_s'])} | {_dash(s['steady_rate_s'])} | "
                  f"{_dash(s['held_boot_s_p50'])} / {_dash(s['held_boot_s_max'])} |")
    print("\nRSS MiB at each phase's start -> end:\n")
    for p in result["phases"]:
        parts = [f"{k}: {v} -> {p['memory_end'].get(k, 'gone')}" for k, v in p["memory_start"].items()]
        parts += [f"{k}: new -> {v}" for k, v in p["memory_end"].items() if k not in p["memory_start"]]
        print(f"* {p['phase']}: " + "; ".join(parts))
    print("\nWhat each fault did:\n")
    for p in result["phases"]:
        print(f"* {p['phase']}: {json.dumps(p['note'])}")


def _dash(value) -> str:
    return "—" if value is None else str(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=20, help="each fault's length (a, c, f) and each recovery window")
    parser.add_argument("--freeze-seconds", type=int, default=60, help="phase b: how long the database stays frozen")
    parser.add_argument("--phases", default="a,b,c,d,e,f")
    parser.add_argument("--boots-per-s", type=float, default=20.0, help="pods started per second against each server")
    parser.add_argument("--unheld-fraction", type=float, default=0.1, help="of tunecache's pods, those asking a new key")
    parser.add_argument("--deadline", type=float, default=30.0, help="a pod's deadline for its boot, seconds")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--data-dir-mib", type=int, default=64, help="size of the data dir's tmpfs")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if (reason := unavailable_reason()) is not None:
        sys.exit(reason)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    with tempfile.TemporaryDirectory(prefix="tunecache-chaos-") as tmp, private_postgres() as pg:
        data_dir = Path(tmp) / "data"
        data_dir.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={args.data_dir_mib}m", "tmpfs", str(data_dir)], check=True)
        try:
            parts, targets, artifact_paths, seed_new_run = start_parts(Path(tmp), pg)
            try:
                result = asyncio.run(chaos(args, parts, targets, artifact_paths, seed_new_run))
            finally:
                stop_parts(parts)
        finally:
            subprocess.run(["umount", "-l", str(data_dir)], check=False)
    result["args"] = vars(args)
    print_report(result)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
