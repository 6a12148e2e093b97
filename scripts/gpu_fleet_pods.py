#!/usr/bin/env python3
"""Pods unlike the tuning node, booted from one stored run with real vLLM: each pod setup's
tunecache-warm boot beside its own local-warm boot, with what each still compiled.

Run on the H200 machine with the bundle of ``scripts/gpu_vllm_bundle.sh`` unpacked in
``/tmp/site`` (docs/gpu.md, "Real vLLM 0.25"), in two steps that may be separate GPU commands
on one warm machine (the work directory, with the service's SQLite database, stays in /tmp):

    python3 scripts/gpu_fleet_pods.py tune --out OUT            # cold: tunecache tune --warmup vllm
    python3 scripts/gpu_fleet_pods.py pods --out OUT --setups same_as_tuner,other_home --pair 1

``tune`` is ``scripts/gpu_warm_state.py`` with no pairs (a fresh service on SQLite, a node
signing key, the tuner's vLLM with every cache empty: the ``cold`` boot). ``pods`` starts the
service again on that database and boots, for each setup, a new process through the plugin
(``tunecache_warm``: every cache of the pod empty) and then the same process again over what
that boot left (``local_warm``: the pod's floor), through the plugin as the pod is deployed
(``--local-warm plugin``, the default; ``none``: without tunecache, where FlashInfer's ninja
rebuilds a module whose ``build.ninja`` names the tuner's paths, as the 2026-12-03 run
showed). Each pod reads the service's token from a file of its own (``TUNECACHE_TOKEN_FILE``),
not the service's data directory. The setups (every one from empty caches):

* ``same_as_tuner``: the tuner's HOME and FlashInfer workspace path, its own vLLM, Triton,
  Inductor and DeepGEMM directories (the lab case);
* ``other_home``: another HOME (and user name) and nothing else set: every cache where vLLM,
  FlashInfer, Triton and Inductor put it by default under that HOME;
* ``non_root_user``: the same as a user with no account (uid and gid 12345, as OpenShift's
  random UIDs), HOME a directory of its own;
* ``other_cache_dirs``: the tuner's HOME, every cache directory set elsewhere
  (``FLASHINFER_WORKSPACE_BASE``, ``VLLM_CACHE_ROOT``, ``TRITON_CACHE_DIR``,
  ``TORCHINDUCTOR_CACHE_DIR``, ``DG_JIT_CACHE_DIR``);
* ``other_prefix``: the Python packages (vLLM, FlashInfer, tunecache, ...) copied under another
  prefix, and only that prefix on ``PYTHONPATH``, with other cache directories;
* ``engine_variant``: the tuner's HOME, other cache directories, and another engine variant:
  ``max_model_len`` 8192 where the tuner's engine has 4096. Its variant is tuned through the
  service first: ``tune`` queues ``tunecache retune --warmup vllm --engine-args
  '{"max_model_len": 8192}'``, which the service's own job worker on this GPU runs.

Each boot is one line of ``OUT/fleet_pods.json`` (``model``, ``attention``, ``pod``, ``boot``,
``pair``, ``ready_s``, ``compiled``: kind -> count, plus what tunecache logged); logs beside it.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_warm_state  # noqa: E402
from gpu_e2e import cli, wait_healthy  # noqa: E402

SETUPS = ("engine_variant", "other_home", "non_root_user", "other_prefix", "other_cache_dirs", "same_as_tuner")
#: The engine variant's own engine arguments (over the fleet's, gpu_warm_state.engine_args).
VARIANT_ARGS = {"max_model_len": 8192}
CACHE_VARIABLES = ("FLASHINFER_WORKSPACE_BASE", "VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR",
                   "DG_JIT_CACHE_DIR", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "VLLM_CONFIG_ROOT")
POD_UID = 12345


def pod_setup(setup: str, base: Path, work: Path) -> tuple[dict[str, str | None], dict[str, Path], int | None]:
    """The environment of a pod of ``setup`` (``None``: unset), the directories its caches are
    in (for counting what it compiled) and the uid it runs as (``None``: this one's)."""
    node = gpu_warm_state._dirs(work / "node")
    own = {"ws": base / "flashinfer-base", "vc": base / "vllm-cache", "triton": base / "triton",
           "dg": base / "deep-gemm", "inductor": base / "inductor"}
    set_all = {"FLASHINFER_WORKSPACE_BASE": str(own["ws"]), "VLLM_CACHE_ROOT": str(own["vc"]),
               "TRITON_CACHE_DIR": str(own["triton"]), "TORCHINDUCTOR_CACHE_DIR": str(own["inductor"]),
               "DG_JIT_CACHE_DIR": str(own["dg"])}
    if setup == "same_as_tuner":
        shutil.rmtree(node["ws"] / ".cache", ignore_errors=True)  # the tuner's workspace path, empty
        return {**set_all, "FLASHINFER_WORKSPACE_BASE": str(node["ws"])}, {**own, "ws": node["ws"]}, None
    if setup in ("other_home", "non_root_user"):
        home = base / "home"
        home.mkdir(exist_ok=True)
        user = f"pod{base.name.replace('-', '')}"
        env: dict[str, str | None] = {name: None for name in CACHE_VARIABLES}
        env.update(HOME=str(home), USER=user, LOGNAME=user)
        dirs = {"ws": home, "vc": home / ".cache" / "vllm", "triton": home / ".triton" / "cache",
                "dg": home / ".cache" / "vllm" / "deep_gemm", "inductor": Path("/tmp") / f"torchinductor_{user}"}
        return env, dirs, (POD_UID if setup == "non_root_user" else None)
    if setup in ("other_cache_dirs", "engine_variant"):
        return dict(set_all), own, None
    if setup == "other_prefix":
        prefix = work / "other-prefix" / "lib" / "python3.12" / "site-packages"
        if not prefix.is_dir():
            shutil.copytree("/tmp/site", prefix, symlinks=True)
        path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != Path("/tmp/site")]
        return {**set_all, "PYTHONPATH": os.pathsep.join([str(prefix), *path])}, own, None
    raise SystemExit(f"unknown setup {setup!r} (one of {', '.join(SETUPS)})")


