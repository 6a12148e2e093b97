"""The tuner's child process: ``python -m tunecache.service.tuner.child SPEC_JSON OUT_DIR``.

Runs every applicable stage inside one ``flashinfer.autotune(True, cache=OUT_DIR/autotune.json,
tuning_buckets=get_hybrid_num_tokens_buckets(max_num_batched_tokens), round_up=True)``
context, the context vLLM 0.33's kernel_warmup tunes in; FlashInfer writes the file on
exit (``AutoTuner.save_configs``). Then the JIT modules the stages used are harvested
(:mod:`tunecache.service.tuner.jit_artifacts`). Progress goes
to the original stdout as JSON lines, one :data:`tunecache.contract.TunerEvent` each
(library output is redirected to stderr):

    {"event": "started", "gpu_name": "NVIDIA H200", "arch": "sm90", "environment": {...}}
    {"event": "stage", "stage": "gemm", "status": "running"|"skipped"|"done", ...}
    {"event": "progress", "stage": "gemm", "step": 3, "total": 8, "detail": "..."}
    {"event": "result", "summary": {...}}    (a TunerSummary: tunecache.service.tuner.result)
    {"event": "error", "message": "..."}

Exit status 0 on success, 1 on a failure it could report. A CUDA fault that kills the
process leaves the parent to report the signal.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from tunecache.contract import (
    Stage,
    StageChanged,
    StageProgress,
    TunerError,
    TunerEvent,
    TunerFinished,
    TunerStarted,
)
from tunecache.engines.vllm.deep_gemm import M_SET_FIELD, STAGE_BLOCK_MS, m_set_record
from tunecache.formats.dependencies import installed_versions
from tunecache.service.tuner.deep_gemm_stage import DeepGemmStage
from tunecache.service.tuner.harvest import DeepGemmCacheHarvester, FlashInferFileHarvester
from tunecache.service.tuner.guard import die_with_parent, hold_gpu_lock
from tunecache.service.tuner.result import TunerSummary
from tunecache.service.tuner.stages import STAGES, TunerStage, TuneSpec

#: emit(event): write one event to the parent.
Emit = Callable[[TunerEvent], None]

AUTOTUNE_FILE = "autotune.json"
RESULT_FILE = "result.json"


def _events_stream() -> TextIO:
    """Keep fd 1 for events; point fd 1 (and sys.stdout) at stderr for everything else."""
    events = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return events


def run(spec: TuneSpec, out_dir: Path, emit: Emit) -> TunerSummary:
    import torch

    import flashinfer
    from flashinfer.autotuner import _collect_metadata
    from flashinfer.fused_moe.utils import get_hybrid_num_tokens_buckets

    from tunecache.formats.arch import arch_from_capability
    from tunecache.formats.autotune_file import parse_autotune_file
    from tunecache.service.tuner.jit_artifacts import harvest_flashinfer_jit, workspace_layout

    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA device: this node cannot tune (it can still serve lookups)")
    gpu_name = torch.cuda.get_device_name(0)
    arch = arch_from_capability(*torch.cuda.get_device_capability(0))
    emit(TunerStarted(gpu_name=gpu_name, arch=arch, environment=_collect_metadata()))

    if spec.warmup == "vllm":
        return run_vllm(spec, out_dir, emit, gpu_name, arch)
    cache = out_dir / AUTOTUNE_FILE
    stages: dict[str, Any] = {}
    started = time.perf_counter()
    # vLLM's kernel_warmup order: DeepGEMM's warmup first, compiling into DG_JIT_CACHE_DIR
    # (this run's own directory, harvested below), then FlashInfer's autotune.
    deep_gemm_cache = out_dir / "deep_gemm"
    os.environ["DG_JIT_CACHE_DIR"] = str(deep_gemm_cache)
    _run_stage(DeepGemmStage(), spec, arch, stages, emit)
    # As vLLM's kernel_warmup (_run_flashinfer_autotune_dummy_runs): FlashInfer's hybrid
    # buckets up to max_num_batched_tokens for every op, runtime sizes rounded up.
    buckets = get_hybrid_num_tokens_buckets(spec.deployment.max_num_batched_tokens)
    with flashinfer.autotune(True, cache=str(cache), tuning_buckets=buckets, round_up=True):
        for stage in STAGES:
            _run_stage(stage, spec, arch, stages, emit)
    tuning_seconds = round(time.perf_counter() - started, 3)
    if not cache.is_file():
        raise RuntimeError("FlashInfer wrote no autotune cache file: no stage ran a tunable op")
    parsed = parse_autotune_file(cache.read_bytes(), source=str(cache))
    harvest_started = time.perf_counter()
    jit = harvest_flashinfer_jit(out_dir)
    deep_gemm = DeepGemmCacheHarvester().harvest_directory(deep_gemm_cache, out_dir)
    emit(StageChanged(stage=Stage.HARVEST, status="done", seconds=round(time.perf_counter() - harvest_started, 3),
                      modules=[a.module for a in jit]))
    return TunerSummary(
        gpu_name=gpu_name,
        arch=arch,
        environment=parsed.environment,
        entries=parsed.entries,
        tuning_seconds=tuning_seconds,
        stages=stages,
        jit_modules=[a.module for a in jit],
        flashinfer_jit=workspace_layout(),
        dependencies=installed_versions(),
        **({M_SET_FIELD: m_set_record(STAGE_BLOCK_MS, "tunecache's DeepGEMM stage (vLLM 0.25's M set)")}
           if deep_gemm else {}),
        artifacts=[FlashInferFileHarvester().artifact(AUTOTUNE_FILE), *(a.description() for a in jit), *deep_gemm],
    )


def _run_stage(stage: TunerStage, spec: TuneSpec, arch: str, stages: dict[str, Any], emit: Emit) -> None:
    """Run one stage (or record why it is skipped: not applicable, or not in ``spec.stages``)
    into ``stages[name]``, emitting its events."""
    reason = stage.skip_reason(spec, arch)
    if reason is None and spec.stages is not None and stage.name not in spec.stages:
        reason = "not requested"
    if reason is not None:
        stages[stage.name] = {"status": "skipped", "reason": reason}
        emit(StageChanged(stage=stage.name, status="skipped", reason=reason))
        return
    emit(StageChanged(stage=stage.name, status="running"))
    stage_started = time.perf_counter()

    def report(step: int, total: int, detail: str) -> None:
        emit(StageProgress(stage=stage.name, step=step, total=total, detail=detail))

    details = stage.run(spec, arch, report)
    seconds = round(time.perf_counter() - stage_started, 3)
    stages[stage.name] = {"status": "done", "seconds": seconds, **details}
    emit(StageChanged(stage=stage.name, status="done", seconds=seconds))


def vllm_m_set(harvested: dict[str, Any]) -> dict[str, Any]:
    """The run summary's DeepGEMM M set (:data:`tunecache.engines.vllm.deep_gemm.M_SET_FIELD`) when
    the vLLM warmup left a DeepGEMM cache: its vLLM release's (the version its compile facts
    name; ``{}`` when none or a release tunecache does not know)."""
    from tunecache.contract import ArtifactKind
    from tunecache.engines import engine_for

    if not any(a.kind == ArtifactKind.DEEP_GEMM_JIT_CACHE for a in harvested.get("artifacts", [])):
        return {}
    version = (harvested.get("vllm_compile") or {}).get("vllm_version")
    release = engine_for("vllm").release_of(str(version or ""))
    if release is None:
        return {}
    return {M_SET_FIELD: m_set_record(release.deep_gemm_block_ms, f"vLLM {version}'s deep_gemm_warmup")}


def run_vllm(spec: TuneSpec, out_dir: Path, emit: Emit, gpu_name: str, arch: str) -> TunerSummary:
    """The ``vllm`` warmup: vLLM's kernel_warmup in its own process, then its caches harvested."""
    from tunecache.formats.autotune_file import parse_autotune_file
    from tunecache.service.tuner.jit_artifacts import workspace_layout
    from tunecache.service.tuner.vllm_warmup import run_vllm_warmup

    emit(StageChanged(stage=Stage.VLLM, status="running"))
    started = time.perf_counter()
    harvested = run_vllm_warmup(spec, out_dir / "vllm-scratch", out_dir)
    seconds = round(time.perf_counter() - started, 3)
    emit(StageChanged(stage=Stage.VLLM, status="done", seconds=seconds))
    cache = out_dir / AUTOTUNE_FILE
    cache.write_bytes(harvested["autotune_file"].read_bytes())
    parsed = parse_autotune_file(cache.read_bytes(), source=str(cache))
    return TunerSummary(
        gpu_name=gpu_name,
        arch=arch,
        environment=parsed.environment,
        entries=parsed.entries,
        tuning_seconds=seconds,
        stages={Stage.VLLM.value: {"status": "done", "seconds": seconds, "ranks": harvested["ranks"]}},
        jit_modules=[a.module for a in harvested["jit"]],
        flashinfer_jit=workspace_layout() if harvested["jit"] else {},
        dependencies=installed_versions(),
        vllm_compile=harvested["vllm_compile"],
        **vllm_m_set(harvested),
        artifacts=[FlashInferFileHarvester().artifact(AUTOTUNE_FILE), *harvested["artifacts"]],
    )


def main(argv: list[str]) -> int:
    events = _events_stream()

    def emit(event: TunerEvent) -> None:
        events.write(event.model_dump_json() + "\n")

    spec_path, out_dir = Path(argv[0]), Path(argv[1])
    die_with_parent()
    try:
        gpu_lock = hold_gpu_lock()  # noqa: F841 - held open until this process exits
        spec = TuneSpec.model_validate_json(spec_path.read_text())
        summary = run(spec, out_dir, emit)
    except BaseException as exc:  # report anything, then fail
        traceback.print_exc()
        emit(TunerError(message=f"{type(exc).__name__}: {exc}"))
        return 1
    result = summary.model_dump(mode="json", exclude_unset=True)
    (out_dir / RESULT_FILE).write_text(json.dumps(result, indent=2))
    emit(TunerFinished(summary=result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
