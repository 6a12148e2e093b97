"""What the tuner makes, typed: each artifact a harvester harvested (:class:`HarvestedArtifact`)
and the child's result (:class:`TunerSummary`), which crosses from the child process to its
parent as the ``summary`` of a :class:`tunecache.contract.TunerFinished` event and is parsed
with this model there (:func:`tunecache.service.tuner.process.run_tuner`): a result the model
refuses is a failed tuning, never a half-read one.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tunecache.contract import ArtifactKind, EnvironmentMetadata


class HarvestedArtifact(BaseModel):
    """One artifact a harvester wrote into the tuner's output directory
    (:mod:`tunecache.service.tuner.harvest`): its kind, the name it is recorded under, its
    media type, where its bytes are (``path``, relative to the output directory) and, for a
    FlashInfer JIT module, the module's name."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: ArtifactKind
    name: str = Field(min_length=1, max_length=512)
    media_type: str = Field(min_length=1, max_length=128)
    path: str = Field(min_length=1, max_length=1024)
    module: str | None = None

    @field_validator("path")
    @classmethod
    def _inside_the_output_directory(cls, path: str) -> str:
        parts = PurePosixPath(path)
        if parts.is_absolute() or ".." in parts.parts:
            raise ValueError(f"{path!r} is not a path inside the tuner's output directory")
        return path

    def description(self) -> HarvestedArtifact:
        """This artifact without its module's name (as the run records it)."""
        return self.model_copy(update={"module": None})


class TunerSummary(BaseModel):
    """The tuner child's result: the GPU and environment it tuned on, the run summary's fields
    (:data:`RUN_FIELDS`, those it set) and the artifacts it harvested."""

    model_config = ConfigDict(extra="forbid")

    #: The fields stored as the run's ``summary`` (when the child set them).
    RUN_FIELDS: ClassVar[tuple[str, ...]] = ("entries", "tuning_seconds", "stages", "jit_modules", "flashinfer_jit",
                                             "vllm_compile", "dependencies", "deep_gemm_m_set")

    gpu_name: str
    arch: str
    environment: EnvironmentMetadata
    entries: int = Field(ge=0)
    tuning_seconds: float = Field(ge=0)
    stages: dict[str, dict[str, Any]]
    jit_modules: list[str] = Field(default_factory=list)
    flashinfer_jit: dict[str, str] = Field(default_factory=dict)
    dependencies: dict[str, str] = Field(default_factory=dict)
    vllm_compile: dict[str, Any] | None = None
    #: the block Ms the run's DeepGEMM cache was warmed up with (:mod:`tunecache.engines.vllm.deep_gemm`)
    deep_gemm_m_set: dict[str, Any] | None = None
    artifacts: list[HarvestedArtifact]

    def run_summary(self) -> dict[str, Any]:
        """The run's ``summary``: :data:`RUN_FIELDS` the child set, as JSON values."""
        return self.model_dump(mode="json", include=set(self.RUN_FIELDS), exclude_unset=True)
