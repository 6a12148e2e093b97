"""vLLM 0.33/0.34's startup plan (``VLLM_ENABLE_STARTUP_PLAN=1``): each worker's profiled KV-cache
memory, kept under ``$VLLM_CACHE_ROOT/startup_plan/startup_plan_<fingerprint>.json`` and applied
by a later boot instead of profiling (``vllm/v1/worker/startup_plan.py``: ``_plan_path``,
``maybe_save_startup_plan``, ``maybe_apply_startup_plan``, which ``Worker.determine_available_memory``
calls first).

The fingerprint is ``compute_plan_fingerprint(vllm_config, rank, world_size)``: the sha256 of the
plan schema, vLLM's version, the config's hash (0.33: ``VllmConfig.compute_hash()``, 0.34:
``hash_config(vllm_config)``, its ``compile_factors()``), the device
name, total memory and capability, torch's and CUDA's versions, the rank and the world size. A
run's plans are never taken on their name: the tuner keeps only files whose content names the
fingerprint their name does (:func:`plan_fingerprint`), and a pod's worker places only the plan
whose fingerprint its own vLLM computes for it, with vLLM's own function
(:mod:`tunecache.client.startup_plan`); vLLM then applies it only where the device has at least
the free memory the plan was measured with (``_applicable_kv_cache_memory_bytes``).

Pure: the standard library.
"""

from __future__ import annotations

import json
import re

#: The directory under ``VLLM_CACHE_ROOT`` (``_plan_path``).
PLAN_DIR = "startup_plan"
#: A plan file's name (``_plan_path``: ``f"startup_plan_{fingerprint}.json"``, the fingerprint
#: 16 hex digits: ``compute_plan_fingerprint``'s ``digest[:16]``).
PLAN_FILE = re.compile(r"^startup_plan_([0-9a-f]{16})\.json$")
#: ``PLAN_SCHEMA_VERSION`` of each release that has startup plans (``_load_plan`` refuses another;
#: the fingerprint holds the schema and vLLM's version, so a plan of one never matches another).
PLAN_SCHEMAS: dict[str, int] = {"0.33": 1, "0.34": 2}
#: The variable that turns the startup plan on (``vllm.envs.VLLM_ENABLE_STARTUP_PLAN``).
ENABLE_VARIABLE = "VLLM_ENABLE_STARTUP_PLAN"
#: A plan is a few numbers; anything bigger is not one.
MAX_PLAN_BYTES = 4096


def plan_fingerprint(name: str, data: bytes) -> str | None:
    """The fingerprint of a plan file named ``name`` holding ``data``, when it is one vLLM would
    load under that name (``_load_plan``: the schema, the same fingerprint inside, and the two
    numbers ``_applicable_kv_cache_memory_bytes`` reads, positive integers); ``None`` otherwise."""
    match = PLAN_FILE.match(name)
    if match is None or len(data) > MAX_PLAN_BYTES:
        return None
    try:
        plan = json.loads(data)
    except ValueError:
        return None
    if (not isinstance(plan, dict) or plan.get("schema") not in PLAN_SCHEMAS.values()
            or plan.get("fingerprint") != match[1]):
        return None
    if not all(type(plan.get(field)) is int and plan[field] > 0
               for field in ("kv_cache_memory_bytes", "free_memory_baseline")):
        return None
    return match[1]


def plan_file_name(fingerprint: str) -> str:
    """The file vLLM reads the plan of ``fingerprint`` from, under :data:`PLAN_DIR`."""
    return f"startup_plan_{fingerprint}.json"
