"""Tuning runs: artifacts, recording and reading runs, run signatures, verifications, and
lookups and their misses. The history's query, pages, cursors and CSV export are in
:mod:`.history`, run diffs in :mod:`.diffs`."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator, model_validator

from tunecache.contract.identity import (
    INDETERMINATE_VALUES,
    SHA256_PATTERN,
    EnvironmentMetadata,
    FieldDifference,
    StrEnum,
    Text,
    TuningKey,
    Variant,
    _storable_json,
)
from tunecache.contract.gpu_arch import arch_mismatch
from tunecache.contract.kinds import KINDS, ArtifactKind


#: Largest FlashInfer autotune file (``flashinfer_autotune_v1`` artifact) the service reads,
#: in bytes: recording a run checks it with FlashInfer's loader rules and a diff parses it,
#: so this bounds their memory and time (a 4 MiB file: about 20,000 entries, 1-2 s and
#: 100 MB to check; the real files are a few kB to a few hundred kB). A run whose file is
#: larger is refused (422).
MAX_AUTOTUNE_FILE_BYTES = 4 * 1024 * 1024


class RunStatus(StrEnum):
    """How a tuning run ended. Only ``succeeded`` runs can become current."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"


class RunTrigger(StrEnum):
    """Who recorded a run: ``upload`` (``tunecache push`` of a file), ``cli``
    (``tunecache tune`` on a GPU node), ``http`` (a tuning job), ``pod`` (a pod's own
    local tuning, stored unverified and never current)."""

    UPLOAD = "upload"
    CLI = "cli"
    HTTP = "http"
    POD = "pod"


class ArtifactCreate(BaseModel):
    """An artifact of a run, referring to bytes already uploaded with ``PUT /v1/artifacts/{sha256}``."""

    model_config = ConfigDict(extra="forbid")

    kind: ArtifactKind
    name: str = Field(
        min_length=1,
        max_length=255,
        pattern=r"^[A-Za-z0-9_@+-][A-Za-z0-9_.@+-]*(/[A-Za-z0-9_@+-][A-Za-z0-9_.@+-]*)*$",
        description="relative path of '/'-separated parts, none starting with '.'",
    )
    media_type: str = Field(default="application/octet-stream", min_length=1, max_length=128)
    sha256: str = Field(pattern=SHA256_PATTERN)