def pod_boot(name: str, args: argparse.Namespace, env: dict[str, str | None], dirs: dict[str, Path],
             uid: int | None, out: Path, variant_args: dict | None = None) -> dict:
    """One boot of ``gpu_warm_state.py boot`` in a new process with ``env``, as ``uid``, with the
    fleet's engine arguments (and ``variant_args`` over them)."""
    script = Path(args.work) / "scripts" / "gpu_warm_state.py"  # readable by a pod of another uid
    command = [sys.executable, str(script), "boot", "--model", args.model,
               "--model-dir", str(Path(args.work) / "model"), "--max-num-batched-tokens", str(args.max_num_batched_tokens),
               "--engine-args", json.dumps({**gpu_warm_state.engine_args(args), **(variant_args or {})})]
    full = {k: v for k, v in os.environ.items() if k not in env}
    full.update({k: v for k, v in env.items() if v is not None})
    extra = {"user": uid, "group": uid, "extra_groups": []} if uid is not None else {}
    since = time.time_ns()
    started = time.perf_counter()
    try:
        result = subprocess.run(command, capture_output=True, text=True, env=full, timeout=args.boot_timeout,
                                cwd="/tmp", **extra)
    except subprocess.TimeoutExpired as exc:
        result = subprocess.CompletedProcess(command, 124, gpu_warm_state._text(exc.stdout), gpu_warm_state._text(exc.stderr))
    wall = round(time.perf_counter() - started, 2)
    log = result.stdout + result.stderr
    (out / f"{name}.log").write_text(f"$ {' '.join(command)}\n(env {json.dumps(env)}, uid {uid}; exit "
                                     f"{result.returncode}, {wall} s)\n{log}")
    lines = [line[line.index("tunecache:"):][:600] for line in log.splitlines() if "tunecache:" in line]
    if result.returncode != 0:
        return {"ready_s": None, "failed": result.returncode, "process_wall_s": wall, "log_tail": log[-3000:],
                "tunecache_lines": lines}
    measured = json.loads([line for line in result.stdout.splitlines() if line.startswith("{")][-1])
    compiled, loaded = gpu_warm_state.compiled_counts(log, dirs, since)
    compiled["triton_kernels"] += gpu_warm_state._written_since(dirs["inductor"], "*.cubin", since)
    return {"ready_s": measured["ready_s"], "compiled": compiled, "loaded": loaded, "import_s": measured["import_s"],
            "first_request_s": measured["first_request_s"], "process_wall_s": wall,
            "spawned": "We must use the `spawn`" in log, "tunecache_lines": lines}


