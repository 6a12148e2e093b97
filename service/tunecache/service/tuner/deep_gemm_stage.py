"""DeepGEMM's JIT warmup for fp8 block-scaled checkpoints, as vLLM's ``deep_gemm_warmup``.

vLLM's ``kernel_warmup`` first runs ``vllm/model_executor/warmup/deep_gemm_warmup.py::
deep_gemm_warmup(model, max_num_batched_tokens)``: for every fp8 linear layer whose weights
DeepGEMM takes (block-scaled 128 x 128, N a multiple of 64, K of 128:
``vllm/utils/deep_gemm.py::should_use_deepgemm_for_fp8_linear``) it calls
``deep_gemm.fp8_gemm_nt`` once per M of :func:`warmup_m_values`, and DeepGEMM compiles one
kernel per configuration its heuristics pick into ``DG_JIT_CACHE_DIR``. That directory is
what a pod reuses (``deep_gemm_jit_cache`` artifact); nothing here is autotuned.

This stage does the dense part for the model's per-rank GEMM shapes (the config decides
them, weights are random), with vLLM's defaults: ``VLLM_DEEP_GEMM_WARMUP=relax`` (the M
values below) and ``VLLM_USE_DEEP_GEMM_E8M0=1`` (scales cast to UE8M0). The grouped MoE
GEMMs (``m_grouped_fp8_gemm_nt_contiguous``) are not warmed here yet.

``deep_gemm`` is imported as vLLM imports it (``vllm/utils/deep_gemm.py::_import_deep_gemm``):
the ``deep_gemm`` package, else the copy vLLM ships as ``vllm.third_party.deep_gemm``.
"""

from __future__ import annotations

import importlib
import os
import time
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from tunecache.contract import Stage
from tunecache.engines.vllm.deep_gemm import STAGE_BLOCK_MS
from tunecache.service.tuner.model_config import GemmShape, dense_gemm_shapes

if TYPE_CHECKING:
    from tunecache.service.tuner.stages import Report, TuneSpec

#: DeepGEMM's fp8 block size (``get_mk_alignment_for_contiguous_layout()`` on sm90).
BLOCK = 128
#: vLLM's ``should_use_deepgemm_for_fp8_linear``: N and K multiples DeepGEMM takes.
N_MULTIPLE, K_MULTIPLE = 64, 128


def import_deep_gemm() -> ModuleType:
    """``deep_gemm``, else vLLM's vendored ``vllm.third_party.deep_gemm``.

    Raises:
        ImportError: neither imports (the last error is chained).
    """
    try:
        return importlib.import_module("deep_gemm")
    except ImportError:
        return importlib.import_module("vllm.third_party.deep_gemm")


def warmup_m_values(max_tokens: int, n: int, num_sms: int) -> list[int]:
    """The M values vLLM warms one fp8 GEMM of output width ``n`` with, under
    ``VLLM_DEEP_GEMM_WARMUP=relax`` (its default): 1, 2, 4, 8..64 by 8, and for each
    DeepGEMM block (M in :data:`~tunecache.engines.vllm.deep_gemm.STAGE_BLOCK_MS`, 64/128/256;
    N in 16..256 by 16) every M where the kernel's wave
    count changes (1..10 waves of ``num_sms`` blocks) and every multiple of the block M,
    all up to ``max_tokens``. Mirrors ``vllm/model_executor/warmup/deep_gemm_warmup.py::
    _generate_optimal_warmup_m_values`` (vLLM 0.25), which follows DeepGEMM's heuristics.
    """
    values = {m for m in [1, 2, 4, *range(8, 65, 8)] if m <= max_tokens}
    for block_m in STAGE_BLOCK_MS:
        for block_n in range(16, min(257, n + 1), 16):
            for wave in range(1, 11):
                m = wave * num_sms * block_m // -(-n // block_n)
                if 1 <= m <= max_tokens:
                    values.add(m)
            values.update(range(block_m, max_tokens + 1, block_m))
    return sorted(values)


