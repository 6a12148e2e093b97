"""The tuner's stages and its progress events: one discriminated union
(:data:`TunerEvent`), read by the service's worker and by the client's progress bar."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union, get_args

from pydantic import BaseModel, Field, TypeAdapter

from tunecache.contract.identity import StrEnum


class Stage(StrEnum):
    """Steps of a tuning, in the order vLLM 0.33's ``kernel_warmup`` runs them.

    ``deep_gemm``, ``gemm``, ``moe`` and ``attention`` are the warmup stages (selectable
    with ``--stages``: :data:`TUNABLE_STAGES`); ``harvest`` collects the
    JIT modules afterwards; ``vllm`` is the whole of vLLM's own ``kernel_warmup`` (the
    ``vllm`` runner).
    """

    DEEP_GEMM = "deep_gemm"
    GEMM = "gemm"
    MOE = "moe"
    ATTENTION = "attention"
    HARVEST = "harvest"
    VLLM = "vllm"


TunableStage = Literal["deep_gemm", "gemm", "moe", "attention"]
#: The stages a job or ``tune --stages`` may choose, in the order they run.
TUNABLE_STAGES: tuple[str, ...] = get_args(TunableStage)


class TunerStarted(BaseModel):
    """The tuner found its GPU and FlashInfer environment (``environment`` is FlashInfer's
    raw ``_metadata``: ``flashinfer.autotuner._collect_metadata()``)."""

    event: Literal["started"] = "started"
    gpu_name: str
    arch: str
    environment: dict[str, Any]


class StageChanged(BaseModel):
    """A stage started (``running``), was ``skipped`` (with ``reason``) or is ``done``
    (after ``seconds``; the harvest also names the JIT ``modules`` it stored)."""

    event: Literal["stage"] = "stage"
    stage: Stage
    status: Literal["running", "skipped", "done"]
    reason: str | None = None
    seconds: float | None = None
    modules: list[str] | None = None


class StageProgress(BaseModel):
    """Step ``step`` of ``total`` (1-based) inside a stage, e.g. one GEMM shape tuned."""

    event: Literal["progress"] = "progress"
    stage: Stage
    step: int
    total: int
    detail: str = ""


class TunerFinished(BaseModel):
    """The tuner's result: ``summary`` as stored with the run, plus ``artifacts`` (each
    ``kind``, ``name``, ``media_type`` and ``path`` relative to the tuner's directory)."""

    event: Literal["result"] = "result"
    summary: dict[str, Any]


class TunerError(BaseModel):
    """The tuner failed and says why (it exits non-zero after this)."""

    event: Literal["error"] = "error"
    message: str


#: One line of the tuner child's event stream (JSON), discriminated by ``event``.
TunerEvent = Annotated[
    Union[TunerStarted, StageChanged, StageProgress, TunerFinished, TunerError], Field(discriminator="event")
]
TUNER_EVENT: TypeAdapter[TunerEvent] = TypeAdapter(TunerEvent)
