"""Tuner stages. Each runs inside the child's ``flashinfer.autotune(True, cache=...)``
context, so every tunable FlashInfer op it calls is profiled and its winning tactic
lands in the one cache file FlashInfer writes on exit.

A stage (:class:`TunerStage`) is a unit with a ``name`` (:class:`tunecache.contract.Stage`), ``skip_reason(spec)`` (``None`` when it applies) and
``run(spec, report)``; the child runs DeepGEMM's warmup
(:class:`tunecache.service.tuner.deep_gemm_stage.DeepGemmStage`) first, then :data:`STAGES`
in order inside FlashInfer's autotune context.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from tunecache.contract import DeploymentKey, EngineArgs, Stage, TunableStage

from tunecache.service.tuner.model_config import (
    GemmShape,
    attention_shape,
    checkpoint_quantization,
    dense_gemm_shapes,
    is_moe,
    moe_shape,
)

#: report(step, total, detail): progress inside a stage (1-based step).
Report = Callable[[int, int, str], None]

#: FlashInfer GEMM backends tuned per arch. ``mm_bf16(backend="auto")`` is avoided: on
#: sm90 it probes the CuTe-DSL (TGV) backend, which needs nvidia-cutlass-dsl-libs.
BF16_BACKENDS: dict[str, tuple[str, ...]] = {"sm90": ("cudnn", "cublaslt")}
FP8_BACKENDS: dict[str, tuple[str, ...]] = {"sm90": ("cudnn", "cublas")}


class TuneSpec(BaseModel):
    """Everything the child needs to tune one key (JSON-serialisable; passed as a file)."""

    model_config = ConfigDict(extra="forbid")

    deployment: DeploymentKey
    """The key's fields but the GPU, which the child detects (``deployment.on_gpu`` makes the
    key). vLLM's data-parallel size: without expert parallelism a MoE layer is split over
    tp x dp ranks; the expert-parallel size is 1, or the ranks the experts are split over
    (tp x dp with vLLM's --enable-expert-parallel)."""
    hf_config: dict[str, Any]
    gemm_backends: list[str] | None = None
    """Override the per-arch backends (e.g. ``["cublaslt"]`` for a fast run)."""
    page_size: int = Field(default=16, gt=0)
    """KV-cache page (block) size of the attention warmup; vLLM's default ``block_size``."""
    stages: list[TunableStage] | None = None
    """Run only these stages (:data:`tunecache.contract.TUNABLE_STAGES`); ``None``: every applicable one."""
    warmup: Literal["stages", "vllm"] = "stages"
    """``stages``: tunecache's own warmup stages (this module); ``vllm``: vLLM's own
    kernel_warmup (:mod:`tunecache.service.tuner.vllm_warmup`), where vllm is installed."""
    engine_args: EngineArgs = Field(default_factory=dict)
    """The engine variant's ``vllm.LLM`` arguments (``{"max_model_len": 8192}``), over the node's
    ``TUNECACHE_VLLM_ENGINE_ARGS``: with ``warmup="vllm"`` the run is that variant's warm state."""

    def resolved_quantization(self) -> str | None:
        """``quantization``, or the checkpoint's when ``"auto"``."""
        quantization = self.deployment.quantization
        return checkpoint_quantization(self.hf_config) if quantization == "auto" else quantization


class TunerStage(Protocol):
    name: Stage

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
    count to its bucket. A backend this FlashInfer refuses on the arch
    (``flashinfer.utils.BackendSupportedError``: FlashInfer 0.6.13 has no sm90 ``cublaslt``
    ``mm_bf16``) is left out and named in the result (``unsupported_backends``).
    """

    name = Stage.GEMM

    def skip_reason(self, spec: TuneSpec, arch: str) -> str | None:
        quant = spec.resolved_quantization()
        table = FP8_BACKENDS if quant == "fp8" else BF16_BACKENDS
        if quant not in (None, "fp8"):
            return f"quantization {quant!r} has no FlashInfer GEMM stage yet"
        if spec.gemm_backends is None and arch not in table:
            return f"no FlashInfer GEMM backends chosen for {arch} (pass gemm_backends)"
        return None

    def shapes(self, spec: TuneSpec) -> list[GemmShape]:
        return dense_gemm_shapes(spec.hf_config, spec.deployment.tensor_parallel_size)

    def run(self, spec: TuneSpec, arch: str, report: Report) -> dict[str, Any]:
        import torch

        import flashinfer
        from flashinfer.utils import BackendSupportedError

        fp8 = spec.resolved_quantization() == "fp8"
        backends = list(spec.gemm_backends or (FP8_BACKENDS if fp8 else BF16_BACKENDS)[arch])
        shapes = self.shapes(spec)
        total = len(shapes) * len(backends)
        m = spec.deployment.max_num_batched_tokens
        step = 0
        calls: list[dict[str, Any]] = []
        unsupported: dict[str, str] = {}
        for shape in shapes:
            for backend in backends:
                if backend in unsupported:
                    continue
                started = time.perf_counter()
                try:
                    if fp8:
                        a = torch.randn(1, m, shape.k, device="cuda").to(torch.float8_e4m3fn)
                        b = torch.randn(1, shape.n, shape.k, device="cuda").to(torch.float8_e4m3fn).transpose(1, 2)
                        one = torch.tensor(1.0, device="cuda")
                        flashinfer.bmm_fp8(a, b, one, one, torch.bfloat16, backend=backend)
                    else:
                        a = torch.randn(m, shape.k, device="cuda", dtype=torch.bfloat16)
                        b = torch.randn(shape.n, shape.k, device="cuda", dtype=torch.bfloat16).t()
                        flashinfer.mm_bf16(a, b, backend=backend)
                except BackendSupportedError as exc:  # e.g. mm_bf16 cublaslt on sm90 in FlashInfer 0.6.13
                    unsupported[backend] = str(exc)
                    total -= len(shapes)
                    continue
                torch.cuda.synchronize()
                seconds = time.perf_counter() - started
                step += 1
                calls.append({"shape": shape.name, "n": shape.n, "k": shape.k, "backend": backend, "seconds": round(seconds, 3)})
                report(step, total, f"{shape.name} n={shape.n} k={shape.k} {backend}")
                del a, b
        op = "bmm_fp8" if fp8 else "mm_bf16"
        if not calls:
            raise RuntimeError(f"this FlashInfer runs {op} with none of the backends {', '.join(backends)} here: "
                               + "; ".join(unsupported.values()))
        return {"op": op, "max_m": m, "calls": calls, **({"unsupported_backends": unsupported} if unsupported else {})}


class FusedMoeStage:
    """FlashInfer's fused MoE (``flashinfer.fused_moe.cutlass_fused_moe``, the cutlass
    backend vLLM uses on sm90) for the model's experts, bf16.

    Called once with M = ``max_num_batched_tokens`` and ``tune_max_num_tokens =
    max_num_batched_tokens``: FlashInfer's ``MoERunner.refine_tuning_config`` then
    profiles the token buckets ``flashinfer.fused_moe.utils.get_hybrid_num_tokens_buckets
    (max_num_batched_tokens)`` (powers of 2 up to 256, steps of 256 up to 2048, of 512 up
    to 4096, then powers of 2), the same buckets vLLM's kernel_warmup tunes, because vLLM
    also passes its ``max_num_batched_tokens`` as ``tune_max_num_tokens``; a runtime token
    count maps to its bucket with ``make_hybrid_bucket_mapper``. The first call builds
    the JIT module ``fused_moe_90`` (cutlass, long: see docs/gpu.md).
    """

    name = Stage.MOE

    def skip_reason(self, spec: TuneSpec, arch: str) -> str | None:
        if not is_moe(spec.hf_config):
            return "dense model (no experts)"
        if arch != "sm90":
            return f"the fused-MoE stage covers sm90 only, not {arch}"
        quant = spec.resolved_quantization()
        if quant is not None:
            return f"fused-MoE tuning for {quant} checkpoints is not implemented (bf16 only)"
        return None

    def run(self, spec: TuneSpec, arch: str, report: Report) -> dict[str, Any]:
        import torch

        from flashinfer.fused_moe import cutlass_fused_moe

        deployment = spec.deployment
        shape = moe_shape(spec.hf_config, deployment.tensor_parallel_size, deployment.expert_parallel_size,
                          deployment.data_parallel_size)
        m = spec.deployment.max_num_batched_tokens
        x = torch.randn(m, shape.hidden, device="cuda", dtype=torch.bfloat16)
        # ranks route to experts anywhere; scales normalized like a softmax top-k
        experts = torch.stack(
            [torch.randperm(shape.experts, device="cuda")[: shape.top_k] for _ in range(min(m, 64))]
        ).repeat((m + 63) // 64, 1)[:m].to(torch.int32)
        scales = torch.softmax(torch.randn(m, shape.top_k, device="cuda"), dim=-1)
        w1 = torch.randn(shape.local_experts, 2 * shape.intermediate, shape.hidden, device="cuda", dtype=torch.bfloat16) * 0.02
        w2 = torch.randn(shape.local_experts, shape.hidden, shape.intermediate, device="cuda", dtype=torch.bfloat16) * 0.02
        started = time.perf_counter()
        cutlass_fused_moe(
            x, experts, scales, w1, w2, torch.bfloat16, quant_scales=[],
            tp_size=shape.tp_size, tp_rank=0, ep_size=shape.ep_size, ep_rank=0,
            tune_max_num_tokens=m,
        )
        torch.cuda.synchronize()
        report(1, 1, f"cutlass_fused_moe E={shape.experts} top_k={shape.top_k} H={shape.hidden} I={shape.intermediate}")
        return {"op": "cutlass_fused_moe", "max_m": m, "seconds": round(time.perf_counter() - started, 3),
                "experts": shape.experts, "local_experts": shape.local_experts, "top_k": shape.top_k,
                "hidden": shape.hidden, "intermediate": shape.intermediate}


class AttentionWarmupStage:
    """FlashInfer's paged-KV prefill and decode wrappers planned and run once for the
    model's per-rank heads, KV heads, head_dim, page size and dtype (bf16), so the JIT
    modules they need are built (as vLLM's FlashInfer attention warmup does). Nothing here
    is autotuned; what it leaves behind is compiled code (harvested as JIT artifacts).

    Decode uses tensor cores when the GQA group exceeds 4 query heads per KV head,
    the rule of vLLM's FlashInfer backend (``use_tensor_cores``).
    """

    name = Stage.ATTENTION

    def skip_reason(self, spec: TuneSpec, arch: str) -> str | None:
        return None

    def run(self, spec: TuneSpec, arch: str, report: Report) -> dict[str, Any]:
        import torch

        import flashinfer

        shape = attention_shape(spec.hf_config, spec.deployment.tensor_parallel_size)
        page, dtype = spec.page_size, torch.bfloat16
        workspace = torch.zeros(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")
        batch, kv_len = 4, 1024
        pages_per_seq = (kv_len + page - 1) // page
        kv_cache = torch.randn(batch * pages_per_seq, 2, page, shape.num_kv_heads, shape.head_dim, device="cuda", dtype=dtype)
        kv_indptr = torch.arange(0, batch + 1, device="cuda", dtype=torch.int32) * pages_per_seq
        kv_indices = torch.arange(batch * pages_per_seq, device="cuda", dtype=torch.int32)
        last_page_len = torch.full((batch,), (kv_len - 1) % page + 1, device="cuda", dtype=torch.int32)

        started = time.perf_counter()
        prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
        qo_len = 256
        qo_indptr = torch.arange(0, batch + 1, device="cuda", dtype=torch.int32) * qo_len
        prefill.plan(qo_indptr, kv_indptr, kv_indices, last_page_len, shape.num_qo_heads, shape.num_kv_heads,
                     shape.head_dim, page, causal=True, q_data_type=dtype, kv_data_type=dtype)
        prefill.run(torch.randn(batch * qo_len, shape.num_qo_heads, shape.head_dim, device="cuda", dtype=dtype), kv_cache)
        torch.cuda.synchronize()
        report(1, 2, f"prefill qo_heads={shape.num_qo_heads} kv_heads={shape.num_kv_heads} head_dim={shape.head_dim}")

        tensor_cores = shape.num_qo_heads // shape.num_kv_heads > 4
        decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=tensor_cores)
        decode.plan(kv_indptr, kv_indices, last_page_len, shape.num_qo_heads, shape.num_kv_heads, shape.head_dim,
                    page, q_data_type=dtype, kv_data_type=dtype)
        decode.run(torch.randn(batch, shape.num_qo_heads, shape.head_dim, device="cuda", dtype=dtype), kv_cache)
        torch.cuda.synchronize()
        report(2, 2, f"decode use_tensor_cores={tensor_cores}")
        return {"page_size": page, "num_qo_heads": shape.num_qo_heads, "num_kv_heads": shape.num_kv_heads,
                "head_dim": shape.head_dim, "decode_tensor_cores": tensor_cores,
                "seconds": round(time.perf_counter() - started, 3)}


#: In vLLM's kernel_warmup order (after its DeepGEMM warmup): FlashInfer autotune (GEMM, MoE), attention.
STAGES: tuple[TunerStage, ...] = (DenseGemmStage(), FusedMoeStage(), AttentionWarmupStage())