def pods(args: argparse.Namespace) -> None:
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work).resolve()
    public = (work / "keys" / "signing.pub").read_text().strip()
    # the tuner's work directory goes, as on another machine: vLLM's compile index names the
    # tuner's paths, and a pod that could still read them there would prove nothing (the run of
    # 2026-12-03 read them); its logs are in OUT already
    shutil.rmtree(work / "tune", ignore_errors=True)
    shutil.rmtree(work / "scripts", ignore_errors=True)
    shutil.copytree(Path(__file__).resolve().parent, work / "scripts")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    os.environ.update({"TUNECACHE_DATA_DIR": str(work / "data"), "FLASHINFER_LOGGING_LEVEL": "INFO"})
    env = {**os.environ, "TUNECACHE_JOB_WORKER": "off"}
    server = subprocess.Popen(cli("serve", "--port", str(port), "--database",
                                  f"sqlite:///{work / 'tunecache.db'}"),
                              stdout=open(out / f"serve-pods-{args.pair}.log", "a"), stderr=subprocess.STDOUT, env=env)
    boots: list[dict] = []
    try:
        wait_healthy(url, server)
        for setup in args.setups.split(","):
            base = work / "pods" / f"{setup}-{args.pair}"
            shutil.rmtree(base, ignore_errors=True)
            base.mkdir(parents=True)
            pod_env, dirs, uid = pod_setup(setup, base, work)
            if uid is not None:
                for path in [base, *base.rglob("*")]:
                    os.chown(path, uid, uid)
            token = base / "token"  # the pod's own copy, readable by its user (the service's file is 0600)
            token.write_text((work / "data" / "admin.token").read_text())
            os.chmod(token, 0o644)
            tunecache = {"TUNECACHE_URL": url, "TUNECACHE_TRUSTED_KEYS": public, "TUNECACHE_TOKEN_FILE": str(token),
                         "TUNECACHE_DATA_DIR": None}
            local = tunecache if args.local_warm == "plugin" else {"TUNECACHE_URL": None, "TUNECACHE_DATA_DIR": None}
            for boot, extra in (("tunecache_warm", tunecache), ("local_warm", local)):
                measured = pod_boot(f"{setup}-{boot}-{args.pair}", args, {**pod_env, **extra}, dirs, uid, out,
                                    VARIANT_ARGS if setup == "engine_variant" else None)
                boots.append({"model": args.model, "attention": args.attention or "default", "pod": setup,
                              "boot": boot, "pair": args.pair, "local_warm": args.local_warm, **measured})
                state = out / "fleet_pods.json"  # each boot as it ends: a command can end at any moment
                previous = json.loads(state.read_text()) if state.is_file() else []
                state.write_text(json.dumps(previous + [boots[-1]], indent=1))
                print(json.dumps({k: boots[-1].get(k) for k in ("pod", "boot", "pair", "ready_s", "compiled",
                                                                "failed")}), flush=True)
    finally:
        server.terminate()
        server.wait(timeout=30)


def tune(args: argparse.Namespace) -> None:
    """The cold boot: gpu_warm_state.py's tune with no pairs (``--verify``: with its verification
    boot); its cold boot goes to fleet_pods.json too. Then the engine variant's tuning through
    the service (:func:`tune_variant`)."""
    args.pairs, args.name = 0, "tune"
    gpu_warm_state.run(args)
    out = Path(args.out).resolve()
    [cold] = [b for b in json.loads((out / "warm_state.json").read_text()) if b["boot"] == "cold"][-1:]
    state = out / "fleet_pods.json"
    previous = json.loads(state.read_text()) if state.is_file() else []
    state.write_text(json.dumps(previous + [{**cold, "pod": "tuner", "pair": None}], indent=1))
    if "engine_variant" in args.setups.split(","):
        variant = tune_variant(args, out)
        previous = json.loads(state.read_text())
        state.write_text(json.dumps(previous + [variant], indent=1))
        print(json.dumps(variant), flush=True)


