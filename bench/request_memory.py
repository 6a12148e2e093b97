"""Memory per request: the peak RSS of one ``tunecache serve`` process while it records runs
with large artifacts and diffs runs, beside the same requests with a small artifact, so that
"independent of artifact size" (or not) shows in figures of one run.

    python bench/request_memory.py [--big-mib 128] [--small-mib 1] [--postgres URL] [--out FILE.json]

Needs a PostgreSQL server (default ``postgresql+psycopg://postgres@127.0.0.1:5432/test``; a
fresh schema is made and dropped). One server process (``tunecache serve``, no job worker);
a ``push`` token is created with the admin token the server wrote. Scenarios, each for the
small and the big artifact size:

* ``record x1``: upload one artifact (``PUT /v1/artifacts/{sha256}``, the body streamed from a
  file) and record a pod's run naming it (``POST /v1/tunings``, push token) with a FlashInfer
  autotune file beside it (the artifact is the run's ``flashinfer_jit_module`` tarball);
* ``record x3``: three such recordings at once, each with an artifact of its own;

and ``diff x4``: ``GET /v1/tunings/{a}/diff/{b}`` anonymously, four at once, of two runs whose
FlashInfer autotune files are just under the bound a diff reads (``MAX_DIFF_FILE_BYTES``),
beside the same with the 20 KB test fixture files; a 503 (the process computes another diff)
is retried after its ``Retry-After``, as the client does.

For each: the server's RSS before, its peak during the requests (``VmHWM`` reset through
``/proc/PID/clear_refs`` before each scenario; root) and the growth (peak - before), and the
statuses. A figure here is a measurement of this machine, not a test: nothing is asserted.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from boot_storm import ARTIFACT, MODEL, fresh_schema, free_port, stop_group, wait_http  # noqa: E402

MIB = 1024 * 1024
H200_KEY = {"gpu_name": "NVIDIA H200", "arch": "sm90", "model": MODEL, "max_num_batched_tokens": 8192}


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    return 0


def reset_peak(pid: int) -> bool:
    """Reset the process's VmHWM to its current RSS (Linux >= 4.0, ``clear_refs`` 5)."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        return True
    except OSError:
        return False


