#!/usr/bin/env python3
"""DeepGEMM end to end on a GPU node: tune an fp8 block-scaled model with the ``deep_gemm``
stage, install the run's DeepGEMM JIT cache as a pod does, and replay vLLM's dense
DeepGEMM warmup in fresh processes: cold (empty cache) vs warm (installed cache).

Run on the H200 machine (docs/gpu.md), with ``deep_gemm`` importable (vLLM's vendored copy,
``vllm/third_party/deep_gemm``, put on ``PYTHONPATH`` as ``deep_gemm``):

    python scripts/gpu_deep_gemm.py --out results/DIR       # the whole sequence
    python scripts/gpu_deep_gemm.py replay --config DIR ...  # one fresh-process replay

Steps, each its own process:

1. ``tunecache keys generate``; ``tunecache serve`` on a fresh SQLite file;
2. ``tunecache tune --server URL --stages deep_gemm,gemm --gemm-backends cublas
   --signing-key KEY`` (the DeepGEMM warmup runs first, then FlashInfer's fp8 GEMM autotune);
3. a pod process fetches the run with the node's public key trusted
   (``tunecache.client.install.fetch_tuning(..., deep_gemm=True)``) and merges its kernels
   into an empty pod DeepGEMM cache directory (``install_deep_gemm_cache``, as the plugin);
4. ``replay`` (vLLM's dense warmup calls) with ``DG_JIT_CACHE_DIR`` = that directory (warm;
   with ``--cold`` also with an empty one): seconds, and the ``.cubin`` files compiled
   there (warm: 0 means every kernel came from the run). The tune's ``deep_gemm`` stage
   itself ran on an empty cache: its seconds are the cold compile.

Prints a table and writes ``deep_gemm.json`` under ``--out``.
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
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_e2e import cli, timed, wait_healthy  # noqa: E402


def replay(args: argparse.Namespace) -> None:
    """vLLM's dense DeepGEMM warmup calls for the config, timed; one JSON line."""
    import torch

    from tunecache.service.tuner.deep_gemm_stage import DeepGemmStage
    from tunecache.service.tuner.model_config import load_hf_config
    from tunecache.service.tuner.stages import TuneSpec

    spec = TuneSpec(model="replay", hf_config=load_hf_config(args.config), max_num_batched_tokens=args.max_num_batched_tokens,
                    quantization="fp8")
    writable = Path(os.environ["DG_JIT_CACHE_DIR"].split(":")[0])
    def files() -> set[str]:
        return {str(p.relative_to(writable)) for p in writable.rglob("*") if p.is_file()}

    before = files()
    started = time.perf_counter()
    details = DeepGemmStage().run(spec, "sm90", lambda *_: None)
    torch.cuda.synchronize()
    print(json.dumps({
        "seconds": round(time.perf_counter() - started, 3),
        "calls": details["calls"],
        "compiled_cubins": sum(1 for name in files() - before if name.endswith(".cubin")),
        "new_files": sorted(files() - before)[:40],
        "DG_JIT_CACHE_DIR": os.environ["DG_JIT_CACHE_DIR"],
    }))


def install(args: argparse.Namespace) -> None:
    """As a pod: fetch the current run with DeepGEMM's cache, verify, unpack; one JSON line."""
    from tunecache.client.environment import detect_environment, pod_key
    from tunecache.store.http import TunecacheClient
    from tunecache.client.install import fetch_tuning
    from tunecache.client.layouts import install_deep_gemm_cache
    from tunecache.signing import load_trusted_keys

    environment = detect_environment()
    key = pod_key(environment.gpu, args.model, args.max_num_batched_tokens, quantization=args.quantization)
    started = time.perf_counter()
    with TunecacheClient(args.server) as client:
        fetched = fetch_tuning(client, key, environment, deep_gemm=True, trusted_keys=load_trusted_keys(args.trusted_keys))
    if fetched.deep_gemm is None:
        sys.exit(f"run {fetched.run.id} has no DeepGEMM cache (or it was refused: {fetched.executable_refused})")
    kernels = install_deep_gemm_cache(fetched.deep_gemm, Path(args.dest))
    print(json.dumps({"run": fetched.run.id, "signed_by": fetched.signed_by, "bytes": len(fetched.deep_gemm),
                      "directory": args.dest, "kernels": len(kernels), "seconds": round(time.perf_counter() - started, 3)}))


