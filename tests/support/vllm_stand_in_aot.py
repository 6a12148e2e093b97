"""The stand-in vLLM (tests/support/vllm_stand_in.py) in vLLM 0.34's layout: the compiled model's
``__call__`` names its mega AOT artifact and calls ``_try_load_aot_compiled_fn(self, path)`` by its
global name, in the lines of 0.34's own ``vllm/compilation/decorators.py`` (:data:`CALL_LINES`,
checked against the wheel by tests/e2e/test_aot_placement.py); ``VllmConfig.compile_factors()``;
``CUDA_HOME``, ``VLLM_P2P_SIDE_CHANNEL_PORT`` and ``VLLM_COMPILE_ON_ONE_RANK`` among the environment factors. The "artifact" is
JSON naming the device index it was compiled on: loading it on another fails as Inductor's baked
``get_raw_stream(<index>)`` does ("CUDA driver error: invalid argument"). The worker's CUDA device
(``torch.cuda.current_device()``) is ``STAND_IN_DEVICE_INDEX``, its GPU name ``STAND_IN_GPU_NAME``."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

from tests.support import preloaded
from tests.support.vllm_stand_in import ENGINE, STAND_IN, parse_seen, worker_env

#: The lines of 0.34's ``decorators.py`` (``__call__``) the stand-in's ``__call__`` is made of, as they are there.
CALL_LINES = [
    'factors.append(_model_hash_key(self.forward))',
    'hash_key = hashlib.sha256(str(factors).encode()).hexdigest()',
    'inductor_cache = os.path.join(cache_dir, "inductor_cache")',
    'os.makedirs(inductor_cache, exist_ok=True)',
    'os.environ["TORCHINDUCTOR_CACHE_DIR"] = inductor_cache',
    'rank = self.vllm_config.parallel_config.rank',
    'dp_rank = self.vllm_config.parallel_config.data_parallel_index',
    'cache_dir = os.path.join(cache_dir, f"rank_{rank}_{dp_rank}")',
    'aot_compilation_path = os.path.join(cache_dir, "model")',
    'loaded_fn = _try_load_aot_compiled_fn(self, aot_compilation_path)',
]

def _lines(lines: list[str]) -> str:
    return "\n".join(" " * 8 + line for line in lines)


AOT = {
    "vllm/compilation/__init__.py": "",
    "stand_in_aot.py": textwrap.dedent('''
        # 0.34's additions to the stand-in's config and environment, and the device torch reports
        import os, torch
        import stand_in_config, vllm.envs as envs
        def compile_factors(self):  # VllmConfig.compile_factors(): each sub-config's fields
            m, c, s, p = self.model_config, self.cache_config, self.scheduler_config, self.parallel_config
            return {"model": {"model": m.model, "max_model_len": m.max_model_len}, "cache": {"block_size": c.block_size},
                    "scheduler": {"max_num_batched_tokens": s.max_num_batched_tokens},
                    "parallel": {"tensor_parallel_size": p.tensor_parallel_size}, "vllm_version": "0.34.0"}
        stand_in_config.VllmConfig.compile_factors = compile_factors
        stand_in_config.ParallelConfig.data_parallel_index = 0
        import contextlib
        @contextlib.contextmanager
        def cuda_device():  # while the compiled model runs, torch answers for the worker's GPU
            saved = (torch.cuda.is_available, torch.cuda.current_device, torch.cuda.get_device_name, torch.version.cuda,
                     torch.cuda.get_device_capability)
            torch.cuda.is_available = lambda: True
            torch.cuda.get_device_capability = lambda device=None: (9, 0)
            torch.cuda.current_device = lambda: int(os.environ.get("STAND_IN_DEVICE_INDEX", "0"))
            torch.cuda.get_device_name = lambda device=None: os.environ.get("STAND_IN_GPU_NAME", "NVIDIA H200")
            torch.version.cuda = "12.9"
            try:
                yield
            finally:
                (torch.cuda.is_available, torch.cuda.current_device, torch.cuda.get_device_name, torch.version.cuda,
                 torch.cuda.get_device_capability) = saved
    '''),
    "vllm/envs.py": STAND_IN["vllm/envs.py"] + textwrap.dedent('''
        # 0.34's: CUDA_HOME, a side-channel port and VLLM_COMPILE_ON_ONE_RANK among the factors
        _env = compile_factors
        def compile_factors():
            return {**_env(), "CUDA_HOME": os.environ.get("CUDA_HOME"),
                    "VLLM_P2P_SIDE_CHANNEL_PORT": int(os.environ.get("VLLM_P2P_SIDE_CHANNEL_PORT", "5710")),
                    "VLLM_COMPILE_ON_ONE_RANK": os.environ.get("VLLM_COMPILE_ON_ONE_RANK", "0") == "1"}
    '''),
    "vllm/compilation/decorators.py": textwrap.dedent('''
        import hashlib, json, os
        import torch
        import stand_in_aot
        import vllm.envs as envs
        from stand_in_record import record
        def _model_hash_key(fn):
            return hashlib.sha256(fn.__qualname__.encode()).hexdigest()
        def _try_load_aot_compiled_fn(model, aot_compilation_path):
            try:
                with open(aot_compilation_path) as f:
                    artifact = json.load(f)
            except OSError:
                return None
            if artifact["device_index"] != torch.cuda.current_device():
                record("aot_load_failed", reason="CUDA driver error: invalid argument")
                return None
            return artifact
        class CompiledModel:
            def __init__(self, vllm_config):
                self.vllm_config = vllm_config
            def forward(self):
                return None
            def __call__(self):
                from stand_in_config import hash_factors
                factors = [hash_factors(envs.compile_factors()), hash_factors(self.vllm_config.compile_factors())]
        %HASH%
                cache_dir = os.path.join(envs.VLLM_CACHE_ROOT, "torch_compile_cache", "torch_aot_compile", hash_key)
        %CALL%
                record("aot", loaded=loaded_fn is not None, path=aot_compilation_path,
                       inductor=sorted(os.listdir(os.environ["TORCHINDUCTOR_CACHE_DIR"])))
                if loaded_fn is None:  # compiles, and saves as save_aot_compiled_function does
                    os.makedirs(cache_dir, exist_ok=True)
                    with open(aot_compilation_path, "w") as f:
                        json.dump({"device_index": torch.cuda.current_device()}, f)
    ''').replace("%HASH%", _lines(CALL_LINES[:2])).replace("%CALL%", _lines(CALL_LINES[2:])),
}


def write_stand_in_aot(tmp_path: Path) -> Path:
    """The stand-in of :mod:`tests.support.vllm_stand_in` with 0.34's layout over it: its worker's
    profiling run calls the compiled model."""
    from tests.support.vllm_stand_in import write_stand_in

    stand_in = write_stand_in(tmp_path)
    for name, text in AOT.items():
        (stand_in / name).parent.mkdir(parents=True, exist_ok=True)
        (stand_in / name).write_text(text)
    worker = STAND_IN["vllm/v1/worker/gpu_worker.py"] + textwrap.dedent('''
        def _profile(self):  # 0.34: the profiling run is the compiled model's first call
            import stand_in_aot
            from vllm.compilation.decorators import CompiledModel
            with stand_in_aot.cuda_device():
                CompiledModel(self.vllm_config)()
        Worker.determine_available_memory = _profile
    ''')
    (stand_in / "vllm/v1/worker/gpu_worker.py").write_text(worker)
    return stand_in


def aot_node_scratch(tmp_path: Path, model: str, ranks: dict[int, int], variant: bool = False, **env: str) -> Path:
    """A 0.34 tuning node's scratch after its boot: each rank ``r`` of ``ranks`` compiled on device
    index ``ranks[r]`` by the stand-in's own ``__call__`` (under the node's HOME and model path),
    its ``inductor_cache/`` and the engine's compile facts with ``aot_ranks`` as the tuner's
    :func:`tunecache.service.tuner.aot_harvest.aot_rank_facts` records them; with ``variant``, the
    engine variant too, as the tuner's :func:`tunecache.service.tuner.vllm_warmup.compile_facts`
    computes it (without: a tuner before variants of this release)."""
    stand_in = write_stand_in_aot(tmp_path)
    scratch = tmp_path / "node-scratch"
    script = textwrap.dedent('''
        import json, os, sys
        from pathlib import Path
        from types import SimpleNamespace as NS
        import stand_in_aot
        from stand_in_config import config_of
        from vllm.compilation.decorators import CompiledModel
        from tunecache.service.tuner.aot_harvest import aot_rank_facts
        config = config_of(sys.argv[1], "meta-llama/Llama-3.1-8B", 8192, block_size=32)
        config.parallel_config.rank = int(os.environ["RANK"])
        with stand_in_aot.cuda_device():
            CompiledModel(config)()
            facts = aot_rank_facts(NS(vllm_config=config))
        import vllm.envs as envs
        from tunecache.engines.vllm.compile_cache import variant_factors
        facts["variant_factors"] = variant_factors(config, envs.compile_factors(), "0.34.0",
                                                   "meta-llama/Llama-3.1-8B").model_dump(mode="json")
        Path(os.environ["TORCHINDUCTOR_CACHE_DIR"], "fxgraph").mkdir(exist_ok=True)
        Path(os.environ["TORCHINDUCTOR_CACHE_DIR"], "fxgraph", "entry").write_text("inductor entry")
        print(json.dumps(facts))
    ''')
    (tmp_path / "aot_node.py").write_text(script)
    facts = []
    for rank, device in sorted(ranks.items()):
        run_env = {**os.environ, "PYTHONPATH": f"{stand_in}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
                   "VLLM_CACHE_ROOT": str(scratch / "vllm-cache"), "HOME": str(tmp_path / "node-home"),
                   "STAND_IN_VLLM_VERSION": "0.34.0", "STAND_IN_DEVICE_INDEX": str(device), "RANK": str(rank),
                   "VLLM_USE_AOT_COMPILE": "1", **env}
        done = preloaded.run([str(tmp_path / "aot_node.py"), model], run_env)
        assert done.returncode == 0, done.stderr
        facts.append(json.loads(done.stdout.strip().splitlines()[-1]))
    variant_factors = facts[0].pop("variant_factors")
    for rank_facts in facts[1:]:
        rank_facts.pop("variant_factors")
    (scratch / "compile-facts.json").write_text(json.dumps({"vllm_version": "0.34.0", "aot_ranks": facts,
                                                            **({"variant_factors": variant_factors} if variant else {})}))
    return scratch


def run_aot_engine(tmp_path: Path, **env: str) -> tuple[dict, str]:
    """A stand-in 0.34 engine's boot (main process and its worker) to its end: (what its steps saw, its log)."""
    run_env = worker_env(tmp_path, STAND_IN_VLLM_VERSION="0.34.0", **env)  # writes the plain stand-in
    write_stand_in_aot(tmp_path)
    (tmp_path / "engine.py").write_text(ENGINE)
    result = preloaded.run([str(tmp_path / "engine.py")], run_env)
    assert result.returncode == 0, result.stderr  # never raises into vLLM
    return parse_seen(result.stdout), result.stderr