class RunSignature(BaseModel):
    """A detached Ed25519 signature over a run's manifest (:mod:`tunecache.signing`):
    the tuning key, the environment and every artifact's kind, name and sha256."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key_id: str = Field(pattern=r"^[0-9a-f]{16}$", description="first 16 hex digits of sha256 of the raw public key")
    signature: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9+/=]+$",
                           description="base64 of the 64-byte Ed25519 signature")
    manifest: int = Field(default=1, ge=1, le=2, description="the manifest format signed: 2 includes the summary's "
                                                              "install fields (tunecache.signing.install_fields)")
    signed_at: int | None = Field(default=None, ge=0, le=1 << 40,
                                  description="manifest 2: when it was signed (seconds since the epoch); pods never "
                                              "install a run signed before one they installed for the key")
    expires_at: int | None = Field(default=None, ge=0, le=1 << 40,
                                   description="manifest 2: after this (seconds since the epoch) pods refuse the signature")



class TuningRunCreate(BaseModel):
    """Body of ``POST /v1/tunings``: one finished tuning run of a key in an environment.

    A succeeded run needs a ``flashinfer_autotune_v1`` artifact (FlashInfer's file).
    ``trigger`` says who recorded it (:class:`RunTrigger`); the service stores a run sent
    with a ``push`` token as ``pod`` whatever it says, and only a ``tune`` (or ``admin``)
    token's run is verified and may become current.
    """

    model_config = ConfigDict(extra="forbid")

    key: TuningKey
    environment: EnvironmentMetadata
    status: RunStatus = RunStatus.SUCCEEDED
    trigger: RunTrigger = RunTrigger.UPLOAD
    node: Text | None = Field(default=None, max_length=255)
    started_at: AwareDatetime | None = None
    finished_at: AwareDatetime | None = None
    error: Text | None = Field(default=None, max_length=65536)
    summary: dict[str, Any] = Field(default_factory=dict)
    artifacts: list[ArtifactCreate] = Field(default_factory=list, max_length=10000)
    signature: RunSignature | None = None
    """The tuner node's signature over the run's manifest; pods install JIT modules and
    DeepGEMM caches only from runs signed by a key they trust."""
    variant: Variant | None = None
    """The engine variant its compile cache is for (``summary.vllm_compile.variant_factors``);
    ``None``: the run has no compile cache. The service keeps a current run per variant."""

    @field_validator("summary")
    @classmethod
    def _summary_is_storable_json(cls, summary: dict[str, Any]) -> dict[str, Any]:
        _storable_json(summary)
        return summary

    @model_validator(mode="after")
    def _consistent(self) -> "TuningRunCreate":
        if self.started_at and self.finished_at and self.finished_at < self.started_at:
            raise ValueError("finished_at is earlier than started_at")
        names = [a.name for a in self.artifacts]
        if len(names) != len(set(names)):
            raise ValueError("artifact names must be unique within a run")
        if self.status is RunStatus.SUCCEEDED:
            for required in (kind for kind, facts in KINDS.items() if facts.required):
                if not any(a.kind is required for a in self.artifacts):
                    raise ValueError(f"a succeeded run needs a {required} artifact (FlashInfer's cache file)")
        if problems := self.key.unmatchable():
            raise ValueError("key." + "; key.".join(problems))
        if self.environment.gpu not in INDETERMINATE_VALUES and self.environment.gpu != self.key.gpu_name:
            raise ValueError(f"key.gpu_name {self.key.gpu_name!r} is not the GPU the file was tuned on "
                             f"(_metadata.gpu {self.environment.gpu!r}); pods on {self.key.gpu_name} would get tactics "
                             "of another GPU")
        if self.environment.gpu not in INDETERMINATE_VALUES and (wrong := arch_mismatch(self.environment.gpu,
                                                                                        self.key.arch)):
            raise ValueError(wrong)
        return self


class PromoteRequest(BaseModel):
    """Body of ``POST /v1/tunings/{id}/promote`` (optional): the run's manifest signed anew
    (``tunecache promote RUN --signing-key KEY``), so that pods that installed a newer run
    take this older one as a new version."""

    model_config = ConfigDict(extra="forbid")

    signature: RunSignature | None = None


#: A distribution's name as ``importlib.metadata`` knows it (``torch``, ``apache-tvm-ffi``).
DISTRIBUTION_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
#: The most package versions a lookup's ``dependencies`` names.
MAX_DEPENDENCIES = 16
#: Package versions by distribution name (a lookup's ``dependencies``, a run's ``summary.dependencies``).
PackageVersions = Annotated[
    dict[Annotated[str, Field(pattern=DISTRIBUTION_PATTERN)], Annotated[Text, Field(max_length=64)]],
    Field(max_length=MAX_DEPENDENCIES),
]


class LookupRequest(BaseModel):
    """Body of ``POST /v1/tunings/lookup``: the pod's key and its FlashInfer environment, and
    with ``variant`` its engine variant: the answer is then the variant's current run where it
    has one, else the key's current run (whose ``variant`` says which it is).

    ``dependencies``: the pod's versions of the packages a run's warm state is built with
    (``tunecache.formats.dependencies.installed_versions``: torch, Triton, TVM-FFI), its
    *image*. Where the run the answer would be was made on another image and the pod's image
    has a current run of the key (or variant) of its own, the answer is that run; without
    ``dependencies``, the answer is as before them."""

    model_config = ConfigDict(extra="forbid")

    key: TuningKey
    environment: EnvironmentMetadata
    variant: Variant | None = None
    dependencies: PackageVersions | None = None


class ArtifactRead(BaseModel):
    """An artifact of a stored run. ``kind`` is kept as text so that a client reads
    runs with kinds a newer server knows."""

    kind: str
    name: str
    media_type: str
    sha256: str
    size_bytes: int
    download_path: str
    """Relative URL that streams the bytes: ``/v1/artifacts/{sha256}``."""


class CompiledKind(StrEnum):
    """What a boot can still compile (or tune) when its warm state is not all there; a pod's
    attestation counts each (:attr:`PodReportCreate.compiled`).

    * ``flashinfer_jit_modules``: FlashInfer JIT modules built (``.so`` files written in the
      FlashInfer workspace during the boot);
    * ``dynamo_traces``: graphs vLLM's torch.compile traced; not counted by today's pods
      (vLLM 0.25 runs Dynamo's bytecode transform in every boot, one at the floor too);
    * ``inductor_graphs``: graphs Inductor compiled (vLLM's ``num_compiled_artifacts_saved``:
      loaded ones are not counted);
    * ``aot_compiles``: AOT compilations (vLLM's ``num_aot_compiles``);
    * ``triton_kernels``: Triton kernels compiled (``.cubin`` files written in Triton's and
      Inductor's caches);
    * ``deep_gemm_kernels``: DeepGEMM kernels built (``kernel.*`` directories written);
    * ``model_inspections``: model classes vLLM inspected (``modelinfos`` files written);
    * ``autotune_ops``: operations FlashInfer's autotuner profiled.
    """

    FLASHINFER_JIT_MODULES = "flashinfer_jit_modules"
    DYNAMO_TRACES = "dynamo_traces"
    INDUCTOR_GRAPHS = "inductor_graphs"
    AOT_COMPILES = "aot_compiles"
    TRITON_KERNELS = "triton_kernels"
    DEEP_GEMM_KERNELS = "deep_gemm_kernels"
    MODEL_INSPECTIONS = "model_inspections"
    AUTOTUNE_OPS = "autotune_ops"


def compiled_summary(counts: dict[CompiledKind, int]) -> str:
    """``nothing`` or ``2 inductor_graphs, 14 triton_kernels``: the kinds counted above 0, as
    a pod's attestation line, a run's verification and the audit log say them."""
    parts = [f"{n} {CompiledKind(kind).value}" for kind, n in counts.items() if n]
    return ", ".join(parts) if parts else "nothing"


class RunVerification(BaseModel):
    """A run's verification boot (``PUT /v1/tunings/{id}/verification``): after a vLLM
    warmup is recorded, its node boots vLLM once more in a new process with every cache
    empty, as a pod boots: the plugin fetches the stored run from the service and installs
    it, and the boot counts what it still compiled (the pod's attestation).

    * ``compiled``: by :class:`~tunecache.contract.reports.CompiledKind`; all 0 (or empty) when
      the run boots at the floor;
    * ``ready_s``: ``LLM(...)`` to ready, seconds;
    * ``clean``: nothing compiled and no error: the run boots clean;
    * ``error``: why the boot did not get that far (``None`` when it did).
    """

    model_config = ConfigDict(extra="forbid")

    compiled: dict[CompiledKind, Annotated[int, Field(ge=0, le=1_000_000)]] = Field(default_factory=dict)
    ready_s: float | None = Field(default=None, ge=0, le=86400)
    error: Text | None = Field(default=None, max_length=2000)

    @property
    def clean(self) -> bool:
        return self.error is None and not any(self.compiled.values())


class TuningRunRead(BaseModel):
    """One stored tuning run (``GET /v1/tunings/{id}``, a lookup's 200)."""

    id: int
    key: TuningKey
    environment: EnvironmentMetadata
    environment_hash: str
    status: RunStatus
    trigger: RunTrigger
    node: str | None
    """The host it was tuned on (a pod's, for a pod's run); ``"(hidden)"`` to readers below
    ``admin`` (docs/trust.md, "What reads show")."""
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    duration_s: float | None
    """Seconds from ``started_at`` to ``finished_at``."""
    error: str | None
    summary: dict[str, Any]
    """What the tuner measured: ``entries``, ``tuning_seconds``, ``stages``,
    ``jit_modules``, ``flashinfer_jit`` (free-form JSON; ``entries`` for every run)."""
    verified: bool
    """Recorded with a ``tune`` or ``admin`` token (or by a node on the database itself)."""
    is_current: bool
    created_at: dt.datetime
    artifacts: list[ArtifactRead]
    signature: RunSignature | None = None
    recorded_by: str | None = None
    """The name of the token that recorded the run (``None``: recorded on the database);
    ``"(hidden)"`` to readers below ``admin``."""
    held: str | None = None
    """Why this succeeded run is not current though it could be (the service's promotion
    policy held it back: not signed by a key the service trusts, emptier than the current run,
    a regression the run diff flags; ``tunecache promote`` makes it current anyway), or, for a
    run recorded with a ``push`` token (trigger ``pod``), that it never becomes current."""
    signature_verified: bool | None = None
    """Whether the service checked the signature against its own trusted keys
    (``TUNECACHE_TRUSTED_KEYS`` on the server; ``None``: it has none, or the run is unsigned)."""
    verification: RunVerification | None = None
    """Its verification boot (:class:`RunVerification`; ``None``: none was made, e.g. not a
    vLLM warmup, or one recorded without a server to fetch from)."""
    pinned: bool = False
    """An admin pinned it (``PUT /v1/tunings/{id}/pin``): the service's retention
    (``TUNECACHE_RUN_RETENTION``) never deletes it."""
    variant: str | None = None
    """The engine variant its compile cache is for (``None``: it has none)."""
    retired_at: AwareDatetime | None = None
    """When an admin retired it (``POST /v1/tunings/{id}/retire``): never current or served again."""

    def artifact(self, kind: ArtifactKind) -> ArtifactRead | None:
        """The run's first artifact of ``kind``, or ``None``."""
        return next((a for a in self.artifacts if a.kind == kind), None)

    def artifacts_of(self, kind: ArtifactKind) -> list[ArtifactRead]:
        """The run's artifacts of ``kind``, in the order they were recorded."""
        return [a for a in self.artifacts if a.kind == kind]

    @property
    def entries(self) -> int | None:
        """Number of entries in the run's FlashInfer file, when recorded."""
        value = self.summary.get("entries")
        return value if isinstance(value, int) else None


class ClosestTuning(BaseModel):
    """A stored tuning near what was asked for, and every field in which it differs."""

    run_id: int
    key: TuningKey
    environment_hash: str
    differences: list[FieldDifference]


class LookupMiss(BaseModel):
    """Body of the 404 of a lookup: why nothing matched and what came closest."""

    detail: str
    closest: list[ClosestTuning]

    def explain(self) -> str:
        """Multi-line text: the reason, then each closest tuning's differing fields."""
        lines = [self.detail]
        for c in self.closest:
            diffs = "; ".join(str(d) for d in c.differences)
            lines.append(f"  run {c.run_id} ({c.key.model}, {c.key.gpu_name}): {diffs}")
        return "\n".join(lines)


class ArtifactStored(BaseModel):
    """Answer of ``PUT /v1/artifacts/{sha256}``."""

    sha256: str
    size_bytes: int
    created: bool
    """False when the same bytes were already stored (uploads are idempotent)."""
