#!/usr/bin/env python3
"""Real vLLM on a GPU node: ``tunecache tune --runner vllm``, a warm engine boot through the
plugin, and a cold engine boot without tunecache, each its own process.

Run on the H200 machine (docs/gpu.md, "Real vLLM 0.25"), with vLLM 0.25.0, FlashInfer 0.6.13
and tunecache importable (``scripts/gpu_vllm_bundle.sh``):

    python scripts/gpu_vllm_e2e.py --out results/gpu/DIR                 # steps 1-2 (one command)
    python scripts/gpu_vllm_e2e.py --steps cold --out results/gpu/DIR    # step 3 (the next command)

The engine, the same in every step: the model's config (``--config``, default Llama-3.1-8B)
in a directory, ``load_format="dummy"`` (random weights), ``skip_tokenizer_init=True``,
``enforce_eager=True``, ``served_model_name`` = ``--model``, the key's
``max_num_batched_tokens``, and :data:`ENGINE_ARGS` (FlashInfer attention, a short
``max_model_len``), which the tuning node also gets through ``TUNECACHE_VLLM_ENGINE_ARGS``.
Every step uses one FlashInfer workspace base (``FLASHINFER_WORKSPACE_BASE``, as a pod
image and its tuning node share one), emptied before each boot, and a fresh
``VLLM_CACHE_ROOT``.

1. ``tunecache keys generate``, ``tunecache serve`` (SQLite), ``tunecache tune --runner vllm
   --signing-key`` from an empty workspace (vLLM's kernel_warmup in the tuner; its files and
   JIT modules stored);
2. ``warm``: a boot with ``TUNECACHE_URL`` and the node's public key trusted: the plugin
   installs before vLLM's warmup;
3. ``cold`` (``--steps cold``, a command of its own): a boot without tunecache (vLLM's own
   warmup: FlashInfer JIT builds, autotune).

Each boot reports: seconds from ``LLM(...)`` to ready, seconds of a first request (16 prompt
tokens, 8 generated), the FlashInfer JIT modules built during the boot (``.so`` files in the
workspace written since the boot started), FlashInfer's autotuner lines (runs, config-file
hits), the entries of vLLM's autotune file when the boot ends (more than the run's: the boot
tuned shapes itself) and the plugin's ``tunecache:`` lines. Writes ``vllm_e2e.json`` and ``vllm_e2e.md``
and every log under ``--out``.
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
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_e2e import cli, timed, wait_healthy  # noqa: E402

#: Engine settings of the fleet besides the key (vLLM 0.25 chooses FlashInfer attention only
#: by engine argument); the tuning node gets the same through TUNECACHE_VLLM_ENGINE_ARGS.
ENGINE_ARGS = {"attention_backend": "FLASHINFER", "max_model_len": 4096, "gpu_memory_utilization": 0.5}
#: Log lines counted in each boot's log.
PATTERNS = {
    "autotune_contexts": "[Autotuner]: Autotuning process starts",
    "autotune_config_file_hits": "source=config file",
    "vllm_autotune_cache_file": "Using FlashInfer autotune cache file",
    "vllm_autotune_cache_loaded": "FlashInfer autotune cache loaded",
}


def boot(args: argparse.Namespace) -> None:
    """One engine boot in this process; one JSON line on stdout."""
    started_ns = time.time_ns()
    started = time.monotonic()
    from vllm import LLM, SamplingParams

    imported = time.monotonic()
    llm = LLM(model=args.model_dir, served_model_name=args.model, load_format="dummy", skip_tokenizer_init=True,
              enforce_eager=True, max_num_batched_tokens=args.max_num_batched_tokens, **ENGINE_ARGS)
    ready = time.monotonic()
    params = SamplingParams(max_tokens=8, detokenize=False, ignore_eos=True)
    llm.generate([{"prompt_token_ids": list(range(100, 116))}], params, use_tqdm=False)
    first = time.monotonic()
    from flashinfer.jit import env as jit_env

    cached_ops = Path(jit_env.FLASHINFER_WORKSPACE_DIR) / "cached_ops"
    built = sorted(p.stem for p in cached_ops.glob("*/*.so") if p.stat().st_mtime_ns >= started_ns)
    present = sorted(p.stem for p in cached_ops.glob("*/*.so"))
    # each module's .so alone and its whole directory (objects, build.ninja, logs): what a
    # .so-only install from FlashInfer's AOT directory would ship vs the run's tarball
    sizes = {p.stem: {"so_bytes": p.stat().st_size,
                      "dir_bytes": sum(f.stat().st_size for f in p.parent.rglob("*") if f.is_file())}
             for p in cached_ops.glob("*/*.so")}
    entries = {}  # vLLM's autotune file(s) as the boot left them: entries tuned locally would add to them
    for path in Path(os.environ["VLLM_CACHE_ROOT"]).rglob("autotune_configs*.json"):
        entries[str(path)] = sum(1 for key in json.loads(path.read_text()) if not key.startswith("_"))
    print(json.dumps({"import_s": round(imported - started, 2), "engine_start_to_ready_s": round(ready - imported, 2),
                      "first_request_s": round(first - ready, 3), "jit_built": built, "jit_present": present, "jit_sizes": sizes,
                      "aot_dir": str(jit_env.FLASHINFER_AOT_DIR),
                      "autotune_file_entries": entries,
                      "workspace": str(jit_env.FLASHINFER_WORKSPACE_DIR)}), flush=True)


def _boot(name: str, args: argparse.Namespace, work: Path, out: Path, **env: str) -> dict:
    workspace_base = work / "flashinfer-base"
    shutil.rmtree(workspace_base / ".cache", ignore_errors=True)  # an empty FlashInfer workspace
    cache_root = work / f"vllm-cache-{name}"
    shutil.rmtree(cache_root, ignore_errors=True)
    command = [sys.executable, str(Path(__file__).resolve()), "boot", "--model", args.model, "--model-dir",
               str(work / "model"), "--max-num-batched-tokens", str(args.max_num_batched_tokens)]
    environment = {**os.environ, "FLASHINFER_WORKSPACE_BASE": str(workspace_base), "VLLM_CACHE_ROOT": str(cache_root),
                   **env}
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=args.boot_timeout)
    wall = round(time.perf_counter() - started, 2)
    log = result.stdout + result.stderr
    (out / f"{name}.log").write_text(f"$ {' '.join(command)}\n(exit {result.returncode}, {wall} s)\n{log}")
    if result.returncode != 0:
        sys.exit(f"{name} boot failed ({result.returncode}); see {out / f'{name}.log'}\n{log[-3000:]}")
    measured = json.loads([line for line in result.stdout.splitlines() if line.startswith("{")][-1])
    measured.update({key: log.count(pattern) for key, pattern in PATTERNS.items()})
    measured["tunecache_lines"] = [line[line.index("tunecache:"):] for line in log.splitlines() if "tunecache:" in line]
    measured["process_wall_s"] = wall
    return measured


def _tune_and_warm(args: argparse.Namespace, work: Path, out: Path, results: dict) -> None:
    """Steps 2 and 3: serve, tune with vLLM's own warmup (from an empty workspace, so the
    tune's engine is a cold boot too), then the warm boot through the plugin."""
    import httpx

    log = out / "tunecache.log"
    shutil.rmtree(work / "keys", ignore_errors=True)
    _, generated = timed(cli("keys", "generate", "--out", str(work / "keys")), log)
    public = generated.stdout.splitlines()[0].strip()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(cli("serve", "--port", str(port), "--database", f"sqlite:///{work / 'tunecache.db'}"),
                              stdout=open(out / "serve.log", "w"), stderr=subprocess.STDOUT,
                              env={**os.environ, "TUNECACHE_JOB_WORKER": "off"})
    try:
        wait_healthy(url, server)
        if not args.keep_workspace:
            shutil.rmtree(work / "flashinfer-base" / ".cache", ignore_errors=True)
        tune_env = {"FLASHINFER_WORKSPACE_BASE": str(work / "flashinfer-base"), "VLLM_CACHE_ROOT": str(work / "vllm-cache-tune"),
                    "TUNECACHE_VLLM_ENGINE_ARGS": json.dumps(ENGINE_ARGS)}
        os.environ.update(tune_env)
        tune_s, tuned = timed(cli("tune", "--runner", "vllm", "--model", args.model, "--config", str(work / "model"),
                                  "--max-num-batched-tokens", str(args.max_num_batched_tokens), "--server", url,
                                  "--signing-key", str(work / "keys" / "signing.key"), "--work-dir", str(work / "tune"),
                                  "--timeout", str(args.boot_timeout)), log)
        for name in tune_env:
            os.environ.pop(name)
        run = httpx.get(f"{url}/v1/tunings", params={"limit": 1}).json()["items"][0]
        results["tune"] = {"command_s": round(tune_s, 2), "stdout": tuned.stdout.strip().splitlines()[-1:],
                           "run": run["id"], "entries": run.get("entries"), "summary": run.get("summary"),
                           "artifacts": [(a["kind"], a["name"], a["size_bytes"]) for a in run["artifacts"]]}
        results["warm"] = _boot("warm", args, work, out, TUNECACHE_URL=url, TUNECACHE_TRUSTED_KEYS=public)
    finally:
        server.terminate()
        server.wait(timeout=30)


