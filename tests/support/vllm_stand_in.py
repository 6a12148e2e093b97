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

from tests.support import preloaded
from tests.support.paths import CUDNN_FILE


CONFIG_HASH = "ef" * 32

STAND_IN = {
    "stand_in_record.py": textwrap.dedent('''
        import json, sys
        def record(step, **seen):
            print(json.dumps({"step": step, **seen}), flush=True)
    '''),
    "vllm/__init__.py": textwrap.dedent('''
        import os as _os
        __version__ = _os.environ.get("STAND_IN_VLLM_VERSION", "0.25.0")
        class LLM:
            # the offline engine in one process (VLLM_ENABLE_V1_MULTIPROCESSING=0): plugins
            # loaded, the engine's config made, then its worker's profiling run and warmup
            def __init__(self, model, served_model_name=None, max_num_batched_tokens=None, tensor_parallel_size=1,
                         **others):
                import os
                from importlib.metadata import entry_points
                from types import SimpleNamespace as NS
                [plugin] = [e for e in entry_points(group="vllm.general_plugins") if e.name == "tunecache"]
                plugin.load()()
                from vllm.engine.arg_utils import EngineArgs
                config = EngineArgs(model, served_model_name=served_model_name, max_num_batched_tokens=max_num_batched_tokens,
                                    tensor_parallel_size=tensor_parallel_size).create_engine_config()
                config.instance_id = os.environ.get("STAND_IN_INSTANCE_ID", "llm")
                if os.environ.get("STAND_IN_BLOCK_SIZE"):
                    config.cache_config.block_size = int(os.environ["STAND_IN_BLOCK_SIZE"])
                from vllm.v1.worker.gpu_worker import Worker
                worker = Worker(NS(vllm_config=config))
                worker.determine_available_memory()
                worker.compile_or_warm_up_model()
    '''),
    "vllm/envs.py": textwrap.dedent('''
        # vLLM's compile factors: every known vLLM variable but the ignored ones (here two)
        import os
        VLLM_CACHE_ROOT = os.environ.get("VLLM_CACHE_ROOT", os.path.expanduser("~/.cache/vllm"))
        def compile_factors():
            factors = {name: os.environ.get(name) for name in ("VLLM_USE_AOT_COMPILE", "VLLM_PP_LAYER_PARTITION")}
            # hashed by vLLM 0.25 though only a place: its default derives from HOME
            factors["VLLM_CONFIG_ROOT"] = os.path.expanduser(os.environ.get("VLLM_CONFIG_ROOT", "~/.config/vllm"))
            return factors
    '''),
    "vllm/config/__init__.py": "",
    "vllm/config/utils.py": textwrap.dedent('''
        import hashlib, json
        def hash_factors(items):
            return hashlib.sha256(json.dumps(items, sort_keys=True).encode()).hexdigest()
    '''),
    "stand_in_config.py": textwrap.dedent('''
        # A VllmConfig of three sub-configs, each with compute_hash() over its hashed fields, the
        # whole hash over theirs; vLLM's compile-cache names (backends.py, decorators.py) from them.
        import dataclasses, hashlib, os
        import vllm.envs as envs
        from vllm.config.utils import hash_factors
        def _h(*values):
            return hashlib.sha256(repr(values).encode()).hexdigest()
        @dataclasses.dataclass
        class ModelConfig:
            model: str
            served_model_name: str | None
            max_model_len: int
            def compute_hash(self):  # served_model_name is not hashed, the model's place is (vLLM's way: its
                from vllm.config.utils import hash_factors  # fields, through the function imported on each call)
                return hash_factors({"model": self.model, "max_model_len": self.max_model_len})
        @dataclasses.dataclass
        class CacheConfig:
            block_size: int
            def compute_hash(self):
                return _h(self.block_size)
        @dataclasses.dataclass
        class SchedulerConfig:
            max_num_batched_tokens: int
            def compute_hash(self):
                return _h(self.max_num_batched_tokens)
        @dataclasses.dataclass
        class ParallelConfig:
            tensor_parallel_size: int
            rank: int = 0
            data_parallel_rank: int = 0
            data_parallel_size: int = 1
            def compute_hash(self):
                return _h(self.tensor_parallel_size)
        @dataclasses.dataclass
        class VllmConfig:
            model_config: ModelConfig
            cache_config: CacheConfig
            scheduler_config: SchedulerConfig
            parallel_config: ParallelConfig
            instance_id: str = ""
            def compute_hash(self):
                return _h(*(getattr(self, f.name).compute_hash() for f in dataclasses.fields(self)
                            if hasattr(getattr(self, f.name), "compute_hash")))
        CODE_HASH, COMPILER_HASH, MODEL_KEY = "d" * 64, "e" * 64, "k" * 64
        def code_hash(traced):
            # vLLM's VllmBackend.__call__: each traced file's path and text, in path order
            if not traced:
                return CODE_HASH
            content = []
            for path in sorted(traced):
                content += [path, open(path).read()]
            return hashlib.sha256("\\n".join(content).encode()).hexdigest()
        def traced_here():
            # the files this process imports the modules named in STAND_IN_TRACED_MODULES from
            import importlib
            names = [n for n in os.environ.get("STAND_IN_TRACED_MODULES", "").split(",") if n]
            return [importlib.import_module(n).__file__ for n in names]
        def cache_names(config, traced=()):
            env_hash, config_hash = hash_factors(envs.compile_factors()), config.compute_hash()
            code = code_hash(traced)
            backbone = hashlib.sha256(str([env_hash, config_hash, code, COMPILER_HASH]).encode()).hexdigest()[:10]
            aot = hashlib.sha256(str([env_hash, config_hash, MODEL_KEY]).encode()).hexdigest()
            return backbone, aot
        def config_of(model, served, max_num_batched_tokens, tp=1, block_size=None):
            return VllmConfig(ModelConfig(model, served, int(os.environ.get("STAND_IN_MAX_MODEL_LEN", "4096"))),
                              CacheConfig(block_size or 16), SchedulerConfig(max_num_batched_tokens), ParallelConfig(tp))
    '''),
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
        if os.environ.get("STAND_IN_VLLM_LAYOUT") in ("0.25", "0.29", "0.32"):
            # vLLM 0.25 to 0.32: one autotune_configs.json, made ready (its directory) by the resolver
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
    "vllm/platforms/__init__.py": textwrap.dedent('''
        import os
        class _Platform:
            # the one question the plugin asks of it here (get_device_name and the others are not
            # stood in: the plugin's cuda_answered_by_nvml then leaves torch as it is)
            def is_device_capability_family(self, family):
                return os.environ.get("STAND_IN_GPU_FAMILY") == str(family)
        current_platform = _Platform()
    '''),
    # vLLM 0.33/0.34's sparse-MLA decode autotune (SM120 only): its leader reads
    # resolve_flashinfer_autotune_file's autotune_configs.json beside the per-rank files
    "vllm/model_executor/warmup/flashinfer_sparse_mla_warmup.py": textwrap.dedent('''
        import json
        from vllm.platforms import current_platform
        from vllm.model_executor.warmup import flashinfer_autotune_cache as c
        def flashinfer_sparse_mla_decode_autotune_warmup(worker):
            if not current_platform.is_device_capability_family(120) or not hasattr(c, "flashinfer_autotune_root"):
                return None
            path = c.flashinfer_autotune_root() / c.flashinfer_autotune_cache_hash(worker.model_runner) / "autotune_configs.json"
            try:
                document = json.loads(path.read_bytes())
            except (OSError, ValueError):
                return {"shared_file_present": path.is_file(), "entries": 0}
            return {"shared_file_present": True, "entries": len(document) - ("_metadata" in document)}
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
        def _flashinfer_autotune_029(runner, group):
            # vLLM 0.27 to 0.31: rank 0 reads the one file and broadcasts it to every rank
            path = c.resolve_flashinfer_autotune_file(runner)
            try:
                loadable = "_metadata" in json.loads(path.read_bytes())
            except (OSError, ValueError):
                loadable = False
            return {"file_present_at_warmup": path.is_file(), "loadable": loadable}
        def _flashinfer_autotune_032(runner, group):
            # vLLM 0.32: <stem>_dp{dp}_rank{rank}<suffix> beside that file, every rank's alike
            path = c.resolve_flashinfer_autotune_file(runner)
            seen = set()
            for rank in range(group.world_size):
                try:
                    doc = json.loads((path.parent / f"{path.stem}_dp0_rank{rank}{path.suffix}").read_bytes())
                except (OSError, ValueError):
                    return {"loadable": False}
                seen.add(json.dumps(doc.get("_metadata"), sort_keys=True))
            return {"loadable": len(seen) == 1}
        def flashinfer_autotune(runner):
            group = get_world_group()
            layout = os.environ.get("STAND_IN_VLLM_LAYOUT")
            if layout == "0.29":
                record("flashinfer_autotune", **_flashinfer_autotune_029(runner, group))
                return
            if layout == "0.32":
                record("flashinfer_autotune", **_flashinfer_autotune_032(runner, group))
                return
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
            from vllm.model_executor.warmup.flashinfer_sparse_mla_warmup import flashinfer_sparse_mla_decode_autotune_warmup
            deep_gemm_warmup(worker.get_model(), worker.scheduler_config.max_num_batched_tokens)
            sparse = flashinfer_sparse_mla_decode_autotune_warmup(worker)  # vLLM's order: before flashinfer_autotune
            if sparse is not None:
                record("sparse_mla_decode_autotune", **sparse)
            flashinfer_autotune(worker.model_runner)
    '''),
    "vllm/engine/__init__.py": "",
    "vllm/engine/arg_utils.py": textwrap.dedent('''
        import json, os
        from pathlib import Path
        import vllm.envs as envs
        from stand_in_config import config_of
        from stand_in_record import record
        import dataclasses
        MODELINFO = "vllm-model_executor-models-llama-LlamaForCausalLM.json"
        @dataclasses.dataclass
        class EngineArgs:
            # the engine's main process: vLLM inspects the model class (cached in modelinfos/)
            # while it builds its config; the workers never call it. A dataclass, as vLLM's
            model: str
            served_model_name: str | None = None
            max_num_batched_tokens: int | None = None
            tensor_parallel_size: int = 1
            max_model_len: int | None = None
            gpu_memory_utilization: float = 0.9
            def create_engine_config(self, *args, **kwargs):
                info = Path(envs.VLLM_CACHE_ROOT) / "modelinfos" / MODELINFO
                record("inspect_model", cached=info.is_file())
                if not info.is_file():
                    info.parent.mkdir(parents=True, exist_ok=True)
                    info.write_text(json.dumps({"hash": "h", "modelinfo": {}}))
                return config_of(self.model, self.served_model_name, self.max_num_batched_tokens or 8192,
                                 self.tensor_parallel_size)
    '''),
    "vllm/v1/__init__.py": "",
    "vllm/v1/worker/__init__.py": "",
    "vllm/v1/worker/gpu_worker.py": textwrap.dedent('''
        from vllm.model_executor.warmup.kernel_warmup import kernel_warmup
        class Worker:
            def __init__(self, model_runner):
                self.model_runner = model_runner
                self.vllm_config = model_runner.vllm_config
                self.scheduler_config = model_runner.vllm_config.scheduler_config
            def get_model(self):
                return object()
            def compile_or_warm_up_model(self):
                kernel_warmup(self)
            def determine_available_memory(self):
                # the profiling run: vLLM's torch.compile looks up its two cache directories
                import os
                from pathlib import Path
                import vllm.envs as envs
                from stand_in_config import cache_names, traced_here
                from stand_in_record import record
                backbone, aot = cache_names(self.vllm_config, traced_here())
                root = Path(envs.VLLM_CACHE_ROOT) / "torch_compile_cache"
                def loadable(directory):
                    # vLLM opens every artifact its index names, by the index's path
                    # (InductorStandaloneAdaptor.load): a missing one fails the engine's start
                    import ast
                    indexes = list(directory.rglob("vllm_compile_cache.py")) if directory.is_dir() else []
                    return bool(indexes) and all(os.path.exists(value["graph_handle"][1]) for index in indexes
                                                 for value in ast.literal_eval(index.read_text()).values())
                found = {"backbone": loadable(root / backbone), "aot": (root / "torch_aot_compile" / aot).is_dir()}
                record("compile", **found)
                if found["aot"]:
                    # vLLM 0.25 points Inductor's cache into the AOT directory it loads
                    # (vllm/compilation/decorators.py), and Inductor's TritonBundler.read_and_emit
                    # writes the kernels the artifact bundles into triton_cache_dir(device):
                    # TRITON_CACHE_DIR, else <TORCHINDUCTOR_CACHE_DIR>/triton/0, unless the kernel's
                    # directory is there already (the node's Inductor compiled HASHB)
                    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(root / "torch_aot_compile" / aot / "inductor_cache")
                    base = os.environ.get("TRITON_CACHE_DIR") or os.path.join(os.environ["TORCHINDUCTOR_CACHE_DIR"], "triton", "0")
                    bundled = Path(base) / "HASHB"
                    if not (bundled.is_dir() and any(bundled.iterdir())):
                        bundled.mkdir(parents=True, exist_ok=True)
                        (bundled / "_fwd_kernel.cubin").write_bytes(b"cubin")
                if not all(found.values()) and os.environ.get("TRITON_CACHE_DIR"):  # compiling writes a kernel
                    kernel = Path(os.environ["TRITON_CACHE_DIR"]) / "COMPILEDHERE"
                    kernel.mkdir(parents=True, exist_ok=True)
                    (kernel / "triton_poi_fused_0.cubin").write_bytes(b"cubin")
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


ENGINE = textwrap.dedent('''
    # The engine's main process, then its one worker in the same process (vLLM 0.25's
    # single-process engine): plugins loaded, EngineArgs built and its config made, then the
    # worker's profiling run and warmup, as vLLM calls them.
    import logging, os, sys
    from types import SimpleNamespace as NS
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    from importlib.metadata import entry_points
    [plugin] = [e for e in entry_points(group="vllm.general_plugins") if e.name == "tunecache"]
    plugin.load()()   # EngineArgs.__post_init__ -> load_general_plugins
    from vllm.engine.arg_utils import EngineArgs
    args = EngineArgs(os.environ["STAND_IN_MODEL"], served_model_name="meta-llama/Llama-3.1-8B",
                      max_num_batched_tokens=int(os.environ["STAND_IN_MNBT"]) if os.environ.get("STAND_IN_MNBT") else None,
                      max_model_len=int(os.environ["STAND_IN_MAX_MODEL_LEN"]) if os.environ.get("STAND_IN_MAX_MODEL_LEN") else None)
    config = args.create_engine_config()
    if os.environ.get("STAND_IN_BETWEEN"):  # what happens elsewhere before the engine core starts its worker
        import subprocess
        subprocess.run([sys.executable, os.environ["STAND_IN_BETWEEN"]], check=True)
    config.instance_id = os.environ["STAND_IN_INSTANCE_ID"]
    if os.environ.get("STAND_IN_BLOCK_SIZE"):  # the engine core settles the block size for its attention backend
        config.cache_config.block_size = int(os.environ["STAND_IN_BLOCK_SIZE"])
    from vllm.v1.worker.gpu_worker import Worker
    worker = Worker(NS(vllm_config=config))
    worker.determine_available_memory()
    worker.compile_or_warm_up_model()
''')


NODE_SCRATCH = textwrap.dedent('''
    # What a tuning node's vLLM leaves in its scratch after one compile-and-graphs boot, made
    # with the stand-in's config and names: argv[1] the scratch, argv[2] the node's model
    # path, argv[3] a JSON object of overrides (block_size, vllm_version, traced_files).
    import json, sys
    from pathlib import Path
    import vllm.envs as envs
    from stand_in_config import COMPILER_HASH, MODEL_KEY, cache_names, code_hash, config_of
    scratch, model, overrides = Path(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
    config = config_of(model, "meta-llama/Llama-3.1-8B", 8192, block_size=overrides.get("block_size"))
    if overrides.get("max_model_len"):  # an engine variant: vLLM booted with another max_model_len
        config.model_config.max_model_len = overrides["max_model_len"]
    traced = overrides.get("traced_files", [])
    backbone, aot = cache_names(config, traced)
    compiled = scratch / "vllm-cache" / "torch_compile_cache"
    local = compiled / backbone / "rank_0_0" / "backbone"
    local.mkdir(parents=True)
    (local / "cache_key_factors.json").write_text(json.dumps({"env": envs.compile_factors(),
        "config_hash": config.compute_hash(), "code_hash": code_hash(traced), "compiler_hash": COMPILER_HASH}))
    (local / "artifact_compile_range_1_8192_subgraph_0").write_bytes(b"inductor artifact")
    # vLLM's index of the compiled graphs: each artifact by its absolute path on this node (vllm#52154)
    import pprint
    (local / "vllm_compile_cache.py").write_text(pprint.PrettyPrinter(indent=4).pformat({
        ((1, 8192), 0, "inductor_standalone"): {
            "graph_handle": ("key0", str(local / "artifact_compile_range_1_8192_subgraph_0")), "cache_key": "ck0"}}))
    (compiled / "torch_aot_compile" / aot / "rank_0_0").mkdir(parents=True)
    (compiled / "torch_aot_compile" / aot / "rank_0_0" / "model").write_bytes(b"aot model")
    infos = scratch / "vllm-cache" / "modelinfos"
    infos.mkdir(parents=True)
    (infos / "vllm-model_executor-models-llama-LlamaForCausalLM.json").write_text(json.dumps({"hash": "h", "modelinfo": {}}))
    kernel = scratch / "triton" / "HASHB"
    kernel.mkdir(parents=True)
    (kernel / "_fwd_kernel.cubin").write_bytes(b"cubin")
    (kernel / "__grp___fwd_kernel.json").write_text(json.dumps({"child_paths": {"_fwd_kernel.cubin": str(kernel / "_fwd_kernel.cubin")}}))
    hashes = {name: getattr(config, name).compute_hash() for name in ("model_config", "cache_config", "scheduler_config", "parallel_config")}
    from tunecache.engines.vllm.compile_cache import variant_factors  # as the tuner's compile_facts records it
    version = overrides.get("vllm_version", "0.25.0")
    variant = variant_factors(config, envs.compile_factors(), version, "meta-llama/Llama-3.1-8B")
    (scratch / "compile-facts.json").write_text(json.dumps({"vllm_version": version,
        "config_hashes": hashes, "model": model, "aot_extra": [], "model_hash_key": MODEL_KEY,
        "traced_files": overrides.get("traced_files", []), "variant_factors": variant.model_dump(mode="json")}))
''')


def node_scratch(tmp_path: Path, model: str, **overrides) -> Path:
    """A tuning node's scratch as its vLLM leaves it (:data:`NODE_SCRATCH`), with the node's environment."""
    stand_in = write_stand_in(tmp_path)
    (tmp_path / "node_scratch.py").write_text(NODE_SCRATCH)
    scratch = tmp_path / ("node-scratch" + (f"-{overrides['max_model_len']}" if overrides.get("max_model_len") else ""))
    env = {**os.environ, "PYTHONPATH": f"{stand_in}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "VLLM_USE_AOT_COMPILE": "1"}
    subprocess.run([sys.executable, str(tmp_path / "node_scratch.py"), str(scratch), model, json.dumps(overrides)],
                   check=True, env=env)
    return scratch


def run_engine(tmp_path: Path, **env: str) -> tuple[dict, str]:
    """A stand-in engine's boot (main process and its worker) to its end: (what its steps saw, its log)."""
    write_stand_in(tmp_path)
    (tmp_path / "engine.py").write_text(ENGINE)
    result = preloaded.run([str(tmp_path / "engine.py")], worker_env(tmp_path, **env))
    assert result.returncode == 0, result.stderr  # never raises into vLLM
    return parse_seen(result.stdout), result.stderr


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
    base = {key: value for key, value in os.environ.items() if key not in ("DG_JIT_CACHE_DIR", "TRITON_CACHE_DIR")}
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


#: The attestation line each worker logs once it warmed up (tests/e2e/test_warm_state.py checks it).
ATTESTATION = "tunecache: this boot compiled "


def tunecache_lines(log: str, attestation: bool = False) -> list[str]:
    """The plugin's lines in a worker's log; the boot's attestation line only with ``attestation``."""
    return [line for line in log.splitlines()
            if line.startswith("tunecache:") and (attestation or not line.startswith(ATTESTATION))]


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
