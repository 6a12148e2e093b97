#!/usr/bin/env python3
"""The whole warm state on a GPU node with real vLLM: cold, tunecache-warm and local-warm
boots of one model and attention backend, each with what it still compiled.

Run on the H200 machine (docs/gpu.md, "Real vLLM 0.25"), vLLM 0.25.0, FlashInfer 0.6.13 and
tunecache importable (``scripts/gpu_vllm_bundle.sh``), one command per model:

    python3 scripts/gpu_warm_state.py --out results/gpu/DIR [--attention FLASHINFER]
        [--config tests/fixtures/models/llama-3.1-8b-fp8-block --model NAME]

1. ``cold``: ``tunecache tune --warmup vllm`` (a fresh service on SQLite, a node signing
   key): the tuner's vLLM is a boot with every cache empty (vLLM's default torch.compile
   and CUDA graphs, the fleet's engine arguments through ``TUNECACHE_VLLM_ENGINE_ARGS``);
   its time from ``LLM(...)`` to ready is the tuner's own log line, its compile counts come
   from its log and from what its caches hold afterwards.
2. ``tunecache_warm``: a new process with an empty ``VLLM_CACHE_ROOT``, Triton cache,
   FlashInfer workspace and DeepGEMM directory, ``TUNECACHE_URL`` set and the node's key
   trusted: the plugin installs the run before vLLM reads anything.
3. ``local_warm``: the same process again over the directories the tunecache-warm boot left
   (every local cache warm).

``--pairs N`` repeats steps 2 and 3 N times, each pair from new empty directories, so that
the tunecache-warm / local-warm ratio comes with its spread (each boot records its ``pair``).

Each boot counts what it compiled (``compiled``): FlashInfer JIT modules built (``.so``
written in the workspace during the boot), Inductor graphs compiled (vLLM's "Compiling a
graph" lines; loaded ones are counted apart), AOT compiles (vLLM's "saved AOT compiled
function"), Triton kernels compiled (``.cubin`` files written in the Triton cache and the
compile cache during the boot), DeepGEMM kernels built (``kernel.*`` directories written),
model inspections (a ``modelinfos`` file written), FlashInfer autotune runs ("Autotuning
process starts"). Appends the boots to ``--out``/warm_state.json (the list the issue asks
for) and writes every log.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_e2e import cli, timed, wait_healthy  # noqa: E402

LOADED = {
    "inductor_graphs_loaded": r"Directly load the compiled graph\(s\)",
    "aot_loaded": r"Directly load AOT compilation",
}
COMPILED_LINES = {
    "inductor_graphs": r"Compiling a graph for compile range",
    "aot_compiles": r"saved AOT compiled function",
    "autotune_runs": r"Autotuning process starts",
}


def boot(args: argparse.Namespace) -> None:
    """One engine boot in this process; one JSON line on stdout."""
    started = time.monotonic()
    from vllm import LLM, SamplingParams

    imported = time.monotonic()
    kwargs = dict(model=args.model_dir, served_model_name=args.model, load_format="dummy", skip_tokenizer_init=True,
                  max_num_batched_tokens=args.max_num_batched_tokens, **json.loads(args.engine_args))
    llm = LLM(**kwargs)
    ready = time.monotonic()
    params = SamplingParams(max_tokens=8, detokenize=False, ignore_eos=True)
    llm.generate([{"prompt_token_ids": list(range(100, 116))}], params, use_tqdm=False)
    first = time.monotonic()
    print(json.dumps({"import_s": round(imported - started, 2), "ready_s": round(ready - imported, 2),
                      "first_request_s": round(first - ready, 3)}), flush=True)


def _written_since(root: Path, pattern: str, since_ns: int, dirs: bool = False) -> int:
    if not root.exists():
        return 0
    return sum(1 for p in root.rglob(pattern) if (p.is_dir() if dirs else p.is_file()) and p.stat().st_mtime_ns >= since_ns)


def compiled_counts(log: str, dirs: dict[str, Path], since_ns: int) -> tuple[dict[str, int], dict[str, int]]:
    """What a boot compiled (and what it loaded), from its log and the files it wrote."""
    compiled = {name: len(re.findall(pattern, log)) for name, pattern in COMPILED_LINES.items()}
    compiled["flashinfer_jit_modules"] = _written_since(dirs["ws"] / ".cache" / "flashinfer", "*.so", since_ns)
    compiled["triton_kernels"] = (_written_since(dirs["triton"], "*.cubin", since_ns)
                                  + _written_since(dirs["vc"] / "torch_compile_cache", "*.cubin", since_ns))
    compiled["deep_gemm_kernels"] = _written_since(dirs["dg"] / "cache", "kernel.*", since_ns, dirs=True)
    compiled["model_inspections"] = _written_since(dirs["vc"] / "modelinfos", "*.json", since_ns)
    loaded = {name: len(re.findall(pattern, log)) for name, pattern in LOADED.items()}
    return compiled, loaded


def _text(output: bytes | str | None) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else (output or "")


def _dirs(base: Path) -> dict[str, Path]:
    return {"ws": base / "flashinfer-base", "vc": base / "vllm-cache", "triton": base / "triton",
            "dg": base / "deep-gemm", "inductor": base / "inductor"}


def _environment(dirs: dict[str, Path]) -> dict[str, str]:
    return {"FLASHINFER_WORKSPACE_BASE": str(dirs["ws"]), "VLLM_CACHE_ROOT": str(dirs["vc"]),
            "TRITON_CACHE_DIR": str(dirs["triton"]), "DG_JIT_CACHE_DIR": str(dirs["dg"]),
            "TORCHINDUCTOR_CACHE_DIR": str(dirs["inductor"])}


def _boot(name: str, args: argparse.Namespace, dirs: dict[str, Path], out: Path, **env: str) -> dict:
    command = [sys.executable, str(Path(__file__).resolve()), "boot", "--model", args.model, "--model-dir",
               str(Path(args.work) / "model"), "--max-num-batched-tokens", str(args.max_num_batched_tokens),
               "--engine-args", json.dumps(engine_args(args))]
    since = time.time_ns()
    started = time.perf_counter()
    try:
        result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **_environment(dirs), **env},
                                timeout=args.boot_timeout)
    except subprocess.TimeoutExpired as exc:
        result = subprocess.CompletedProcess(command, 124, _text(exc.stdout), _text(exc.stderr))
    wall = round(time.perf_counter() - started, 2)
    log = result.stdout + result.stderr
    (out / f"{args.name}-{name}.log").write_text(f"$ {' '.join(command)}\n(exit {result.returncode}, {wall} s)\n{log}")
    if result.returncode != 0:  # recorded, and the next boot still runs: one call is one whole experiment
        return {"model": args.model, "attention": args.attention or "default", "boot": name, "ready_s": None,
                "failed": result.returncode, "process_wall_s": wall, "log_tail": log[-3000:]}
    measured = json.loads([line for line in result.stdout.splitlines() if line.startswith("{")][-1])
    compiled, loaded = compiled_counts(log, dirs, since)
    return {"model": args.model, "attention": args.attention or "default", "boot": name,
            "ready_s": measured["ready_s"], "compiled": compiled, "loaded": loaded,
            "import_s": measured["import_s"], "first_request_s": measured["first_request_s"], "process_wall_s": wall,
            "spawned": "We must use the `spawn`" in log,
            "tunecache_lines": [line[line.index("tunecache:"):] for line in log.splitlines() if "tunecache:" in line]}


def engine_args(args: argparse.Namespace) -> dict:
    extra = {"max_model_len": 4096, "gpu_memory_utilization": 0.5}
    if args.attention:
        extra["attention_backend"] = args.attention
    if args.quantization:
        extra["quantization"] = args.quantization
    for item in args.engine_arg or ():
        name, _, value = item.partition("=")
        extra[name] = json.loads(value)
    return extra


def run(args: argparse.Namespace) -> None:
    import httpx

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work).resolve()
    shutil.rmtree(work, ignore_errors=True)
    (work / "model").mkdir(parents=True)
    shutil.copy(Path(args.config) / "config.json", work / "model" / "config.json")
    os.environ.update({"TUNECACHE_DATA_DIR": str(work / "data"), "FLASHINFER_LOGGING_LEVEL": "INFO"})
    log = out / f"{args.name}-tunecache.log"
    _, generated = timed(cli("keys", "generate", "--out", str(work / "keys")), log)
    public = generated.stdout.splitlines()[0].strip()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(cli("serve", "--port", str(port), "--database", f"sqlite:///{work / 'tunecache.db'}"),
                              stdout=open(out / f"{args.name}-serve.log", "w"), stderr=subprocess.STDOUT,
                              env={**os.environ, "TUNECACHE_JOB_WORKER": "off"})
    boots = []
    try:
        wait_healthy(url, server)
        node = _dirs(work / "node")  # the tuner's caches: vLLM's own and the workspace, all empty
        tune_env = {**_environment(node), "TUNECACHE_VLLM_ENGINE_ARGS": json.dumps(
            {k: v for k, v in engine_args(args).items() if k != "quantization"})}
        since = time.time_ns()
        command = cli("tune", "--warmup", "vllm", "--model", args.model, "--config", str(work / "model"),
                      "--max-num-batched-tokens", str(args.max_num_batched_tokens), "--server", url,
                      "--signing-key", str(work / "keys" / "signing.key"), "--work-dir", str(work / "tune"),
                      "--timeout", str(args.boot_timeout), *([] if getattr(args, "verify", True) else ["--no-verify"]))
        if args.quantization:
            command += ["--quantization", args.quantization]
        saved = dict(os.environ)
        os.environ.update(tune_env)
        try:
            tune_s, tuned = timed(command, log)
        finally:
            os.environ.clear()
            os.environ.update(saved)
        tuner_log = "\n".join(p.read_text(errors="replace") for p in (work / "tune").rglob("*.log")) + tuned.stderr
        (out / f"{args.name}-cold.log").write_text(tuner_log)
        ready = re.findall(r"vLLM engine built, kernel_warmup done \(([\d.]+) s\)", tuner_log + tuned.stdout)
        scratch = next((p for p in (work / "tune").rglob("vllm-scratch") if p.is_dir()), None)
        cold_dirs = {**node, **({"vc": scratch / "vllm-cache", "triton": scratch / "triton", "dg": scratch / "deep_gemm"}
                                if scratch else {})}
        compiled, loaded = compiled_counts(tuner_log + tuned.stdout, cold_dirs, since)
        run_doc = httpx.get(f"{url}/v1/tunings", params={"limit": 1}).json()["items"][0]
        boots.append({"model": args.model, "attention": args.attention or "default", "boot": "cold",
                      "ready_s": float(ready[-1]) if ready else None, "compiled": compiled, "loaded": loaded,
                      "tune_command_s": round(tune_s, 2), "run": run_doc["id"],
                      "artifacts": [(a["kind"], a["name"], a["size_bytes"]) for a in run_doc["artifacts"]],
                      "vllm_compile": run_doc["summary"].get("vllm_compile", {}).get("names_checked"),
                      # tune's own verification boot of the stored run (empty caches, through the plugin)
                      "verification": run_doc.get("verification")})
        (out / f"{args.name}-run.json").write_text(json.dumps(run_doc, indent=1))
        for pair in range(1, args.pairs + 1):  # each pair starts from empty pod caches
            pod = _dirs(work / f"pod-{pair}")
            for directory in pod.values():
                directory.mkdir(parents=True)
            shutil.rmtree(node["ws"] / ".cache", ignore_errors=True)  # the pod's workspace is empty (same path layout)
            suffix = "" if pair == 1 else f"-{pair}"
            for name, env in (("tunecache_warm", {"TUNECACHE_URL": url, "TUNECACHE_TRUSTED_KEYS": public}),
                              ("local_warm", {})):
                boots.append({**_boot(name + suffix, args, {**pod, "ws": node["ws"]}, out, **env),
                              "boot": name, "pair": pair})
    finally:
        server.terminate()
        server.wait(timeout=30)
        state = out / "warm_state.json"
        previous = json.loads(state.read_text()) if state.is_file() else []
        state.write_text(json.dumps(previous + boots, indent=1))
        for b in boots:
            print(json.dumps({k: b.get(k) for k in ("boot", "pair", "ready_s", "compiled", "loaded", "tunecache_lines",
                                                   "verification")}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command")
    boot_p = sub.add_parser("boot")
    for p in (parser, boot_p):
        p.add_argument("--model", default="meta-llama/Llama-3.1-8B")
        p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    boot_p.add_argument("--model-dir", required=True)
    boot_p.add_argument("--engine-args", default="{}")
    parser.add_argument("--config", default=str(ROOT / "tests" / "fixtures" / "models" / "llama-3.1-8b"))
    parser.add_argument("--attention", default=None, help="vLLM's attention_backend (default: vLLM's choice)")
    parser.add_argument("--quantization", default=None)
    parser.add_argument("--name", default="llama-default")
    parser.add_argument("--out", default="results/gpu/warm-state")
    parser.add_argument("--work", default="/tmp/tunecache-warm-state")
    parser.add_argument("--boot-timeout", type=float, default=540)
    parser.add_argument("--engine-arg", action="append", metavar="NAME=JSON",
                        help="one more engine argument of the fleet (tuner and pods alike), e.g. "
                             "compilation_config='{\"max_cudagraph_capture_size\": 64}'")
    parser.add_argument("--pairs", type=int, default=1,
                        help="tunecache-warm + local-warm pairs, each from empty pod caches (the ratio's spread)")
    args = parser.parse_args()
    (boot if args.command == "boot" else run)(args)


if __name__ == "__main__":
    main()
