"""``tunecache doctor --json``'s document: before a rollout, what of the server's run will load
in this image, kind by kind, and why not, with doctor's exit code (pull's decision).

The schema is stable: a field is only ever added; a change that removes or changes the meaning
of one bumps :data:`SCHEMA_VERSION`. docs/pods.md describes it for the pipelines that read it.

The verdicts are :func:`tunecache.client.preflight.preflight`'s, the same checks the install
makes (each destination's ``preflight``, the trust decision, the package versions the run was
built with against this image's); this module only says them as a document.
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import importlib.util
import platform
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from tunecache.contract import ArtifactKind, EnvironmentMetadata, LookupMiss, TuningKey, TuningRunRead

#: The version of :class:`DoctorReport`'s schema.
SCHEMA_VERSION = 1


class ImageVersions(BaseModel):
    """The versions this image's packages have (``None``: not installed), which decide what
    of a run loads: vLLM (as vLLM names itself, ``vllm.__version__``, else its distribution's
    version), FlashInfer (``flashinfer-python``), torch, Triton (their distributions'
    versions, ``importlib.metadata``) and Python (``platform.python_version()``, the full
    version torch's compiled-artifact check compares)."""

    model_config = ConfigDict(extra="forbid")

    vllm: str | None
    flashinfer: str | None
    torch: str | None
    triton: str | None
    python: str


class KindVerdict(BaseModel):
    """What becomes of one kind of the run's artifacts in this image."""

    model_config = ConfigDict(extra="forbid")

    kind: ArtifactKind
    loads: bool | None = Field(description="true: loads; false: will not load; null: the engine's arguments decide "
                                           "(only vLLM's config tells, at the boot)")
    why: str = Field(description="one line: where it goes, or why it will not load")


class RunFound(BaseModel):
    """The run the server answers this image's lookup with."""

    model_config = ConfigDict(extra="forbid")

    id: int
    entries: int | None = Field(description="entries of its FlashInfer autotune file")
    created_at: dt.datetime
    finished_at: dt.datetime | None
    artifacts: list[ArtifactKind] = Field(description="the kinds of its artifacts, sorted")
    built_with: dict[str, str] | None = Field(
        description="the package versions the tuner recorded (its summary's dependencies; null: none recorded)")


class DoctorReport(BaseModel):
    """``tunecache doctor --json``: the whole of stdout, whatever the exit code."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = SCHEMA_VERSION
    exit_code: int = Field(description="doctor's exit code, also the process's (docs/pods.md's table)")
    error: str | None = Field(None, description="the one line doctor says on error (null: none)")
    key: TuningKey | None = Field(None, description="the key this image asks for (null: not built, see error)")
    environment: EnvironmentMetadata | None = Field(
        None, description="FlashInfer's environment fields (null: not read, see error)")
    image: ImageVersions
    run: RunFound | None = Field(None, description="the matching run (null: none, see miss or error)")
    miss: LookupMiss | None = Field(None, description="on exit 3: why nothing matched and the closest runs")
    kinds: list[KindVerdict] = Field(default_factory=list, description="per kind of the run: will it load, and why")


def _distribution(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _vllm_version() -> str | None:
    """vLLM's version as vLLM says it (what the compile cache's check compares), where it is
    importable; else its distribution's; ``None``: no vLLM in this image."""
    try:
        if importlib.util.find_spec("vllm") is not None:
            import vllm

            return str(vllm.__version__)
    except Exception:  # a vLLM that cannot be imported here still has its distribution's version
        pass
    return _distribution("vllm")


def image_versions() -> ImageVersions:
    """This image's :class:`ImageVersions`."""
    return ImageVersions(vllm=_vllm_version(), flashinfer=_distribution("flashinfer-python"),
                         torch=_distribution("torch"), triton=_distribution("triton"),
                         python=platform.python_version())


def run_found(run: TuningRunRead) -> RunFound:
    """The :class:`RunFound` of a looked-up run."""
    recorded = run.summary.get("dependencies")
    built_with = {str(k): str(v) for k, v in recorded.items()} if isinstance(recorded, dict) else None
    return RunFound(id=run.id, entries=run.entries, created_at=run.created_at, finished_at=run.finished_at,
                    artifacts=sorted({a.kind for a in run.artifacts}), built_with=built_with)
