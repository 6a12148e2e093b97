"""A stand-in `vllm` package with exactly the vLLM 0.33 names the plugin uses (and vLLM
0.25's single-file layout), worker processes that load the plugin as vLLM does, and a pod
of such workers started together. tests/e2e/test_vllm_plugin.py says what each step records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

from tests.support.paths import CUDNN_FILE


CONFIG_HASH = "ef" * 32

STAND_IN = {
    "stand_in_record.py": textwrap.dedent('''
        import json, sys
        def record(step, **seen):
            print(json.dumps({"step": step, **seen}), flush=True)
    '''),
    "vllm/__init__.py": "",
    "vllm/distributed/__init__.py": "",
    "vllm/distributed/parallel_state.py": textwrap.dedent('''
        import os
        class _Group:
            rank_in_group = int(os.environ.get("RANK", "0"))
            world_size = int(os.environ.get("WORLD_SIZE", "1"))
        def get_world_group():
            return _Group()
    '''),
    "vllm/model_executor/__init__.py": "",
    "vllm/model_executor/warmup/__init__.py": "",
    "vllm/model_executor/warmup/flashinfer_autotune_cache.py": textwrap.dedent('''
        import os
        from pathlib import Path
        def flashinfer_autotune_cache_hash(runner):
            return "ef" * 32
        if os.environ.get("STAND_IN_VLLM_LAYOUT") == "0.25":
            # vLLM 0.25: one autotune_configs.json, made ready (its directory) by the resolver
            def resolve_flashinfer_autotune_file(runner):
                directory = Path(os.environ["VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR"]) / flashinfer_autotune_cache_hash(runner)
                directory.mkdir(parents=True, exist_ok=True)
                return directory / "autotune_configs.json"
        else:
            def flashinfer_autotune_root():
                return Path(os.environ["VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR"])
            def flashinfer_autotune_filename(dp_rank, rank):
                return f"autotune_configs_dp{dp_rank}_rank{rank}.json"
    '''),
    "vllm/model_executor/warmup/deep_gemm_warmup.py": textwrap.dedent('''
        import os
        from stand_in_record import record
        def deep_gemm_warmup(model, max_tokens):
            record("deep_gemm_warmup", DG_JIT_CACHE_DIR=os.environ.get("DG_JIT_CACHE_DIR"))
    '''),
    "vllm/model_executor/warmup/kernel_warmup.py": textwrap.dedent('''
        import json, os
        from vllm.distributed.parallel_state import get_world_group
        from vllm.model_executor.warmup import flashinfer_autotune_cache as c
        from vllm.model_executor.warmup.deep_gemm_warmup import deep_gemm_warmup
        from stand_in_record import record
        def use_flashinfer_autotune_v2():
            return False
        def _loadable(directory, world_size):
            # vLLM takes the rank files only when every rank has one with the same _metadata and entry count
            seen = set()
            for rank in range(world_size):
                try:
                    doc = json.loads((directory / c.flashinfer_autotune_filename(0, rank)).read_bytes())
                except (OSError, ValueError):
                    return False
                seen.add((json.dumps(doc.get("_metadata"), sort_keys=True), len(doc)))
            return len(seen) == 1
        def _flashinfer_autotune_025(runner, group):
            # vLLM 0.25: a multi-process engine tunes every rank and reads no file
            if group.world_size > 1:
                return {"tunes_every_rank": True}
            path = c.resolve_flashinfer_autotune_file(runner)
            try:  # FlashInfer's load_configs takes a JSON object with its _metadata
                document = json.loads(path.read_bytes())
                loadable = isinstance(document, dict) and "_metadata" in document
            except (OSError, ValueError):
                loadable = False
            return {"file_present_at_warmup": path.is_file(), "loadable": loadable}
        def flashinfer_autotune(runner):
            group = get_world_group()
            if hasattr(c, "resolve_flashinfer_autotune_file"):
                record("flashinfer_autotune", **_flashinfer_autotune_025(runner, group))
                return
            directory = c.flashinfer_autotune_root() / c.flashinfer_autotune_cache_hash(runner)
            seen = {"file_present_at_warmup": (directory / c.flashinfer_autotune_filename(0, group.rank_in_group)).is_file(),
                    "loadable": _loadable(directory, group.world_size)}
            if os.environ.get("DG_JIT_CACHE_DIR"):
                seen["DG_JIT_CACHE_DIR"] = os.environ["DG_JIT_CACHE_DIR"]
            record("flashinfer_autotune", **seen)
        def kernel_warmup(worker):
            deep_gemm_warmup(worker.get_model(), worker.scheduler_config.max_num_batched_tokens)
            flashinfer_autotune(worker.model_runner)
    '''),
    "vllm/engine/__init__.py": "",
    "vllm/engine/arg_utils.py": textwrap.dedent('''
        class EngineArgs:  # the main process's config builder; the stand-in's workers never call it
            def create_engine_config(self, *args, **kwargs):
                raise NotImplementedError
    '''),
    "vllm/v1/__init__.py": "",
    "vllm/v1/worker/__init__.py": "",
    "vllm/v1/worker/gpu_worker.py": textwrap.dedent('''
        from vllm.model_executor.warmup.kernel_warmup import kernel_warmup
        class Worker:
            def __init__(self, model_runner):
                self.model_runner = model_runner
                self.scheduler_config = model_runner.vllm_config.scheduler_config
            def get_model(self):
                return object()
            def compile_or_warm_up_model(self):
                kernel_warmup(self)
    '''),
}

WORKER = textwrap.dedent('''
    import logging, os, sys, time
    from pathlib import Path
    from types import SimpleNamespace as NS
    if os.environ.get("STAND_IN_VLLM_LOGGING"):  # as vllm/logger.py configures it: the root logger has no handler
        import logging.config
        logging.config.dictConfig({"version": 1, "disable_existing_loggers": False,
                                   "formatters": {"vllm": {"format": "(EngineCore) %(message)s"}},
                                   "handlers": {"vllm": {"class": "logging.StreamHandler", "formatter": "vllm",
                                                         "level": "INFO", "stream": "ext://sys.stderr"}},
                                   "loggers": {"vllm": {"handlers": ["vllm"], "level": "INFO", "propagate": False}}})
    else:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    if os.environ.get("STAND_IN_IMPORT_WORKER_FIRST"):  # a vLLM that imported gpu_worker before the plugins
        import vllm.v1.worker.gpu_worker
    from importlib.metadata import entry_points
    [plugin] = [e for e in entry_points(group="vllm.general_plugins") if e.name == "tunecache"]
    plugin.load()()   # what vllm.plugins.load_general_plugins does in each worker (WorkerWrapperBase.init_worker)
    from vllm.v1.worker.gpu_worker import Worker   # imported after the plugins, as init_worker does
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    config = NS(model_config=NS(model=os.environ.get("STAND_IN_MODEL", "meta-llama/Llama-3.1-8B"),
                                served_model_name=os.environ.get("STAND_IN_SERVED_MODEL_NAME")),
                scheduler_config=NS(max_num_batched_tokens=8192),
                parallel_config=NS(tensor_parallel_size=world_size, data_parallel_rank=0))
    if os.environ.get("STAND_IN_INSTANCE_ID"):
        config.instance_id = os.environ["STAND_IN_INSTANCE_ID"]
    worker = Worker(NS(vllm_config=config))
    barrier = os.environ.get("STAND_IN_BARRIER")
    if barrier:  # every worker of the pod reaches its warmup at the same moment
        Path(f"{barrier}.ready{os.environ['RANK']}").touch()
        while not Path(barrier).exists():
            time.sleep(0.005)
    worker.compile_or_warm_up_model()
''')

POD = textwrap.dedent('''
    # Starts a pod's workers together, waits for them, and lists what they left in a directory.
    import hashlib, json, subprocess, sys, time
    from pathlib import Path
    spec = json.loads(Path(sys.argv[1]).read_text())
    out = Path(spec["out"])
    processes = []
    for rank, env in enumerate(spec["workers"]):
        with open(out / f"stdout{rank}", "w") as stdout, open(out / f"stderr{rank}", "w") as stderr:
            processes.append(subprocess.Popen([sys.executable, spec["script"]], env=env, stdout=stdout, stderr=stderr))
    barrier = Path(spec["barrier"])
    give_up = time.monotonic() + 60
    while time.monotonic() < give_up and not all(Path(f"{barrier}.ready{rank}").exists() for rank in range(len(processes))):
        time.sleep(0.005)
    barrier.touch()
    codes = [process.wait(timeout=180) for process in processes]
    files = {}
    if spec.get("list"):
        for path in sorted(Path(spec["list"]).rglob("*")):
            if path.is_file():
                files[str(path.relative_to(spec["list"]))] = hashlib.sha256(path.read_bytes()).hexdigest()
    (out / "pod.json").write_text(json.dumps({"codes": codes, "files": files}))
''')


def write_stand_in(tmp_path: Path) -> Path:
    stand_in = tmp_path / "stand_in"
    for name, text in STAND_IN.items():
        (stand_in / name).parent.mkdir(parents=True, exist_ok=True)
        (stand_in / name).write_text(text)
    (tmp_path / "worker.py").write_text(WORKER)
    return stand_in


def worker_env(tmp_path: Path, rank: int = 0, world_size: int = 1, instance: str | None = None, **env: str) -> dict:
    """A worker's environment: rank ``rank`` of ``world_size`` of the boot ``instance`` (a
    fresh one when ``None``: each call is then a boot of its own)."""
    stand_in = write_stand_in(tmp_path)
    base = {key: value for key, value in os.environ.items() if key != "DG_JIT_CACHE_DIR"}
    base.update({"PYTHONPATH": f"{stand_in}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
                 "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR": str(tmp_path / "vllm-autotune"),
                 "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache"),
                 "TUNECACHE_ENVIRONMENT_FILE": str(CUDNN_FILE), "TUNECACHE_ATTEMPTS": "1", "TUNECACHE_CONNECT_TIMEOUT": "2",
                 "RANK": str(rank), "WORLD_SIZE": str(world_size),
                 "STAND_IN_INSTANCE_ID": instance if instance is not None else uuid.uuid4().hex})
    return {**base, **env}


def parse_seen(stdout: str) -> dict:
    """``{step: what the stand-in's step saw}`` from a worker's stdout."""
    seen = {}
    for line in stdout.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            seen[record.pop("step")] = record
    return seen


def tunecache_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if line.startswith("tunecache:")]


def run_worker(tmp_path, rank=0, world_size=1, instance=None, **env):
    """One worker process to its end: (what the stand-in's steps saw, its log)."""
    result = subprocess.run([sys.executable, str(tmp_path / "worker.py")], capture_output=True, text=True, timeout=120,
                            env=worker_env(tmp_path, rank, world_size, instance, **env))
    assert result.returncode == 0, result.stderr  # never raises into vLLM
    return parse_seen(result.stdout), result.stderr


def run_pod(tmp_path, world_size, instance=None, prefix=(), list_dir=None, **env):
    """``world_size`` workers of one boot, started together behind a barrier: a list of
    (seen, log) by rank, and {path: sha256} of the files under ``list_dir`` when they ended.
    ``prefix``: a command the pod runs under (e.g. in a mount namespace with a small tmpfs)."""
    instance = instance or uuid.uuid4().hex
    out = tmp_path / f"pod-{instance}"
    out.mkdir()
    spec = {"script": str(tmp_path / "worker.py"), "out": str(out), "barrier": str(out / "barrier"),
            "list": str(list_dir) if list_dir else None,
            "workers": [worker_env(tmp_path, rank, world_size, instance, STAND_IN_BARRIER=str(out / "barrier"), **env)
                        for rank in range(world_size)]}
    (out / "spec.json").write_text(json.dumps(spec))
    (tmp_path / "pod.py").write_text(POD)
    result = subprocess.run([*prefix, sys.executable, str(tmp_path / "pod.py"), str(out / "spec.json")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    pod = json.loads((out / "pod.json").read_text())
    logs = [(out / f"stderr{rank}").read_text() for rank in range(world_size)]
    assert pod["codes"] == [0] * world_size, logs  # never raises into vLLM
    return [(parse_seen((out / f"stdout{rank}").read_text()), logs[rank]) for rank in range(world_size)], pod["files"]


def rank_file(tmp_path, rank):
    return tmp_path / "vllm-autotune" / CONFIG_HASH / f"autotune_configs_dp0_rank{rank}.json"
