#!/usr/bin/env python3
"""End-to-end on a GPU node: serve (SQLite) -> tune -> pull in a fresh process -> 0 misses.

Run on the H200 machine (see docs/gpu.md):

    python scripts/gpu_e2e.py --out results/            # the whole sequence
    python scripts/gpu_e2e.py verify --cache FILE ...   # one fresh-process measurement

Steps, each a separate process so nothing is shared in memory:

1. ``tunecache serve`` on a fresh SQLite file;
2. ``tunecache tune --server URL`` for the model config (FlashInfer autotune in a child);
3. ``tunecache pull`` into an empty directory (environment detected by FlashInfer);
4. ``verify`` with the installed file under ``flashinfer.autotune(False, cache=FILE)``:
   the decoder GEMMs at token counts across 1..max_num_batched_tokens, counting
   ``AutoTuner.get().stats.cache_misses``; and ``verify`` without any cache (FlashInfer's
   default tactics) for the untuned time per pass.

Prints a table and writes ``gpu_e2e.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = ROOT / "tests" / "fixtures" / "models" / "llama-3.1-8b"
#: Token counts of the verification pass: bucket edges and values between them.
VERIFY_TOKENS = (1, 3, 16, 100, 256, 700, 1024, 2000, 3000, 4096, 6000, 8192)


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "tunecache.cli", *args]


def timed(command: list[str], log: Path) -> tuple[float, subprocess.CompletedProcess]:
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    with log.open("a") as f:
        f.write(f"$ {' '.join(command)}\n(exit {result.returncode}, {seconds:.2f} s)\n{result.stdout}{result.stderr}\n")
    if result.returncode != 0:
        sys.exit(f"failed ({result.returncode}): {' '.join(command)}\n{result.stderr[-4000:]}")
    return seconds, result


def wait_healthy(url: str, process: subprocess.Popen, timeout_s: float = 60) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit("tunecache serve exited early")
        try:
            if httpx.get(f"{url}/v1/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    sys.exit("tunecache serve did not become healthy")


def verify(args: argparse.Namespace) -> None:
    """One fresh-process measurement; prints one JSON line."""
    import torch

    import flashinfer
    from flashinfer.autotuner import AutoTuner

    from tunecache.service.tuner.model_config import dense_gemm_shapes, load_hf_config
    from tunecache.service.tuner.stages import BF16_BACKENDS

    shapes = dense_gemm_shapes(load_hf_config(args.config))
    backends = args.backends.split(",") if args.backends else BF16_BACKENDS["sm90"]
    major, minor = torch.cuda.get_device_capability(0)
    supported = getattr(flashinfer.mm_bf16, "is_backend_supported", None)  # FlashInfer's backend_requirement
    backends = [b for b in backends if supported is None or supported(b, major * 10 + minor)]
    tokens = [m for m in VERIFY_TOKENS if m <= args.max_num_batched_tokens]
    weights = {s: torch.randn(s.n, s.k, device="cuda", dtype=torch.bfloat16).t() for s in shapes}
    inputs = {(s, m): torch.randn(m, s.k, device="cuda", dtype=torch.bfloat16) for s in shapes for m in tokens}

    def one_pass() -> None:
        for (shape, _m), a in inputs.items():
            for backend in backends:
                flashinfer.mm_bf16(a, weights[shape], backend=backend)

    def measured() -> tuple[float, float]:
        started = time.perf_counter()
        one_pass()  # first pass: loads/JITs and looks every shape up once
        torch.cuda.synchronize()
        first = time.perf_counter() - started
        for _ in range(3):
            one_pass()
        torch.cuda.synchronize()
        started = time.perf_counter()
        for _ in range(args.passes):
            one_pass()
        torch.cuda.synchronize()
        return first, (time.perf_counter() - started) / args.passes

    if args.cache:
        with flashinfer.autotune(False, cache=args.cache):
            first, per_pass = measured()
    else:
        first, per_pass = measured()
    stats = AutoTuner.get().stats
    print(json.dumps({
        "mode": "tuned" if args.cache else "untuned",
        "calls_per_pass": len(inputs) * len(backends),
        "first_pass_s": round(first, 4),
        "per_pass_ms": round(per_pass * 1000, 3),
        "cache_misses": stats.cache_misses,
        "backends": backends,
        "flashinfer_version": flashinfer.__version__,
        "gpu": torch.cuda.get_device_name(0),
    }))


def end_to_end(args: argparse.Namespace) -> None:
    import httpx

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    log = out / "gpu_e2e.log"
    log.write_text("")
    work = Path(args.work or "/tmp/tunecache-gpu-e2e")
    work.mkdir(parents=True, exist_ok=True)
    # The service writes its first admin token into its data dir; tune and pull read it there.
    os.environ["TUNECACHE_DATA_DIR"] = str(work / "data")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    database = f"sqlite:///{work / 'tunecache.db'}"
    key = ["--model", args.model, "--max-num-batched-tokens", str(args.max_num_batched_tokens)]
    server = subprocess.Popen(cli("serve", "--port", str(port), "--database", database),
                              stdout=open(out / "serve.log", "w"), stderr=subprocess.STDOUT)
    try:
        wait_healthy(url, server)
        tune_cmd = cli("tune", *key, "--config", str(args.config), "--server", url, "--timeout", str(args.tune_timeout),
                       "--work-dir", str(work / "tune"))
        if args.backends:
            tune_cmd += ["--gemm-backends", args.backends]
        if args.stages:
            tune_cmd += ["--stages", args.stages]
        tune_s, tuned = timed(tune_cmd, log)
        run = httpx.get(f"{url}/v1/tunings", params={"limit": 1}).json()["items"][0]  # the run just tuned

        dest = work / "installed"
        pull_s, pulled = timed(cli("pull", "--server", url, *key, "--dest", str(dest)), log)
        installed = pulled.stdout.strip()

        verify_base = [sys.executable, str(Path(__file__).resolve()), "verify", "--config", str(args.config),
                       "--max-num-batched-tokens", str(args.max_num_batched_tokens), "--passes", str(args.passes)]
        if args.backends:
            verify_base += ["--backends", args.backends]
        _, warm = timed(verify_base + ["--cache", installed], log)
        _, cold = timed(verify_base, log)
    finally:
        server.terminate()
        server.wait(timeout=30)
    warm_r, cold_r = json.loads(warm.stdout.strip().splitlines()[-1]), json.loads(cold.stdout.strip().splitlines()[-1])
    summary = {
        "gpu": warm_r["gpu"],
        "model": args.model,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "tune_command_s": round(tune_s, 2),
        "tuning_s": run["summary"]["tuning_seconds"],
        "entries": run["summary"]["entries"],
        "stages": run["summary"]["stages"],
        "pull_install_s": round(pull_s, 2),
        "installed_file": installed,
        "tuned": warm_r,
        "untuned": cold_r,
        "environment": run["environment"],
    }
    (out / "gpu_e2e.json").write_text(json.dumps(summary, indent=2))
    rows = [
        ("GPU", summary["gpu"]),
        ("model / max_num_batched_tokens", f"{args.model} / {args.max_num_batched_tokens}"),
        ("`tunecache tune` (whole command)", f"{tune_s:.1f} s"),
        ("FlashInfer tuning inside the child", f"{summary['tuning_s']:.1f} s"),
        ("entries stored", str(summary["entries"])),
        ("`tunecache pull` + install (fresh process)", f"{pull_s:.2f} s"),
        ("cache misses after install (fresh process)", str(warm_r["cache_misses"])),
        ("GEMM calls per pass", str(warm_r["calls_per_pass"])),
        ("time per pass, tuned (installed file)", f"{warm_r['per_pass_ms']:.3f} ms"),
        ("time per pass, untuned (FlashInfer defaults)", f"{cold_r['per_pass_ms']:.3f} ms"),
        ("first pass, tuned / untuned", f"{warm_r['first_pass_s']:.2f} s / {cold_r['first_pass_s']:.2f} s"),
    ]
    table = "| what | result |\n| --- | --- |\n" + "\n".join(f"| {a} | {b} |" for a, b in rows)
    (out / "gpu_e2e.md").write_text(table + "\n")
    print(table)
    if warm_r["cache_misses"] != 0:
        sys.exit(f"FAIL: {warm_r['cache_misses']} cache misses after install")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command")
    for p in (parser, verify_p := sub.add_parser("verify", help="one fresh-process measurement")):
        p.add_argument("--config", default=str(DEFAULT_CONFIG), help="HF config dir/file")
        p.add_argument("--max-num-batched-tokens", type=int, default=8192)
        p.add_argument("--backends", default=None, help="comma-separated mm_bf16 backends (default: cudnn,cublaslt)")
        p.add_argument("--passes", type=int, default=20)
    verify_p.add_argument("--cache", default=None, help="FlashInfer cache file (omit: untuned)")
    parser.add_argument("--model", default="meta-llama/Llama-3.1-8B")
    parser.add_argument("--out", default="results")
    parser.add_argument("--work", default=None)
    parser.add_argument("--tune-timeout", type=float, default=540)
    parser.add_argument("--stages", default=None, help="tuner stages (default: all that apply)")
    args = parser.parse_args()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    if args.command == "verify":
        verify(args)
    else:
        end_to_end(args)


if __name__ == "__main__":
    main()
