"""Server CPU per boot: how many CPU milliseconds one ``tunecache serve`` process spends on one
pod boot (the lookup, then the autotune artifact), read from the process's own CPU counters
(``/proc/PID/stat``), so the figure barely moves when other work shares the machine, unlike
boots/s under wrk.

    python bench/server_cpu_per_boot.py VENV [VENV ...] [--boots 3000] [--rounds 3]

Each VENV is a virtual environment with tunecache installed (e.g. one of this checkout and one
of an earlier commit, to compare them); the rounds alternate between them. Each measurement
starts a fresh server on SQLite (one process, no job worker), pushes the H200 fixture, warms
up with 300 boots, then times ``--boots`` boots made one after another over one connection.
A measurement, not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

ARTIFACT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "flashinfer-0.7.4-h200" / "mm_bf16-cudnn.json"
MODEL = "meta-llama/Llama-3.1-8B"


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def measure(venv: Path, boots: int) -> float:
    """CPU milliseconds per boot of a fresh server from ``venv``."""
    exe = str(venv / "bin" / "tunecache")
    work = Path(tempfile.mkdtemp(prefix="tunecache-cpu-"))
    db = f"sqlite:///{work}/tunecache.db"
    env = {**os.environ, "TUNECACHE_JOB_WORKER": "off", "TUNECACHE_WORKER": "off", "TUNECACHE_DATA_DIR": str(work / "data")}
    subprocess.run([exe, "db", "upgrade", "--database", db], check=True, env=env, capture_output=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([exe, "serve", "--port", str(port), "--database", db], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                httpx.get(f"{base}/v1/health", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.2)
        subprocess.run([exe, "push", str(ARTIFACT), "--server", base, "--model", MODEL, "--max-num-batched-tokens", "8192"],
                       check=True, env=env, capture_output=True)
        metadata = json.loads(ARTIFACT.read_text())["_metadata"]
        body = json.dumps({"key": {"gpu_name": "NVIDIA H200", "arch": "sm90", "model": MODEL, "max_num_batched_tokens": 8192},
                           "environment": {k: str(v) for k, v in metadata.items()}})
        artifact = f"{base}/v1/artifacts/{hashlib.sha256(ARTIFACT.read_bytes()).hexdigest()}"
        headers = {"Content-Type": "application/json"}
        with httpx.Client(timeout=30) as client:
            def boot() -> None:
                assert client.post(f"{base}/v1/tunings/lookup", content=body, headers=headers).status_code == 200
                assert client.get(artifact).status_code == 200

            for _ in range(300):
                boot()
            before = _cpu_seconds(server.pid)
            for _ in range(boots):
                boot()
            return 1000 * (_cpu_seconds(server.pid) - before) / boots
    finally:
        server.terminate()
        server.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("venvs", nargs="+", type=Path)
    parser.add_argument("--boots", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    figures: dict[str, list[float]] = {str(v): [] for v in args.venvs}
    for _ in range(args.rounds):
        for venv in args.venvs:
            figures[str(venv)].append(measure(venv, args.boots))
    for venv, values in figures.items():
        ordered = sorted(values)
        print(f"{venv}: server CPU per boot, ms: median {ordered[len(ordered) // 2]:.3f} "
              f"(runs: {', '.join(f'{v:.3f}' for v in values)})")


if __name__ == "__main__":
    main()