def tune_variant(args: argparse.Namespace, out: Path) -> dict:
    """The engine variant's tuning through the service: ``tunecache serve`` with its job worker
    on this GPU (the node's signing key and the fleet's engine arguments, as the tune had), then
    ``tunecache retune --warmup vllm --engine-args`` for the key, followed to its end."""
    import httpx

    work = Path(args.work).resolve()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    node = gpu_warm_state._dirs(work / "node")
    env = {**os.environ, **gpu_warm_state._environment(node), "TUNECACHE_DATA_DIR": str(work / "data"),
           "TUNECACHE_JOB_WORKER": "on", "TUNECACHE_SIGNING_KEY": str(work / "keys" / "signing.key"),
           "TUNECACHE_VLLM_ENGINE_ARGS": json.dumps({k: v for k, v in gpu_warm_state.engine_args(args).items()
                                                     if k != "quantization"}),
           "TUNECACHE_VERIFY_URL": url if args.verify else "off", "FLASHINFER_LOGGING_LEVEL": "INFO"}
    server = subprocess.Popen(cli("serve", "--port", str(port), "--database", f"sqlite:///{work / 'tunecache.db'}"),
                              stdout=open(out / "serve-variant.log", "w"), stderr=subprocess.STDOUT, env=env)
    command = cli("retune", "--server", url, "--model", args.model, "--max-num-batched-tokens",
                  str(args.max_num_batched_tokens), "--gpu-name", "NVIDIA H200", "--config", str(work / "model"),
                  "--warmup", "vllm", "--engine-args", json.dumps(VARIANT_ARGS), "--wait", "--wait-timeout",
                  str(args.boot_timeout + 240), "--poll", "1")
    started = time.perf_counter()
    try:
        wait_healthy(url, server)
        retune = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "TUNECACHE_DATA_DIR": str(work / "data")})
        seconds = round(time.perf_counter() - started, 2)
        (out / "tune-variant.log").write_text(f"$ {' '.join(command)}\n(exit {retune.returncode}, {seconds} s)\n"
                                              f"{retune.stdout}{retune.stderr}")
        jobs = httpx.get(f"{url}/v1/tuning-jobs").json()["items"]
        job = jobs[0] if jobs else {}
        if args.verify and job.get("run_id"):  # the verification boot runs after the job finished
            for _ in range(int(args.boot_timeout)):
                if httpx.get(f"{url}/v1/tunings/{job['run_id']}").json().get("verification"):
                    break
                time.sleep(1)
        run = httpx.get(f"{url}/v1/tunings/{job['run_id']}").json() if job.get("run_id") else {}
    finally:
        server.terminate()
        server.wait(timeout=60)
    (out / "tune-variant-run.json").write_text(json.dumps(run, indent=1))
    return {"model": args.model, "attention": args.attention or "default", "pod": "engine_variant_tuner",
            "boot": "cold", "pair": None, "engine_args": VARIANT_ARGS, "retune_exit": retune.returncode,
            "job_s": job.get("duration_s"), "retune_command_s": seconds, "job_status": job.get("status"),
            "job_error": job.get("error"), "run": run.get("id"), "variant": run.get("variant"),
            "is_current": run.get("is_current"), "verification": run.get("verification"),
            "artifacts": [(a["kind"], a["name"], a["size_bytes"]) for a in run.get("artifacts", [])]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=("tune", "pods"))
    parser.add_argument("--out", required=True)
    parser.add_argument("--work", default="/tmp/tunecache-fleet-pods")
    parser.add_argument("--model", default="meta-llama/Llama-3.1-8B")
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--config", default=str(gpu_warm_state.ROOT / "tests" / "fixtures" / "models" / "llama-3.1-8b"))
    parser.add_argument("--attention", default=None)
    parser.add_argument("--quantization", default=None)
    parser.add_argument("--engine-arg", action="append", metavar="NAME=JSON")
    parser.add_argument("--boot-timeout", type=float, default=300)
    parser.add_argument("--setups", default=",".join(SETUPS))
    parser.add_argument("--pair", type=int, default=1)
    parser.add_argument("--local-warm", choices=("plugin", "none"), default="plugin",
                        help="the local-warm boot through the plugin (the pod as deployed) or without tunecache")
    parser.add_argument("--verify", action=argparse.BooleanOptionalAction, default=False,
                        help="tune: the runs' verification boots too (about 40 s each)")
    args = parser.parse_args()
    (tune if args.step == "tune" else pods)(args)


if __name__ == "__main__":
    main()