def end_to_end(args: argparse.Namespace) -> None:
    import httpx

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    log = out / "deep_gemm.log"
    log.write_text("")
    work = Path(args.work or "/tmp/tunecache-deep-gemm")
    work.mkdir(parents=True, exist_ok=True)
    os.environ["TUNECACHE_DATA_DIR"] = str(work / "data")
    _, generated = timed(cli("keys", "generate", "--out", str(work / "keys")), log)
    public = generated.stdout.splitlines()[0].strip()  # the public key line (ed25519:...)
    signing = work / "keys" / "signing.key"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    key = ["--model", args.model, "--max-num-batched-tokens", str(args.max_num_batched_tokens)]
    server = subprocess.Popen(cli("serve", "--port", str(port), "--database", f"sqlite:///{work / 'tunecache.db'}"),
                              stdout=open(out / "serve.log", "w"), stderr=subprocess.STDOUT)
    try:
        wait_healthy(url, server)
        tune_s, _ = timed(cli("tune", *key, "--config", str(args.config), "--quantization", "fp8", "--server", url,
                              "--stages", "deep_gemm,gemm", "--gemm-backends", "cublas", "--signing-key", str(signing),
                              "--work-dir", str(work / "tune"), "--timeout", "1500"), log)
        run = httpx.get(f"{url}/v1/tunings", params={"limit": 1}).json()["items"][0]
        me = [sys.executable, str(Path(__file__).resolve())]
        _, installed = timed(me + ["install", "--server", url, *key, "--quantization", "fp8", "--trusted-keys", public,
                                   "--dest", str(work / "pod-deep-gemm")], log)
        installed_r = json.loads(installed.stdout.strip().splitlines()[-1])
        replay_base = me + ["replay", "--config", str(args.config), "--max-num-batched-tokens", str(args.max_num_batched_tokens)]
        cold_writable = work / "cold-writable"
        cold_writable.mkdir(exist_ok=True)
        os.environ["DG_JIT_CACHE_DIR"] = installed_r["directory"]  # the pod's DeepGEMM cache, the run's kernels merged in
        _, warm = timed(replay_base, log)
        cold = None
        if args.cold:  # the tune's deep_gemm stage already compiled from an empty cache
            os.environ["DG_JIT_CACHE_DIR"] = str(cold_writable)
            _, cold = timed(replay_base, log)
    finally:
        server.terminate()
        server.wait(timeout=30)
    warm_r, cold_r = (json.loads(r.stdout.strip().splitlines()[-1]) if r else None for r in (warm, cold))
    dg = run["summary"]["stages"]["deep_gemm"]
    summary = {"model": args.model, "max_num_batched_tokens": args.max_num_batched_tokens, "tune_command_s": round(tune_s, 2),
               "deep_gemm_stage": dg, "artifacts": [(a["kind"], a["size_bytes"]) for a in run["artifacts"]],
               "pod_install": installed_r, "warm": warm_r, "cold": cold_r}
    (out / "deep_gemm.json").write_text(json.dumps(summary, indent=2))
    rows = [
        ("model / max_num_batched_tokens", f"{args.model} / {args.max_num_batched_tokens}"),
        ("`tunecache tune` (deep_gemm + fp8 gemm stages)", f"{tune_s:.1f} s"),
        ("deep_gemm stage", f"{dg.get('seconds')} s, {dg.get('calls')} fp8_gemm_nt calls, {dg.get('kernels')} kernels"),
        ("DeepGEMM cache artifact", f"{installed_r['bytes']} bytes"),
        ("pod fetch + verify + merge", f"{installed_r['seconds']} s, {installed_r['kernels']} kernels "
                                        f"(signed by {installed_r['signed_by']})"),
        ("replay, cold (empty cache)", f"{cold_r['seconds']} s, {cold_r['compiled_cubins']} kernels compiled"
         if cold_r else "not run (the tune's deep_gemm stage is the cold compile)"),
        ("replay, warm (installed cache)", f"{warm_r['seconds']} s, {warm_r['compiled_cubins']} kernels compiled"),
    ]
    table = "| what | result |\n| --- | --- |\n" + "\n".join(f"| {a} | {b} |" for a, b in rows)
    (out / "deep_gemm.md").write_text(table + "\n")
    print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command")
    for p in (parser, sub.add_parser("replay"), install_p := sub.add_parser("install")):
        p.add_argument("--config", default=str(ROOT / "tests" / "fixtures" / "models" / "llama-3.1-8b-fp8-block"))
        p.add_argument("--model", default="meta-llama/Llama-3.1-8B-FP8-block")
        p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--out", default="results/gpu/deep-gemm")
    parser.add_argument("--work")
    parser.add_argument("--cold", action="store_true", help="also replay with an empty cache")
    install_p.add_argument("--server", required=True)
    install_p.add_argument("--trusted-keys", required=True)
    install_p.add_argument("--dest", required=True)
    install_p.add_argument("--quantization", default="fp8")
    args = parser.parse_args()
    {"replay": replay, "install": install}.get(args.command, end_to_end)(args)


if __name__ == "__main__":
    main()
