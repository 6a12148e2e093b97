"""Tuning jobs: asking a GPU node to tune a key, the job as it runs, the conflict of two
requests for one key, and the job workers (and the health answer that names this node's)."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tunecache.contract.events import TunableStage
from tunecache.contract.engine_args import EngineArgs
from tunecache.contract.identity import StrEnum, TuningKey, _storable_json


class JobStatus(StrEnum):
    """A tuning job's state; ``queued`` and ``running`` jobs occupy their key (single-flight).

    ``cancelled``: stopped by ``DELETE /v1/tuning-jobs/{id}`` before it finished (no run
    recorded); like ``succeeded`` and ``failed`` it frees the key.
    """

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def active(self) -> bool:
        """Whether a job in this state occupies its key."""
        return self in ACTIVE_JOB_STATUSES


ACTIVE_JOB_STATUSES: tuple[JobStatus, ...] = (JobStatus.QUEUED, JobStatus.RUNNING)

#: Largest model config a job may carry, as JSON bytes.
MAX_HF_CONFIG_BYTES = 1024 * 1024


#: FlashInfer's GEMM backends (``mm_bf16`` / ``mm_fp8``'s ``backend`` choices, FlashInfer
#: 0.6.13 to 0.7.4, without ``auto``, which the tuner never asks for).
GEMM_BACKENDS = frozenset({"cudnn", "cublas", "cublaslt", "cutlass", "tgv", "tinygemm", "cute-dsl", "cutile", "trtllm"})


def not_a_model_config(config: dict[str, Any]) -> str | None:
    """Why ``config`` is not a Hugging Face model config (``config.json``: a ``model_type``
    string or an ``architectures`` list of strings, and not a FlashInfer autotune file);
    ``None`` when it is one."""
    if "_metadata" in config:
        return "is a FlashInfer autotune file (it has _metadata), not a model's config.json"
    model_type, architectures = config.get("model_type"), config.get("architectures")
    if isinstance(model_type, str) and model_type:
        return None
    if isinstance(architectures, list) and architectures and all(isinstance(a, str) for a in architectures):
        return None
    return "is not a model's config.json (it has neither model_type nor architectures)"


def _known_gemm_backends(backends: list[str] | None) -> list[str] | None:
    unknown = [b for b in backends or () if b not in GEMM_BACKENDS]
    if unknown:
        raise ValueError(f"{', '.join(map(repr, unknown))}: not a FlashInfer GEMM backend "
                         f"({', '.join(sorted(GEMM_BACKENDS))})")
    return backends


#: A GEMM backend's name as a job may give it.
GemmBackendName = Annotated[str, Field(pattern=r"^[a-z0-9_-]{1,32}$")]
#: A vLLM release as a job may name it.
VllmVersion = Annotated[str, Field(pattern=r"^[0-9][0-9A-Za-z.+_-]{0,63}$")]


class JobOptions(BaseModel):
    """How a job is tuned, beside its key and model config: what a job keeps
    (``tuning_jobs.options``) and its worker tunes with, each field as
    :class:`TuningJobCreate` takes it. Unknown fields are refused, as are values the contract
    refuses now (a row stored before a rule, or written past the API: its job fails, naming it).
    """

    model_config = ConfigDict(extra="forbid")

    gemm_backends: list[GemmBackendName] | None = Field(default=None, max_length=8)
    stages: list[TunableStage] | None = Field(default=None, min_length=1, max_length=8)
    warmup: Literal["stages", "vllm"] = "stages"
    engine_args: EngineArgs | None = None
    vllm_version: VllmVersion | None = None

    @field_validator("warmup", mode="before")
    @classmethod
    def _stored_default(cls, warmup: str | None) -> str:
        return warmup or "stages"  # rows stored before the vLLM warmup hold null

    @field_validator("gemm_backends")
    @classmethod
    def _known_backends(cls, backends: list[str] | None) -> list[str] | None:
        return _known_gemm_backends(backends)

    @model_validator(mode="after")
    def _variant_needs_vllm(self) -> "JobOptions":
        if self.engine_args and self.warmup != "vllm":
            raise ValueError("engine_args name an engine variant, which only warmup 'vllm' tunes")
        return self


class TuningJobCreate(BaseModel):
    """Body of ``POST /v1/tuning-jobs``: tune this key on a GPU node that has its GPU.

    ``hf_config`` is the model's Hugging Face ``config.json`` (an object, at most
    :data:`MAX_HF_CONFIG_BYTES` as JSON); without it the GPU node tunes with the
    ``config.json`` of ``key.model`` (``org/name``) in its model config directory
    (``TUNECACHE_MODEL_CONFIG_DIR``: ``<dir>/org/name/config.json``), and the job fails when
    the node has none or the model is not in it. Nothing else on the node is read.
    """

    model_config = ConfigDict(extra="forbid")

    key: TuningKey
    hf_config: dict[str, Any] | None = None
    gemm_backends: list[GemmBackendName] | None = Field(default=None, max_length=8)
    """FlashInfer GEMM backends to tune (default: the tuner's per-arch choice)."""
    stages: list[TunableStage] | None = Field(default=None, min_length=1, max_length=8)
    """Run only these tuner stages (default: every stage that applies to the model)."""
    warmup: Literal["stages", "vllm"] = "stages"
    """``stages``: tunecache's own warmup stages; ``vllm``: vLLM's own boot on the GPU node,
    whose run is the whole warm state (the node needs vLLM: the tuner image)."""
    engine_args: EngineArgs | None = None
    """The engine variant to tune (``vllm.LLM`` arguments over the node's
    ``TUNECACHE_VLLM_ENGINE_ARGS``, e.g. ``{"max_model_len": 8192}``; only those the allow-list
    takes: :mod:`tunecache.contract.engine_args`); needs ``warmup="vllm"``."""
    vllm_version: VllmVersion | None = None
    """Only a job worker whose image has this vLLM takes it (``"0.26.0"``): a fleet's upgrade
    tuned before the first pod of the new image boots (``None``: any worker of the GPU)."""

    @field_validator("hf_config")
    @classmethod
    def _config_is_small_storable_json(cls, config: dict[str, Any] | None) -> dict[str, Any] | None:
        if config is None:
            return None
        encoded = _storable_json(config)
        if len(encoded) > MAX_HF_CONFIG_BYTES:
            raise ValueError(f"is {len(encoded)} bytes as JSON; at most {MAX_HF_CONFIG_BYTES}")
        if problem := not_a_model_config(config):
            raise ValueError(problem)
        return config

    @field_validator("gemm_backends")
    @classmethod
    def _known_backends(cls, backends: list[str] | None) -> list[str] | None:
        return _known_gemm_backends(backends)

    @model_validator(mode="after")
    def _matchable(self) -> "TuningJobCreate":
        if problems := self.key.unmatchable():
            raise ValueError("key." + "; key.".join(problems))
        if self.engine_args and self.warmup != "vllm":
            raise ValueError("engine_args name an engine variant, which only warmup 'vllm' tunes")
        return self

    def options(self) -> JobOptions:
        """The options the job keeps."""
        return JobOptions(gemm_backends=self.gemm_backends, stages=self.stages, warmup=self.warmup,
                          engine_args=self.engine_args, vllm_version=self.vllm_version)


class WorkerStatus(BaseModel):
    """Whether this node runs tuning jobs, for which GPU, or why not."""

    enabled: bool
    gpu_name: str | None = None
    arch: str | None = None
    name: str | None = None
    reason: str | None = None


class Health(BaseModel):
    """Answer of ``GET /v1/health``: only ``status`` without a token; the rest with one.

    ``degraded``: the node still answers what it can (cached lookups, artifacts from the
    database or its mirror), and ``problems`` says what is wrong (the database did not
    answer in time; the artifact mirror cannot be written)."""

    status: Literal["ok", "degraded"]
    problems: list[str] | None = None
    database: str | None = None
    schema_revision: str | None = None
    worker: WorkerStatus | None = None
    max_upload_bytes: int | None = None
    """The largest artifact upload the service takes (``TUNECACHE_MAX_UPLOAD_BYTES``), for a
    caller with a token: ``tunecache push`` refuses a larger file before uploading it."""


class TuningJobRead(BaseModel):
    """A tuning job (``GET /v1/tuning-jobs/{id}``): state, progress and timings."""

    id: int
    key: TuningKey
    status: JobStatus
    stage: str | None
    step: int | None
    total: int | None
    log_tail: str | None
    """The tuner's last output (``None`` to readers below ``admin``: it names the node's hosts
    and paths)."""
    worker: str | None
    """The job worker running it (``host:pid``); ``"(hidden)"`` to readers below ``admin``."""
    attempts: int
    error: str | None
    run_id: int | None
    created_at: dt.datetime
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    lease_expires_at: dt.datetime | None
    duration_s: float | None
    cancel_requested_at: dt.datetime | None = None
    """When ``DELETE /v1/tuning-jobs/{id}`` asked to stop this running job (its worker
    stops the tuner within seconds and records it ``cancelled``)."""
    cancelled_by: str | None = None
    """The name of the token that cancelled the job (or asked to); ``"(hidden)"`` to readers
    below ``admin``."""
    warmup: Literal["stages", "vllm"] = "stages"
    """The warmup it runs (:attr:`TuningJobCreate.warmup`)."""
    engine_args: dict[str, Any] | None = None
    """The engine variant it tunes (:attr:`TuningJobCreate.engine_args`; ``None``: the node's own)."""
    vllm_version: str | None = None
    """The vLLM of the image it is for (:attr:`TuningJobCreate.vllm_version`; ``None``: any)."""


class JobOptionDifference(BaseModel):
    """One option in which a job request differs from the job already active for its key.

    ``active`` and ``requested`` are the option's values (``stages`` and ``gemm_backends``:
    sorted lists, ``None`` = the tuner's default); for ``hf_config`` they are
    ``"sha256:<first 16 hex digits>"`` of the config's canonical JSON, or ``None`` (the
    node's own config from its ``TUNECACHE_MODEL_CONFIG_DIR``), never the config itself.
    """

    field: str
    active: Any = None
    requested: Any = None

    def __str__(self) -> str:
        def shown(value: Any) -> str:
            if value is None:
                return "node's config" if self.field == "hf_config" else "default"
            return ",".join(value) if isinstance(value, list) else str(value)

        return f"{self.field}: job {shown(self.active)}, yours {shown(self.requested)}"


class JobConflict(BaseModel):
    """Body of a 409 of ``POST /v1/tuning-jobs``: a job for the key is already queued or
    running with other options (single-flight holds only for identical requests). Wait for
    job ``job_id`` or cancel it (``DELETE /v1/tuning-jobs/{job_id}``), then ask again."""

    detail: str
    job_id: int
    job_status: JobStatus
    differences: list[JobOptionDifference]


class WorkerRead(BaseModel):
    """A GPU job worker as its heartbeats describe it (``GET /v1/workers``).

    ``live``: it has beaten within the service's live window (``WorkerList.live_window_s``)
    and has not said it stopped; only a live worker of a job's ``gpu_name`` and ``arch``
    will take the job. ``model_config_dir``: it has a ``TUNECACHE_MODEL_CONFIG_DIR``, so it
    can tune jobs that carry no ``hf_config`` (for models whose config lies there).
    """

    name: str
    """``host:pid``; ``"(hidden)"`` to readers below ``admin``."""
    gpu_name: str
    arch: str
    model_config_dir: bool
    vllm_version: str | None = None
    """The vLLM of its image (``None``: none there)."""
    heartbeat_s: float
    """Seconds between its heartbeats."""
    started_at: dt.datetime
    last_seen: dt.datetime
    stopped_at: dt.datetime | None = None
    seen_s_ago: float
    """Seconds since its last heartbeat, by the service's clock."""
    live: bool


class WorkerList(BaseModel):
    """Answer of ``GET /v1/workers``: the workers seen in the last day, latest heartbeat first."""

    live_window_s: float
    """A worker is live when its last heartbeat is at most this many seconds old."""
    items: list[WorkerRead]

    def live_for(self, gpu_name: str, arch: str) -> list[WorkerRead]:
        """The live workers that take jobs for ``gpu_name`` on ``arch``."""
        return [w for w in self.items if w.live and w.gpu_name == gpu_name and w.arch == arch]


class TuningJobPage(BaseModel):
    """A page of ``GET /v1/tuning-jobs``, newest first."""

    items: list[TuningJobRead]
    total: int
    limit: int
    offset: int