def block_scaled_fp8(config: dict[str, Any]) -> bool:
    """Whether a HF config is an fp8 checkpoint with 128 x 128 weight blocks (what DeepGEMM runs)."""
    quant = config.get("quantization_config") or config.get("text_config", {}).get("quantization_config")
    return (isinstance(quant, dict) and quant.get("quant_method") == "fp8"
            and list(quant.get("weight_block_size") or []) == [BLOCK, BLOCK])


def deep_gemm_shapes(spec: "TuneSpec") -> list[GemmShape]:
    """The model's per-rank dense GEMMs DeepGEMM takes (N % 64 == 0, K % 128 == 0), each (N, K) once."""
    seen: dict[tuple[int, int], GemmShape] = {}
    for shape in dense_gemm_shapes(spec.hf_config, spec.deployment.tensor_parallel_size):
        if shape.n % N_MULTIPLE == 0 and shape.k % K_MULTIPLE == 0:
            seen.setdefault((shape.n, shape.k), shape)
    return list(seen.values())


class DeepGemmStage:
    """vLLM's dense DeepGEMM warmup (module docstring). Runs before FlashInfer's autotune,
    as in vLLM's ``kernel_warmup``; compiled kernels land in ``DG_JIT_CACHE_DIR``."""

    name = Stage.DEEP_GEMM

    def skip_reason(self, spec: "TuneSpec", arch: str) -> str | None:
        """``None`` when the stage applies; else why not (not fp8 block-scaled, no shape
        DeepGEMM takes, or ``deep_gemm`` not importable here)."""
        if spec.resolved_quantization() != "fp8" or not block_scaled_fp8(spec.hf_config):
            return "DeepGEMM warmup applies to fp8 checkpoints with 128x128 weight blocks only"
        if not deep_gemm_shapes(spec):
            return "no GEMM of this model has N % 64 == 0 and K % 128 == 0 (DeepGEMM takes none)"
        try:
            import_deep_gemm()
        except Exception as exc:  # ImportError, or an ABI mismatch raising OSError/RuntimeError
            return f"deep_gemm is not importable: {type(exc).__name__}: {exc}"
        return None

    def run(self, spec: "TuneSpec", arch: str, report: "Report") -> dict[str, Any]:
        """Call ``deep_gemm.fp8_gemm_nt`` for every shape and M (random fp8 data).

        Returns ``{"op", "shapes", "calls", "kernels", "seconds"}``: ``kernels`` counts the
        ``.cubin`` files DeepGEMM's JIT left in ``DG_JIT_CACHE_DIR``.
        """
        import torch

        deep_gemm = import_deep_gemm()
        use_ue8m0 = os.environ.get("VLLM_USE_DEEP_GEMM_E8M0", "1") != "0"
        num_sms = torch.cuda.get_device_properties(0).multi_processor_count
        shapes = deep_gemm_shapes(spec)
        m_max = spec.deployment.max_num_batched_tokens
        started = time.perf_counter()
        calls = 0
        for step, shape in enumerate(shapes, 1):
            n, k = shape.n, shape.k
            a = torch.randn(m_max, k, device="cuda").to(torch.float8_e4m3fn)
            a_scale = torch.rand(m_max, k // BLOCK, device="cuda", dtype=torch.float32) + 0.5
            w = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
            w_scale = torch.rand(-(-n // BLOCK), k // BLOCK, device="cuda", dtype=torch.float32) + 0.5
            out = torch.empty(m_max, n, device="cuda", dtype=torch.bfloat16)
            for m in warmup_m_values(m_max, n, num_sms):
                deep_gemm.fp8_gemm_nt((a[:m], a_scale[:m]), (w, w_scale), out[:m], disable_ue8m0_cast=not use_ue8m0)
                calls += 1
            torch.cuda.synchronize()
            report(step, len(shapes), f"fp8_gemm_nt {shape.name} N={n} K={k}")
        cache = os.environ.get("DG_JIT_CACHE_DIR")
        kernels = sum(1 for _ in Path(cache).rglob("*.cubin")) if cache else 0
        return {"op": "deep_gemm.fp8_gemm_nt", "shapes": [[s.n, s.k] for s in shapes], "calls": calls,
                "kernels": kernels, "seconds": round(time.perf_counter() - started, 3)}
