"""API schemas (pydantic). Write schemas forbid unknown fields; read schemas are built
from repository results, never returned as ORM rows."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any, Literal

import json

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator, model_validator

from tunecache.client.autotune_file import ARTIFACT_KIND
from tunecache.identity import EnvironmentMetadata, FieldDifference, Text, TuningKey

SHA256_PATTERN = r"^[0-9a-f]{64}$"
#: Largest model config a job may carry, as JSON bytes.
MAX_HF_CONFIG_BYTES = 1024 * 1024
#: Largest id and offset accepted (PostgreSQL's integer).
MAX_ID = 2**31 - 1
#: Query strings must not hold NUL (PostgreSQL text cannot).
NO_NUL = r"^[^\x00]*$"

RunStatus = Literal["succeeded", "failed"]
#: Who recorded a run: ``upload`` (``tunecache push`` of a file), ``cli`` (``tunecache tune``
#: on a GPU node), ``http`` (a tuning job), ``pod`` (a pod's own local tuning).
RunTrigger = Literal["upload", "cli", "http", "pod"]


class ArtifactCreate(BaseModel):
    """An artifact of a run, referring to bytes already uploaded with ``PUT /v1/artifacts/{sha256}``."""

    model_config = ConfigDict(extra="forbid")

    kind: str = Field(min_length=1, max_length=64, pattern=r"^[a-z0-9_.-]+$")
    name: str = Field(
        min_length=1,
        max_length=255,
        pattern=r"^[A-Za-z0-9_@+-][A-Za-z0-9_.@+-]*(/[A-Za-z0-9_@+-][A-Za-z0-9_.@+-]*)*$",
        description="relative path of '/'-separated parts, none starting with '.'",
    )
    media_type: str = Field(default="application/octet-stream", min_length=1, max_length=128)
    sha256: str = Field(pattern=SHA256_PATTERN)


class ArtifactRead(BaseModel):
    kind: str
    name: str
    media_type: str
    sha256: str
    size_bytes: int
    download_path: str
    """Relative URL that streams the bytes: ``/v1/artifacts/{sha256}``."""


class TuningRunCreate(BaseModel):
    """Body of ``POST /v1/tunings``: one finished tuning run of a key in an environment."""

    model_config = ConfigDict(extra="forbid")

    key: TuningKey
    environment: EnvironmentMetadata
    status: RunStatus = "succeeded"
    trigger: RunTrigger = "upload"
    node: Text | None = Field(default=None, max_length=255)
    started_at: AwareDatetime | None = None
    finished_at: AwareDatetime | None = None
    error: Text | None = Field(default=None, max_length=65536)
    summary: dict[str, Any] = Field(default_factory=dict)
    artifacts: list[ArtifactCreate] = Field(default_factory=list, max_length=10000)

    @field_validator("summary")
    @classmethod
    def _summary_is_storable_json(cls, summary: dict[str, Any]) -> dict[str, Any]:
        try:
            encoded = json.dumps(summary, allow_nan=False)
        except ValueError:
            raise ValueError("must not contain NaN or Infinity") from None
        if "\\u0000" in encoded:
            raise ValueError("must not contain NUL characters")
        return summary

    @model_validator(mode="after")
    def _consistent(self) -> "TuningRunCreate":
        if self.started_at and self.finished_at and self.finished_at < self.started_at:
            raise ValueError("finished_at is earlier than started_at")
        names = [a.name for a in self.artifacts]
        if len(names) != len(set(names)):
            raise ValueError("artifact names must be unique within a run")
        if self.status == "succeeded" and not any(a.kind == ARTIFACT_KIND for a in self.artifacts):
            raise ValueError(f"a succeeded run needs a {ARTIFACT_KIND} artifact (FlashInfer's cache file)")
        return self


class TuningRunRead(BaseModel):
    id: int
    key: TuningKey
    environment: EnvironmentMetadata
    environment_hash: str
    status: str
    trigger: str
    node: str | None
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    duration_s: float | None
    error: str | None
    summary: dict[str, Any]
    verified: bool
    is_current: bool
    created_at: dt.datetime
    artifacts: list[ArtifactRead]


class TuningRunPage(BaseModel):
    items: list[TuningRunRead]
    total: int
    limit: int
    offset: int


class LookupRequest(BaseModel):
    """Body of ``POST /v1/tunings/lookup``: the pod's key and its FlashInfer environment."""

    model_config = ConfigDict(extra="forbid")

    key: TuningKey
    environment: EnvironmentMetadata


class ClosestTuning(BaseModel):
    run_id: int
    key: TuningKey
    environment_hash: str
    differences: list[FieldDifference]


class LookupMiss(BaseModel):
    """Body of the 404 of a lookup: why nothing matched and what came closest."""

    detail: str
    closest: list[ClosestTuning]


class ArtifactStored(BaseModel):
    sha256: str
    size_bytes: int
    created: bool
    """False when the same bytes were already stored (uploads are idempotent)."""


class WorkerStatus(BaseModel):
    """Whether this node runs tuning jobs, for which GPU, or why not."""

    enabled: bool
    gpu_name: str | None = None
    arch: str | None = None
    name: str | None = None
    reason: str | None = None


class Health(BaseModel):
    status: Literal["ok"]
    database: str
    schema_revision: str | None
    worker: WorkerStatus


JobStatus = Literal["queued", "running", "succeeded", "failed"]


class TuningJobCreate(BaseModel):
    """Body of ``POST /v1/tuning-jobs``: tune this key on a GPU node that has its GPU.

    ``hf_config`` is the model's Hugging Face ``config.json`` (an object); without it the
    worker reads the config from ``key.model`` on its node (a local path or a model type).
    """

    model_config = ConfigDict(extra="forbid")

    key: TuningKey
    hf_config: dict[str, Any] | None = None
    """The model's ``config.json`` (at most 1 MiB as JSON; real ones are a few kB)."""
    gemm_backends: list[Annotated[str, Field(pattern=r"^[a-z0-9_-]{1,32}$")]] | None = Field(default=None, max_length=8)
    """FlashInfer GEMM backends to tune (default: the tuner's per-arch choice)."""
    stages: list[Literal["gemm", "moe", "attention"]] | None = Field(default=None, min_length=1, max_length=8)
    """Run only these tuner stages (default: every stage that applies to the model)."""

    @field_validator("hf_config")
    @classmethod
    def _config_is_small_storable_json(cls, config: dict[str, Any] | None) -> dict[str, Any] | None:
        if config is None:
            return None
        try:
            encoded = json.dumps(config, allow_nan=False)
        except ValueError:
            raise ValueError("must not contain NaN or Infinity") from None
        if len(encoded) > MAX_HF_CONFIG_BYTES:
            raise ValueError(f"is {len(encoded)} bytes as JSON; at most {MAX_HF_CONFIG_BYTES}")
        if "\\u0000" in encoded:
            raise ValueError("must not contain NUL characters")
        return config


class TuningJobRead(BaseModel):
    id: int
    key: TuningKey
    status: str
    stage: str | None
    step: int | None
    total: int | None
    log_tail: str | None
    worker: str | None
    attempts: int
    error: str | None
    run_id: int | None
    created_at: dt.datetime
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    lease_expires_at: dt.datetime | None
    duration_s: float | None


class TuningJobPage(BaseModel):
    items: list[TuningJobRead]
    total: int
    limit: int
    offset: int
