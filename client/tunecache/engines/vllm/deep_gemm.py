"""Which vLLM releases a DeepGEMM JIT cache covers: the M set it was warmed up with.

vLLM's DeepGEMM warmup compiles one kernel per (N, K, M) it tries, the Ms made from a set of
block Ms (``vllm/model_executor/warmup/deep_gemm_warmup.py::_generate_optimal_warmup_m_values``:
``block_ms = [64, 128, 256]`` in 0.25-0.33, ``list(range(16, 257, 16))`` in 0.34, checked
against each wheel by ``tests/contract/test_vllm_releases.py``). A cache made with one set
lacks kernels a release of another warms up, so it covers only the releases of its own set:
the tuner records the set in the run (:data:`M_SET_FIELD`, :func:`m_set_record`) and a pod
whose vLLM warms up another set leaves the cache out, saying why (:func:`m_set_refusal`).

Pure: the standard library.
"""

from __future__ import annotations

from typing import Any

#: The run summary's field that records the M set a run's DeepGEMM cache was made with.
M_SET_FIELD = "deep_gemm_m_set"
#: The block Ms tunecache's own DeepGEMM stage warms up with (vLLM 0.25's
#: ``_generate_optimal_warmup_m_values``, which it mirrors).
STAGE_BLOCK_MS: tuple[int, ...] = (64, 128, 256)


def m_set_record(block_ms: tuple[int, ...] | list[int], made_by: str) -> dict[str, Any]:
    """The run summary's :data:`M_SET_FIELD`: the block Ms and what warmed up with them."""
    return {"block_ms": [int(m) for m in block_ms], "made_by": made_by}


def _shown(block_ms: tuple[int, ...]) -> str:
    steps = {b - a for a, b in zip(block_ms, block_ms[1:])}
    if len(block_ms) > 3 and len(steps) == 1:
        return f"{block_ms[0]}..{block_ms[-1]} by {steps.pop()}"
    return ", ".join(map(str, block_ms))


def m_set_refusal(recorded: Any, vllm_version: str | None, release: Any) -> str | None:
    """Why a run's DeepGEMM cache (its summary's :data:`M_SET_FIELD`, ``recorded``) does not cover
    this pod's vLLM ``vllm_version`` (``release``: its row, with ``deep_gemm_block_ms``), one line;
    ``None``: it does, or it cannot be told (a run before this record, no vLLM or an unknown
    release here)."""
    if not isinstance(recorded, dict) or release is None or not isinstance(recorded.get("block_ms"), list):
        return None
    theirs = tuple(int(m) for m in recorded["block_ms"] if isinstance(m, int))
    mine = tuple(release.deep_gemm_block_ms)
    if theirs == mine:
        return None
    return (f"made with the block Ms {_shown(theirs)} ({str(recorded.get('made_by') or 'unknown')[:120]}), and this "
            f"vLLM {vllm_version} warms DeepGEMM up with {_shown(mine)}: it covers only the releases of its own M set")
