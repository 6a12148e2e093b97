"""Run inside a vLLM release's own environment (tests/support/vllm_envs.py) by
tests/contract/test_vllm_config_names.py, as a tuning node or as a pod:

    python vllm_config_probe.py node MODEL_DIR MAX_MODEL_LEN
    python vllm_config_probe.py pod MODEL_DIR MAX_MODEL_LEN NODE_FILE  # the node's output, as JSON

Builds a real ``VllmConfig`` for the tiny model in ``MODEL_DIR`` on the CPU with that release's
own code (``EngineArgs(...).create_engine_config()``, no weights loaded) and prints one JSON
object after :data:`MARK`: the names that release's own functions give (the AOT directory: ``sha256(str(
aot_compile_hash_factors(config) + [_model_hash_key(forward)]))``, as ``decorators.py`` computes
it before it loads; the rank directory from ``parallel_config``) and what tunecache's code
computes for the same config (the tuner's record as ``compile_facts`` makes it; on a pod,
``pod_compile_factors``, ``pod_dir_names``, ``differences`` for a release whose directories are
renamed, ``variant_factors`` and ``variant_differences`` for one whose AOT path vLLM gives).

vLLM picks a CPU platform with ``VLLM_TARGET_DEVICE=cpu`` from 0.34; 0.25's ``cpu_platform_plugin``
takes CPU only for a "+cpu" build or macOS, so its ``CpuPlatform`` is set as the current
platform before first use. ``CUDA_VISIBLE_DEVICES=`` (empty) keeps 0.34's Triton import check
from refusing a machine without GPUs (``vllm/triton_utils/importing.py``).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

SERVED = "tiny/llama"
#: Starts the line of the result (vLLM logs to stdout too).
MARK = "tunecache-probe: "


def _platform() -> str:
    import vllm.platforms
    from vllm.platforms import current_platform

    if getattr(current_platform, "device_type", "") == "cpu":
        return "cpu"
    from vllm.platforms.cpu import CpuPlatform

    vllm.platforms._current_platform = CpuPlatform()  # 0.25: no variable selects it
    return "cpu (set)"


def build(model: str, max_model_len: int):
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(model=model, served_model_name=SERVED, skip_tokenizer_init=True, dtype="bfloat16",
                      max_model_len=max_model_len).create_engine_config()


def vllm_names(config) -> dict:
    """What this release's own functions name for ``config``."""
    from vllm.compilation.caching import aot_compile_hash_factors
    from vllm.compilation.decorators import _model_hash_key
    from vllm.model_executor.models.llama import LlamaModel

    import vllm.envs as envs

    factors = aot_compile_hash_factors(config)
    key = _model_hash_key(LlamaModel.forward)
    parallel = config.parallel_config
    dp = getattr(parallel, "data_parallel_index", getattr(parallel, "data_parallel_rank", 0))
    return {"aot_dir": hashlib.sha256(str(factors + [key]).encode()).hexdigest(),
            "aot_extra": [str(f) for f in factors[2:]],
            "aot_extra_repr": [repr(f) for f in factors[2:]], "model_hash_key": key,
            "rank_dir": f"rank_{parallel.rank}_{dp}", "cache_root": envs.VLLM_CACHE_ROOT}


def main() -> None:
    role, model, max_model_len = sys.argv[1], sys.argv[2], int(sys.argv[3])
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import vllm
    import vllm.envs as envs

    platform = _platform()
    config = build(model, max_model_len)
    names = vllm_names(config)
    from tunecache.engines.vllm.aot import rank_facts
    from tunecache.engines.vllm.compile_cache import (CompileFactors, config_hashes, differences, node_dir_names,
                                                     pod_dir_names, variant_differences, variant_factors)

    variant = variant_factors(config, envs.compile_factors(), vllm.__version__, SERVED)
    facts = rank_facts(config, envs.compile_factors(), None, {})
    out = {"vllm_version": vllm.__version__, "platform": platform, "vllm": names, "variant": variant.model_dump(mode="json"),
           "tunecache_rank_dir": f"rank_{facts['rank']}_{facts['dp_rank']}",
           "vllm_file": vllm.__file__, "has_compute_hash": callable(getattr(config, "compute_hash", None))}
    if out["has_compute_hash"]:  # 0.25-0.33: the node's record as the tuner's compile_facts makes it
        node = {"vllm_version": vllm.__version__, "env": json.loads(json.dumps(envs.compile_factors(), default=str)),
                "config_hash": config.compute_hash(), "config_hashes": config_hashes(config),
                "model": str(config.model_config.model), "aot_extra": names["aot_extra"],
                "aot_extra_repr": names["aot_extra_repr"],
                "model_hash_key": names["model_hash_key"], "aot_dir": names["aot_dir"],
                "variant_factors": out["variant"]}
        out["node_record"] = node
        out["tunecache_node_aot_dir"] = node_dir_names(CompileFactors.model_validate(node)).get("aot")
    if role == "pod":
        with open(sys.argv[4]) as f:
            recorded = json.load(f)
        out["variant_differences"] = variant_differences(variant.model_validate(recorded["variant"]), variant)
        if "node_record" in recorded:
            from tunecache.client.boot.engine import pod_compile_factors

            node = CompileFactors.model_validate(recorded["node_record"])
            pod = pod_compile_factors(config, node)
            out["differences"] = differences(node, pod)
            out["tunecache_aot_dir"] = pod_dir_names(node, pod).get(f"torch_aot_compile/{node.aot_dir}")
    print(MARK + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
