#!/usr/bin/env python3
"""HTTP-triggered tuning on a GPU node, then a fresh "pod" that installs tactics and JIT modules.

Phases (each its own command, so they fit the GPU machine's 10-minute calls; state is
kept under --work between them):

  tune   `tunecache keys generate` makes the node's signing key (WORK/keys); `tunecache
         serve` with the job worker on (SQLite), that key (TUNECACHE_SIGNING_KEY) and
         FlashInfer's workspace at WORK/fi (FLASHINFER_WORKSPACE_BASE); its first start
         writes the admin token, with which `tunecache retune --wait` posts a job for the
         model; the worker runs the tuner (stages chosen by --stages) and stores the
         FlashInfer file and the JIT modules it built, signed.
  warm   deletes WORK/fi (an empty FlashInfer cache), `tunecache pull --jit` in a fresh
         process that trusts only the node's public key (TUNECACHE_TRUSTED_KEYS), then
         `verify` runs the model's GEMMs under
         flashinfer.autotune(False, cache=FILE) and FlashInfer's prefill/decode attention:
         cache misses, JIT rebuilds (files changed under cached_ops), seconds.
  cold   `verify --cold` in a fresh process with an empty workspace elsewhere and no
         tunecache: builds the JIT modules and tunes the GEMMs itself, as a pod without
         tunecache would.
  report prints the cold/warm table from the JSON the phases wrote under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QWEN3 = ROOT / "tests" / "fixtures" / "models" / "qwen3-30b-a3b"
VERIFY_TOKENS = (1, 16, 128, 1000, 4096, 8192)


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "tunecache.cli", *args]


def run_logged(command: list[str], log: Path, env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess]:
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - started
    with log.open("a") as f:
        f.write(f"$ {' '.join(command)}\n(exit {result.returncode}, {seconds:.2f} s)\n{result.stdout}{result.stderr[-20000:]}\n")
    if result.returncode != 0:
        sys.exit(f"failed ({result.returncode}): {' '.join(command)}\n{result.stderr[-4000:]}")
    return seconds, result


class Server:
    """`tunecache serve` on a free port for the duration of a phase."""

    def __init__(self, work: Path, out: Path, env: dict[str, str], worker: str):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = env | {"TUNECACHE_JOB_WORKER": worker, "TUNECACHE_DATA_DIR": str(work / "data"),
                          "TUNECACHE_LEASE_SECONDS": "30"}
        self.log = open(out / f"serve-{worker}.log", "a")
        self.process = subprocess.Popen(cli("serve", "--port", str(self.port)), env=self.env,
                                        stdout=self.log, stderr=subprocess.STDOUT)

    def __enter__(self) -> "Server":
        import httpx

        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                sys.exit("tunecache serve exited early")
            try:
                health = httpx.get(f"{self.url}/v1/health", timeout=1)
                if health.status_code == 200:  # with the admin token it says which GPU the worker serves
                    token = (Path(self.env["TUNECACHE_DATA_DIR"]) / "admin.token").read_text().strip()
                    self.health = httpx.get(f"{self.url}/v1/health", headers={"Authorization": f"Bearer {token}"}).json()
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        sys.exit("tunecache serve did not become healthy")

    def __exit__(self, *exc: object) -> None:
        self.process.terminate()
        self.process.wait(timeout=60)
        self.log.close()


def phase_tune(args, work: Path, out: Path, env: dict[str, str]) -> None:
    import httpx

    shutil.rmtree(work / "keys", ignore_errors=True)
    run_logged(cli("keys", "generate", "--out", str(work / "keys")), out / "tune.log", env)
    env = env | {"FLASHINFER_WORKSPACE_BASE": str(work / "fi"), "TUNECACHE_SIGNING_KEY": str(work / "keys" / "signing.key")}
    with Server(work, out, env, worker="on") as server:
        command = cli("retune", "--server", server.url, "--model", args.model, "--max-num-batched-tokens",
                      str(args.max_num_batched_tokens), "--gpu-name", server.health["worker"]["gpu_name"],
                      "--config", str(args.config), "--wait", "--poll", "1")
        if args.stages:
            command += ["--stages", args.stages]
        if args.backends:
            command += ["--gemm-backends", args.backends]
        seconds, _ = run_logged(command, out / "tune.log", env)
        job = httpx.get(f"{server.url}/v1/tuning-jobs", params={"limit": 1}).json()["items"][0]
        run = httpx.get(f"{server.url}/v1/tunings/{job['run_id']}").json()
    result = {"retune_wait_s": round(seconds, 2), "worker": server.health["worker"], "job": job,
              "run": {k: run[k] for k in ("id", "summary", "duration_s", "trigger", "node", "signature", "verified")},
              "artifacts": [{k: a[k] for k in ("kind", "name", "size_bytes")} for a in run["artifacts"]]}
    (out / "tune.json").write_text(json.dumps(result, indent=2))
    print(json.dumps({"job": job["status"], "retune_wait_s": result["retune_wait_s"], "entries": run["summary"]["entries"],
                      "jit_modules": run["summary"]["jit_modules"]}, indent=1))


def phase_warm(args, work: Path, out: Path, env: dict[str, str]) -> None:
    env = env | {"FLASHINFER_WORKSPACE_BASE": str(work / "fi"), "TUNECACHE_TRUSTED_KEYS": str(work / "keys" / "signing.pub")}
    shutil.rmtree(work / "fi", ignore_errors=True)  # the pod starts with an empty FlashInfer cache
    shutil.rmtree(work / "pod", ignore_errors=True)
    with Server(work, out, env, worker="off") as server:
        pull_s, pulled = run_logged(
            cli("pull", "--server", server.url, "--model", args.model, "--max-num-batched-tokens",
                str(args.max_num_batched_tokens), "--dest", str(work / "pod"), "--jit"), out / "warm.log", env)
        installed = pulled.stdout.strip().splitlines()[-1]
        _, verified = run_logged(verify_command(args) + ["--cache", installed], out / "warm.log", env)
        result = json.loads(verified.stdout.strip().splitlines()[-1]) | {"pull_install_s": round(pull_s, 2),
                                                                          "pull_stderr": pulled.stderr.strip().splitlines()}
        (out / "warm.json").write_text(json.dumps(result, indent=2))
        print(json.dumps(result, indent=1))
        shutil.rmtree(work / "fi", ignore_errors=True)  # again empty, for the Python API pod
        _, verified = run_logged(verify_command(args) + ["--api", server.url, "--model", args.model, "--work", str(work)],
                                 out / "api.log", env)
    api = json.loads(verified.stdout.strip().splitlines()[-1])
    (out / "api.json").write_text(json.dumps(api, indent=2))
    print(json.dumps(api, indent=1))


def phase_cold(args, work: Path, out: Path, env: dict[str, str]) -> None:
    env = env | {"FLASHINFER_WORKSPACE_BASE": str(work / "fi-cold")}
    shutil.rmtree(work / "fi-cold", ignore_errors=True)
    _, verified = run_logged(verify_command(args) + ["--cold"], out / "cold.log", env)
    result = json.loads(verified.stdout.strip().splitlines()[-1])
    (out / "cold.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=1))


def verify_command(args) -> list[str]:
    command = [sys.executable, str(Path(__file__).resolve()), "verify", "--config", str(args.config),
               "--max-num-batched-tokens", str(args.max_num_batched_tokens)]
    return command + (["--backends", args.backends] if args.backends else [])


def snapshot(directory: Path) -> dict[str, float]:
    return {str(p): p.stat().st_mtime for p in directory.rglob("*") if p.is_file()} if directory.is_dir() else {}


def verify(args) -> None:
    """A fresh process: the model's GEMMs and attention, warm (installed file + JIT modules)
    or cold (tune and compile here). Prints one JSON line."""
    started_process = time.perf_counter()
    import torch

    import flashinfer
    from flashinfer.autotuner import AutoTuner
    from flashinfer.fused_moe.utils import get_hybrid_num_tokens_buckets
    from flashinfer.jit import env as jit_env

    from tunecache.service.tuner.model_config import dense_gemm_shapes, load_hf_config
    from tunecache.service.tuner.stages import BF16_BACKENDS, AttentionWarmupStage, TuneSpec

    config = load_hf_config(args.config)
    spec = TuneSpec(model="verify", hf_config=config, max_num_batched_tokens=args.max_num_batched_tokens)
    backends = args.backends.split(",") if args.backends else list(BF16_BACKENDS["sm90"])
    shapes = dense_gemm_shapes(config)
    cached_ops = Path(jit_env.FLASHINFER_WORKSPACE_DIR) / "cached_ops"
    before = snapshot(cached_ops)
    import_s = time.perf_counter() - started_process

    def gemms(tokens) -> None:
        for shape in shapes:
            b = torch.randn(shape.n, shape.k, device="cuda", dtype=torch.bfloat16).t()
            for m in tokens:
                a = torch.randn(m, shape.k, device="cuda", dtype=torch.bfloat16)
                for backend in backends:
                    flashinfer.mm_bf16(a, b, backend=backend)
        torch.cuda.synchronize()

    timings = {}
    t = time.perf_counter()
    if args.api:  # only the client's Python API: install + AutoTuner.load_configs, no autotune context
        from tunecache.client.api import install_tuning

        loaded = install_tuning(args.api, args.model, args.max_num_batched_tokens, args.work + "/pod-api", jit=True)
        timings["api_install_s"] = round(time.perf_counter() - t, 3)
        timings["api_loaded"] = loaded.loaded
        timings["api_jit_modules"] = len(loaded.installed.jit_modules)
        before = snapshot(cached_ops)  # after the install: count only what this process rebuilds
        t = time.perf_counter()
        gemms(VERIFY_TOKENS)
        timings["tune_s"] = 0.0
    elif args.cold:  # what a pod without tunecache does: tune (vLLM's context) then run
        buckets = get_hybrid_num_tokens_buckets(args.max_num_batched_tokens)
        with flashinfer.autotune(True, tuning_buckets=buckets, round_up=True):
            gemms([args.max_num_batched_tokens])
        timings["tune_s"] = round(time.perf_counter() - t, 3)
        t = time.perf_counter()
        gemms(VERIFY_TOKENS)
    else:
        with flashinfer.autotune(False, cache=args.cache):
            gemms(VERIFY_TOKENS)
        timings["tune_s"] = 0.0
    timings["gemm_first_pass_s"] = round(time.perf_counter() - t, 3)
    t = time.perf_counter()
    AttentionWarmupStage().run(spec, "sm90", lambda *a: None)  # builds (cold) or loads (warm) the JIT modules
    timings["attention_first_call_s"] = round(time.perf_counter() - t, 3)
    after = snapshot(cached_ops)
    rebuilt = sorted({Path(p).relative_to(cached_ops).parts[0] for p, m in after.items() if before.get(p) != m} - {"tmp"})
    print(json.dumps({
        "mode": "api" if args.api else "cold" if args.cold else "warm",
        "gpu": torch.cuda.get_device_name(0),
        "import_s": round(import_s, 3),
        **timings,
        "first_forward_total_s": round(time.perf_counter() - started_process, 3),
        "cache_misses": AutoTuner.get().stats.cache_misses,
        "jit_modules_built_here": rebuilt,
        "jit_modules_present": sorted(p.name for p in cached_ops.iterdir() if p.name != "tmp") if cached_ops.is_dir() else [],
    }))


def report(out: Path) -> None:
    tune, warm, cold, api = (json.loads((out / f"{n}.json").read_text()) for n in ("tune", "warm", "cold", "api"))
    stages = tune["run"]["summary"]["stages"]
    rows = [
        ("GPU", warm["gpu"]),
        ("job (POST /v1/tuning-jobs -> succeeded), `retune --wait`", f"{tune['retune_wait_s']:.1f} s"),
        ("  tuner stages", ", ".join(f"{k}: {v.get('status')} {v.get('seconds', '')}".strip() for k, v in stages.items())),
        ("  entries / JIT modules stored", f"{tune['run']['summary']['entries']} / {len(tune['run']['summary']['jit_modules'])}"),
        ("run signed by (key id), verified", f"{(tune['run'].get('signature') or {}).get('key_id')}, {tune['run'].get('verified')}"),
        ("pod's `pull --jit` (trusting only that key) said", "; ".join(warm.get("pull_stderr", []))),
        ("pull + install (tactics + JIT modules), fresh process", f"{warm['pull_install_s']:.2f} s"),
        ("compile: JIT modules built in the pod, cold / warm",
         "{} / {}".format(*(len(set(r["jit_modules_built_here"]) - {"tmp"}) for r in (cold, warm)))),
        ("Python API pod (install_tuning): loaded / JIT modules / rebuilt / misses",
         f"{api['api_loaded']} / {api['api_jit_modules']} / {len(api['jit_modules_built_here'])} / {api['cache_misses']}"),
        ("compile: first attention call, cold / warm", f"{cold['attention_first_call_s']:.2f} s / {warm['attention_first_call_s']:.2f} s"),
        ("tune: GEMM autotuning in the pod, cold / warm", f"{cold['tune_s']:.2f} s / {warm['tune_s']:.2f} s"),
        ("first GEMM pass, cold (after tuning) / warm", f"{cold['gemm_first_pass_s']:.2f} s / {warm['gemm_first_pass_s']:.2f} s"),
        ("process start to first forward done, cold / warm", f"{cold['first_forward_total_s']:.1f} s / {warm['first_forward_total_s']:.1f} s"),
        ("cache misses, warm", str(warm["cache_misses"])),
    ]
    table = "| what | result |\n| --- | --- |\n" + "\n".join(f"| {a} | {b} |" for a, b in rows)
    (out / "gpu_jobs_e2e.md").write_text(table + "\n")
    print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("phase", choices=["tune", "warm", "cold", "report", "verify"])
    parser.add_argument("--config", default=str(QWEN3))
    parser.add_argument("--model", default="Qwen/Qwen3-30B-A3B")
    parser.add_argument("--max-num-batched-tokens", type=int, default=8192)
    parser.add_argument("--stages", default="gemm,moe,attention")
    parser.add_argument("--backends", default=None, help="mm_bf16 backends (default: cudnn,cublaslt)")
    parser.add_argument("--work", default="/tmp/tunecache-jobs-e2e")
    parser.add_argument("--out", default="results")
    parser.add_argument("--cache", default=None, help="verify: installed FlashInfer file")
    parser.add_argument("--cold", action="store_true", help="verify: tune and compile here")
    parser.add_argument("--api", default=None, metavar="URL", help="verify: install with tunecache.client.api from URL")
    args = parser.parse_args()
    if args.phase == "verify":
        verify(args)
        return
    work, out = Path(args.work), Path(args.out).resolve()
    work.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    # The service's data dir (its admin.token) is where the client commands look for a token.
    env = dict(os.environ) | {"PYTHONUNBUFFERED": "1", "TUNECACHE_DATA_DIR": str(work / "data")}
    {"tune": phase_tune, "warm": phase_warm, "cold": phase_cold}.get(args.phase, lambda *a: report(out))(args, work, out, env)


if __name__ == "__main__":
    main()