class PeakSampler:
    """RSS sampled every 5 ms (the peak where ``clear_refs`` cannot reset VmHWM), and the
    slowest ``/v1/health`` answer, asked every 0.2 s meanwhile."""

    def __init__(self, pid: int, base: str):
        self.pid, self.base, self.peak, self.health_max_s, self._stop = pid, base, 0, 0.0, threading.Event()
        self._threads = [threading.Thread(target=self._rss, daemon=True), threading.Thread(target=self._health, daemon=True)]

    def _rss(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_kib(self.pid))
            time.sleep(0.005)

    def _health(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                httpx.get(f"{self.base}/v1/health", timeout=30)
            except httpx.HTTPError:
                pass
            self.health_max_s = max(self.health_max_s, time.monotonic() - started)
            self._stop.wait(0.2)

    def __enter__(self):
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()


def random_file(path: Path, size: int) -> str:
    """``size`` random bytes written to ``path``; their sha256."""
    digest = hashlib.sha256()
    with open(path, "wb") as out:
        left = size
        while left:
            block = os.urandom(min(left, 4 * MIB))
            digest.update(block)
            out.write(block)
            left -= len(block)
    return digest.hexdigest()


def autotune_file(target_bytes: int, variant: int) -> bytes:
    """A FlashInfer v1 autotune file (the fixture's metadata and entry shape) of about
    ``target_bytes``: entries of distinct shapes; ``variant`` 1 picks another tactic for
    every third entry (a diff with changes)."""
    fixture = json.loads(ARTIFACT.read_text())
    metadata = fixture["_metadata"]
    template_key, template = next((k, v) for k, v in fixture.items() if k != "_metadata")
    body: dict = {"_metadata": metadata}
    size = len(json.dumps(body))
    i = 0
    while True:
        key = template_key.replace("((1, 4096)", f"(({i + 1}, 4096)", 1)
        value = json.loads(json.dumps(template))
        if variant and i % 3 == 0:
            value[1] = [1, []]
        item = len(json.dumps({key: value})) + 2
        if size + item >= target_bytes:
            break
        body[key] = value
        size += item
        i += 1
    return json.dumps(body).encode()


def upload(base: str, token: str, path: Path, sha: str) -> int:
    size = path.stat().st_size

    def chunks():
        with open(path, "rb") as f:
            while block := f.read(MIB):
                yield block

    answer = httpx.put(f"{base}/v1/artifacts/{sha}", content=chunks(), timeout=600,
                       headers={"Authorization": f"Bearer {token}", "Content-Length": str(size),
                                "Content-Type": "application/octet-stream"})
    return answer.status_code


def run_body(autotune: bytes, extra: list[dict]) -> dict:
    parsed = json.loads(autotune)
    return {
        "key": H200_KEY,
        "environment": {k: str(v) for k, v in parsed["_metadata"].items()},
        "trigger": "upload",
        "summary": {"entries": len(parsed) - 1},
        "artifacts": [{"kind": "flashinfer_autotune_v1", "name": "autotune.json", "media_type": "application/json",
                       "sha256": hashlib.sha256(autotune).hexdigest()}, *extra],
    }


def measure(pid: int, base: str, name: str, work) -> dict:
    before = rss_kib(pid)
    reset = reset_peak(pid)
    started = time.monotonic()
    with PeakSampler(pid, base) as sampler:
        statuses = work()
    seconds = time.monotonic() - started
    peak = max(rss_kib(pid, "VmHWM") if reset else 0, sampler.peak)
    row = {"scenario": name, "rss_before_mib": round(before / 1024, 1), "peak_mib": round(peak / 1024, 1),
           "growth_mib": round((peak - before) / 1024, 1), "seconds": round(seconds, 2),
           "statuses": statuses, "health_max_s": round(sampler.health_max_s, 3), "rss_after_mib": round(rss_kib(pid) / 1024, 1)}
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--big-mib", type=int, default=128)
    parser.add_argument("--small-mib", type=int, default=1)
    parser.add_argument("--postgres", default=os.environ.get("TUNECACHE_BENCH_POSTGRES_URL",
                                                            "postgresql+psycopg://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    from tunecache.contract import MAX_AUTOTUNE_FILE_BYTES

    exe = shutil.which("tunecache") or sys.exit("tunecache is not installed")
    url_db, drop = fresh_schema(args.postgres)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="tunecache-memory-") as tmp:
        work = Path(tmp)
        env = {**os.environ, "TUNECACHE_JOB_WORKER": "off", "TUNECACHE_DATA_DIR": str(work / "data")}
        subprocess.run([exe, "db", "upgrade", "--database", url_db], check=True, env=env, capture_output=True)
        port = free_port()
        log = open(work / "serve.log", "w")
        server = subprocess.Popen([exe, "serve", "--port", str(port), "--database", url_db], env=env, stdout=log,
                                  stderr=log, start_new_session=True)
        base = f"http://127.0.0.1:{port}"
        try:
            wait_http(f"{base}/v1/health")
            admin = (work / "data" / "admin.token").read_text().strip()
            made = httpx.post(f"{base}/v1/tokens", json={"name": "bench-push", "scope": "push"},
                              headers={"Authorization": f"Bearer {admin}"}, timeout=30)
            made.raise_for_status()
            push = made.json()["token"]
            small_autotune = ARTIFACT.read_bytes()
            assert upload_bytes(base, push, small_autotune) in (200, 201)

            def record(size: int, tag: str) -> str:
                path = work / f"artifact-{tag}"
                sha = random_file(path, size)
                put = upload(base, push, path, sha)
                path.unlink()
                extra = [{"kind": "flashinfer_jit_module", "name": f"jit-{tag}.tar.gz",
                          "media_type": "application/gzip", "sha256": sha}]
                posted = httpx.post(f"{base}/v1/tunings", json=run_body(small_autotune, extra),
                                    headers={"Authorization": f"Bearer {push}"}, timeout=600)
                return f"PUT {put}, POST {posted.status_code}"

            def counted(outcomes: list[str]) -> dict:
                found: dict[str, int] = {}
                for outcome in outcomes:
                    found[outcome] = found.get(outcome, 0) + 1
                return found

            for mib in (args.small_mib, args.big_mib):
                rows.append(measure(server.pid, base, f"record x1, {mib} MiB artifact",
                                    lambda: counted([record(mib * MIB, f"{mib}-one")])))
                with ThreadPoolExecutor(3) as pool:
                    rows.append(measure(server.pid, base, f"record x3 at once, {mib} MiB artifacts each",
                                        lambda: counted(list(pool.map(lambda i: record(mib * MIB, f"{mib}-{i}"), range(3))))))

            def recorded_pair(a: bytes, b: bytes) -> tuple[int, int]:
                ids = []
                for data in (a, b):
                    assert upload_bytes(base, push, data) in (200, 201)
                    posted = httpx.post(f"{base}/v1/tunings", json=run_body(data, []),
                                        headers={"Authorization": f"Bearer {push}"}, timeout=120)
                    posted.raise_for_status()
                    ids.append(posted.json()["id"])
                return ids[0], ids[1]

            other = ARTIFACT.with_name("mm_bf16-cublaslt.json").read_bytes()
            bound_a = autotune_file(MAX_AUTOTUNE_FILE_BYTES, 0)
            bound_b = autotune_file(MAX_AUTOTUNE_FILE_BYTES, 1)
            for label, (a, b) in ((f"{len(small_autotune) // 1024} KB files", (small_autotune, other)),
                                  (f"{len(bound_a) / MIB:.2f} MiB files (bound {MAX_AUTOTUNE_FILE_BYTES // MIB} MiB)",
                                   (bound_a, bound_b))):
                run_a, run_b = recorded_pair(a, b)

                def diff(_: int) -> str:
                    """As the client asks: a 503 is retried after its Retry-After."""
                    seen = []
                    while True:
                        answer = httpx.get(f"{base}/v1/tunings/{run_a}/diff/{run_b}", timeout=600)
                        seen.append(str(answer.status_code))
                        if answer.status_code != 503 or len(seen) > 600:
                            return "GET " + (f"{seen[-1]} after 503 x{len(seen) - 1}" if len(seen) > 1 else seen[-1])
                        time.sleep(float(answer.headers.get("retry-after", "1")))

                with ThreadPoolExecutor(4) as pool:
                    rows.append(measure(server.pid, base, f"anonymous diff x4 at once, {label}",
                                        lambda: counted(list(pool.map(diff, range(4))))))
            health_started = time.monotonic()
            httpx.get(f"{base}/v1/health", timeout=30)
            health_s = time.monotonic() - health_started
        finally:
            stop_group(server)
            log.close()
            drop()
    print("\n| scenario | RSS before MiB | peak MiB | growth MiB | seconds | slowest /v1/health meanwhile s | statuses |\n|---|---|---|---|---|---|---|")
    for r in rows:
        statuses = ", ".join(f"{k}: {v}" for k, v in r["statuses"].items())
        print(f"| {r['scenario']} | {r['rss_before_mib']} | {r['peak_mib']} | {r['growth_mib']} | {r['seconds']} | {r['health_max_s']} | {statuses} |")
    print(f"\n/v1/health after: {health_s:.3f} s")
    if args.out:
        Path(args.out).write_text(json.dumps({"rows": rows, "health_after_s": round(health_s, 3)}, indent=2))


def upload_bytes(base: str, token: str, data: bytes) -> int:
    return httpx.put(f"{base}/v1/artifacts/{hashlib.sha256(data).hexdigest()}", content=data, timeout=120,
                     headers={"Authorization": f"Bearer {token}"}).status_code


if __name__ == "__main__":
    main()