def end_to_end(args: argparse.Namespace) -> None:
    """The steps of ``--steps`` (``tune,warm`` and ``cold`` fit one command each), results
    kept in the work directory across commands and written to ``--out``."""
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work).resolve()
    state = work / "vllm_e2e.json"
    results: dict = json.loads(state.read_text()) if state.is_file() else {}
    (work / "model").mkdir(parents=True, exist_ok=True)
    shutil.copy(Path(args.config) / "config.json", work / "model" / "config.json")
    os.environ.update({"TUNECACHE_DATA_DIR": str(work / "data"), "FLASHINFER_LOGGING_LEVEL": "INFO"})
    results.update({"model": args.model, "config": str(args.config), "max_num_batched_tokens": args.max_num_batched_tokens,
                    "engine_args": ENGINE_ARGS})
    steps = args.steps.split(",")
    if "tune" in steps:
        _tune_and_warm(args, work, out, results)
    if "cold" in steps:
        results["cold"] = _boot("cold", args, work, out)
    state.write_text(json.dumps(results, indent=2))
    (out / "vllm_e2e.json").write_text(json.dumps(results, indent=2))
    boots = [(name, results[name]) for name in ("cold", "warm") if name in results]
    rows = [("engine start to ready (`LLM(...)`)", "engine_start_to_ready_s", "{} s"),
            ("first request (16 tokens in, 8 out)", "first_request_s", "{} s"),
            ("FlashInfer JIT modules built", "jit_built", "{}"),
            ("FlashInfer autotune file entries after the boot", "autotune_file_entries", "{}"),
            ("autotune config-file hits (ops)", "autotune_config_file_hits", "{}"),
            ("process, start to exit", "process_wall_s", "{} s")]
    table = ["| boot | " + " | ".join(name for name, _ in boots) + " |", "| --- |" + " --- |" * len(boots)]
    for label, key, fmt in rows:
        shown = [fmt.format(len(b[key]) if isinstance(b[key], list) else
                            (sum(b[key].values()) if isinstance(b[key], dict) else b[key])) for _, b in boots]
        table.append(f"| {label} | " + " | ".join(shown) + " |")
    table.append("| tunecache lines | " + " | ".join("<br>".join(b["tunecache_lines"]) or "none" for _, b in boots) + " |")
    text = "\n".join(table) + "\n"
    if "tune" in results:
        text += f"\ntune: {results['tune']['stdout']} ({results['tune']['command_s']} s)\n"
    (out / "vllm_e2e.md").write_text(text)
    print(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command")
    boot_p = sub.add_parser("boot")
    for p in (parser, boot_p):
        p.add_argument("--model", default="meta-llama/Llama-3.1-8B")
        p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--config", default=str(ROOT / "tests" / "fixtures" / "models" / "llama-3.1-8b"))
    parser.add_argument("--out", default="results/gpu/vllm-e2e")
    parser.add_argument("--work", default="/tmp/tunecache-vllm-e2e")
    parser.add_argument("--boot-timeout", type=float, default=540)
    parser.add_argument("--steps", default="tune,warm", help="tune,warm (steps 1-2) and/or cold (step 3)")
    parser.add_argument("--keep-workspace", action="store_true",
                        help="tune with the JIT modules an earlier step built (else from an empty workspace)")
    boot_p.add_argument("--model-dir", required=True)
    args = parser.parse_args()
    (boot if args.command == "boot" else end_to_end)(args)


if __name__ == "__main__":
    main()
