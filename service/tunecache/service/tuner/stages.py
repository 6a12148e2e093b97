"""Tuner stages. Each runs inside the child's ``flashinfer.autotune(True, cache=...)``
context, so every tunable FlashInfer op it calls is profiled and its winning tactic
lands in the one cache file FlashInfer writes on exit.

A stage is a unit with a ``name``, ``skip_reason(spec)`` (``None`` when it applies) and
``run(spec, report)``; the child runs :data:`STAGES` in order. MoE, attention, DeepGEMM
and the vLLM runner slot in as further stages.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from tunecache.service.tuner.model_config import GemmShape, checkpoint_quantization, dense_gemm_shapes

#: report(step, total, detail): progress inside a stage (1-based step).
Report = Callable[[int, int, str], None]

#: FlashInfer GEMM backends tuned per arch. ``mm_bf16(backend="auto")`` is avoided: on
#: sm90 it probes the CuTe-DSL (TGV) backend, which needs nvidia-cutlass-dsl-libs.
BF16_BACKENDS: dict[str, tuple[str, ...]] = {"sm90": ("cudnn", "cublaslt")}
FP8_BACKENDS: dict[str, tuple[str, ...]] = {"sm90": ("cudnn", "cublas")}


class TuneSpec(BaseModel):
    """Everything the child needs to tune one key (JSON-serialisable; passed as a file)."""

    model_config = ConfigDict(extra="forbid")

    model: str
    hf_config: dict[str, Any]
    max_num_batched_tokens: int = Field(gt=0)
    tensor_parallel_size: int = Field(default=1, gt=0)
    dtype: str = "auto"
    quantization: str = "auto"
    gemm_backends: list[str] | None = None
    """Override the per-arch backends (e.g. ``["cublaslt"]`` for a fast run)."""

    def resolved_quantization(self) -> str | None:
        """``quantization``, or the checkpoint's when ``"auto"``."""
        return checkpoint_quantization(self.hf_config) if self.quantization == "auto" else self.quantization


class Stage(Protocol):
    name: str

    def skip_reason(self, spec: TuneSpec, arch: str) -> str | None: ...

    def run(self, spec: TuneSpec, arch: str, report: Report) -> dict[str, Any]: ...


class DenseGemmStage:
    """FlashInfer's tunable GEMMs over the decoder layers' shapes.

    bf16 models: ``flashinfer.mm_bf16`` (``flashinfer/gemm/gemm_base.py``); fp8 models
    (``quantization == "fp8"``): ``flashinfer.bmm_fp8`` with per-tensor scales. Each shape
    is called once per backend with M = ``max_num_batched_tokens``: the GEMM tuning
    config's dynamic M dimension makes ``AutoTuner._generate_optimization_profiles``
    profile every token bucket of ``flashinfer.fused_moe.utils.get_hybrid_num_tokens_buckets(M)``
    (powers of 2 up to 256, steps of 256 up to 2048, of 512 up to 4096, then powers of 2),
    so one call covers 1..M; at run time ``map_to_hybrid_bucket_uncapped`` maps a token
    count to its bucket.
    """

    name = "gemm"

    def skip_reason(self, spec: TuneSpec, arch: str) -> str | None:
        quant = spec.resolved_quantization()
        table = FP8_BACKENDS if quant == "fp8" else BF16_BACKENDS
        if quant not in (None, "fp8"):
            return f"quantization {quant!r} has no FlashInfer GEMM stage yet"
        if spec.gemm_backends is None and arch not in table:
            return f"no FlashInfer GEMM backends chosen for {arch} (pass gemm_backends)"
        return None

    def shapes(self, spec: TuneSpec) -> list[GemmShape]:
        return dense_gemm_shapes(spec.hf_config, spec.tensor_parallel_size)

    def run(self, spec: TuneSpec, arch: str, report: Report) -> dict[str, Any]:
        import torch

        import flashinfer

        fp8 = spec.resolved_quantization() == "fp8"
        backends = spec.gemm_backends or (FP8_BACKENDS if fp8 else BF16_BACKENDS)[arch]
        shapes = self.shapes(spec)
        total = len(shapes) * len(backends)
        m = spec.max_num_batched_tokens
        step = 0
        calls: list[dict[str, Any]] = []
        for shape in shapes:
            for backend in backends:
                started = time.perf_counter()
                if fp8:
                    a = torch.randn(1, m, shape.k, device="cuda").to(torch.float8_e4m3fn)
                    b = torch.randn(1, shape.n, shape.k, device="cuda").to(torch.float8_e4m3fn).transpose(1, 2)
                    one = torch.tensor(1.0, device="cuda")
                    flashinfer.bmm_fp8(a, b, one, one, torch.bfloat16, backend=backend)
                else:
                    a = torch.randn(m, shape.k, device="cuda", dtype=torch.bfloat16)
                    b = torch.randn(shape.n, shape.k, device="cuda", dtype=torch.bfloat16).t()
                    flashinfer.mm_bf16(a, b, backend=backend)
                torch.cuda.synchronize()
                seconds = time.perf_counter() - started
                step += 1
                calls.append({"shape": shape.name, "n": shape.n, "k": shape.k, "backend": backend, "seconds": round(seconds, 3)})
                report(step, total, f"{shape.name} n={shape.n} k={shape.k} {backend}")
                del a, b
        op = "bmm_fp8" if fp8 else "mm_bf16"
        return {"op": op, "max_m": m, "calls": calls}


STAGES: tuple[Stage, ...] = (DenseGemmStage(),)
