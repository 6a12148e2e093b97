"""The contract both sides of tunecache speak: identity, names, and the API's models.

Everything that crosses the wire between a pod (``tunecache-client``) and the service
(``tunecache-server``), or that both store and compare, is defined here once:

* identity: :class:`TuningKey` (what a pod asks for) and :class:`EnvironmentMetadata`
  (FlashInfer's ``_metadata`` fields), :func:`differences` between two of them;
* names: :class:`ArtifactKind` with its media types, :class:`RunStatus`,
  :class:`RunTrigger`, :class:`JobStatus`, :class:`Stage`;
* write models (``extra="forbid"``: a misspelt field is an error): :class:`ArtifactCreate`,
  :class:`TuningRunCreate`, :class:`LookupRequest`, :class:`TuningRunQuery`, :class:`TuningJobCreate`;
* read models (unknown fields ignored, so an older client reads a newer server):
  :class:`TuningRunRead`, :class:`TuningRunPage`, :class:`LookupMiss`,
  :class:`TuningJobRead`, :class:`TuningJobPage`, :class:`ArtifactStored`, :class:`Health`;
* the tuner's progress events, one discriminated union (:data:`TunerEvent`), read by the
  service's worker and by the client's progress bar.

The service builds its SQL schema's constraints and its routes from these; the client
returns these models, never dicts. Pure Python: pydantic only.
"""

from __future__ import annotations

import datetime as dt
import enum
import hashlib
import json
from typing import Annotated, Any, Literal, Union, get_args

from pydantic import (
    AfterValidator,
    BeforeValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

try:
    from enum import StrEnum
except ImportError:  # Python 3.10

    class StrEnum(str, enum.Enum):  # type: ignore[no-redef]
        """``enum.StrEnum`` of Python 3.11: members are their values as strings."""

        def __str__(self) -> str:
            return str(self.value)


# --------------------------------------------------------------------------- identity

#: The fields of FlashInfer 0.7's ``_metadata`` block, in the order
#: ``flashinfer.autotuner._collect_metadata`` writes them.
ENVIRONMENT_FIELDS: tuple[str, ...] = (
    "flashinfer_version",
    "cuda_version",
    "cublas_version",
    "cudnn_version",
    "cudnn_frontend_version",
    "cutlass_dsl_version",
    "gpu",
)

#: Values FlashInfer writes when it cannot detect a field (``"unknown"``) or that older
#: files lack. ``load_configs`` treats them as a (soft) mismatch, so a tuning recorded
#: with one can never be loaded: the service refuses to store it.
INDETERMINATE_VALUES: frozenset[str] = frozenset({"unknown", ""})

#: The fields of :class:`TuningKey`, in order. The service's ``tuning_keys`` unique
#: constraint is built from this list.
KEY_FIELDS: tuple[str, ...] = (
    "gpu_name",
    "arch",
    "model",
    "max_num_batched_tokens",
    "dtype",
    "quantization",
    "tensor_parallel_size",
    "data_parallel_size",
    "expert_parallel_size",
)

#: Largest ``max_num_batched_tokens`` accepted (16 Mi tokens).
MAX_NUM_BATCHED_TOKENS = 1 << 24
#: Largest id and offset accepted (PostgreSQL's integer).
MAX_ID = 2**31 - 1
#: A lowercase hex sha256.
SHA256_PATTERN = r"^[0-9a-f]{64}$"
#: Query strings must not hold NUL (PostgreSQL text cannot).
NO_NUL = r"^[^\x00]*$"
#: Largest model config a job may carry, as JSON bytes.
MAX_HF_CONFIG_BYTES = 1024 * 1024


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    return value


def _whole_number(value: Any) -> Any:
    """Integers only: ``8192`` or ``8192.0`` (JSON Schema's integer), never ``"8192"``,
    ``true`` or ``8192.5``."""
    if isinstance(value, bool) or isinstance(value, str):
        raise ValueError("must be a whole number, not " + type(value).__name__)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


#: A whole number as JSON Schema means it (no strings, booleans or fractions).
WholeNumber = Annotated[int, BeforeValidator(_whole_number)]

#: A string without NUL characters (PostgreSQL text cannot hold them); the OpenAPI schema
#: says so with a pattern, the validator with a clear message.
Text = Annotated[str, AfterValidator(_no_nul), Field(json_schema_extra={"pattern": NO_NUL})]


class EnvironmentMetadata(BaseModel):
    """FlashInfer's environment metadata: the fields ``AutoTuner.load_configs`` checks.

    Source: ``flashinfer.autotuner._collect_metadata`` (FlashInfer 0.7.4). Every value
    is a string as FlashInfer writes it, e.g. ``cudnn_version="91900"``,
    ``gpu="NVIDIA H200"``. A stored tuning is usable by a pod only when every field is
    equal: matching on less would hand a pod a file that FlashInfer then rejects.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    flashinfer_version: Text = Field(min_length=1, max_length=64)
    cuda_version: Text = Field(min_length=1, max_length=64)
    cublas_version: Text = Field(min_length=1, max_length=64)
    cudnn_version: Text = Field(min_length=1, max_length=64)
    cudnn_frontend_version: Text = Field(min_length=1, max_length=64)
    cutlass_dsl_version: Text = Field(min_length=1, max_length=4096)
    gpu: Text = Field(min_length=1, max_length=128)

    @classmethod
    def from_flashinfer_metadata(cls, metadata: dict[str, Any]) -> "EnvironmentMetadata":
        """Build from a ``_metadata`` dict as FlashInfer writes it.

        Keys FlashInfer may add in later versions are ignored; a missing field becomes
        ``"unknown"``, which FlashInfer itself treats as indeterminate.

        Raises:
            ValueError: ``metadata`` is not a JSON object, or a field is not a string or
                number, empty, too long or holds NUL (the message names the field).
        """
        if not isinstance(metadata, dict):
            raise ValueError("FlashInfer _metadata must be a JSON object")
        values = {}
        for field in ENVIRONMENT_FIELDS:
            value = metadata.get(field, "unknown")
            if isinstance(value, bool) or not isinstance(value, (str, int, float)):
                raise ValueError(f"_metadata.{field} must be a string, not {type(value).__name__}")
            values[field] = str(value)
        try:
            return cls(**values)
        except ValidationError as exc:
            error = exc.errors()[0]
            raise ValueError(f"_metadata.{error['loc'][0]}: {error['msg']}") from None

    def environment_hash(self) -> str:
        """sha256 (64 hex chars) of the canonical JSON of the fields; stable across runs."""
        canonical = json.dumps(self.model_dump(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    def indeterminate_fields(self) -> list[str]:
        """Names of fields FlashInfer could not detect (``"unknown"``)."""
        return [f for f in ENVIRONMENT_FIELDS if getattr(self, f) in INDETERMINATE_VALUES]


class TuningKey(BaseModel):
    """What a pod asks for. Two pods with equal keys (and environments) tune the same shapes.

    * ``gpu_name``: ``torch.cuda.get_device_name()``, e.g. ``"NVIDIA H200"`` (the SKU:
      H100 and H200 differ even though both are ``sm90``).
    * ``arch``: ``sm`` + compute capability, e.g. ``"sm90"``.
    * ``model``: the model name a pod passes to vLLM (``--model``).
    * ``max_num_batched_tokens``: vLLM's scheduler limit; FlashInfer tunes token buckets
      up to it.
    * ``dtype``: vLLM's ``--dtype`` (``"auto"``: as the checkpoint says).
    * ``quantization``: vLLM's ``--quantization`` (``"auto"``: as the checkpoint says).
    * ``tensor_parallel_size``: divides the GEMM shapes.
    * ``data_parallel_size``: vLLM's ``--data-parallel-size``. vLLM shards a MoE layer over
      tp x dp ranks (``vllm/config/parallel.py::ParallelConfig.data_parallel_size``; the
      fused-MoE "flattened" tp), so it changes the tuned MoE shapes.
    * ``expert_parallel_size``: 1, or with vLLM's ``--enable-expert-parallel`` the
      number of ranks the experts are split over, tp x dp (x prefill-context parallel
      size): each rank then runs whole experts, a share of them.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, from_attributes=True)

    gpu_name: Text = Field(min_length=1, max_length=128)
    arch: str = Field(pattern=r"^sm[0-9]{2,3}[a-z]?$", max_length=16)
    model: Text = Field(min_length=1, max_length=512)
    max_num_batched_tokens: WholeNumber = Field(gt=0, le=MAX_NUM_BATCHED_TOKENS)
    dtype: Text = Field(default="auto", min_length=1, max_length=32)
    quantization: Text = Field(default="auto", min_length=1, max_length=32)
    tensor_parallel_size: WholeNumber = Field(default=1, gt=0, le=1024)
    data_parallel_size: WholeNumber = Field(default=1, gt=0, le=1024)
    expert_parallel_size: WholeNumber = Field(default=1, gt=0, le=1 << 20)

    @model_validator(mode="after")
    def _expert_parallel_spans_tp_and_dp(self) -> "TuningKey":
        """vLLM splits experts over every tp x dp rank (``FusedMoEParallelConfig``), so an
        expert-parallel size that is not a multiple of that cannot come from vLLM."""
        ranks = self.tensor_parallel_size * self.data_parallel_size
        if self.expert_parallel_size != 1 and self.expert_parallel_size % ranks:
            raise ValueError(f"expert_parallel_size {self.expert_parallel_size} must be 1 or a multiple of "
                             f"tensor_parallel_size x data_parallel_size ({ranks}), as vLLM's --enable-expert-parallel makes it")
        return self


def expert_parallel_size(tensor_parallel_size: int, data_parallel_size: int = 1,
                         enable_expert_parallel: bool = False, prefill_context_parallel_size: int = 1) -> int:
    """The key's ``expert_parallel_size`` for a vLLM deployment: tp x dp x pcp with
    ``--enable-expert-parallel`` (vLLM's ``FusedMoEParallelConfig.make``: ``ep_size``), else 1."""
    if not enable_expert_parallel:
        return 1
    return tensor_parallel_size * data_parallel_size * prefill_context_parallel_size


assert tuple(TuningKey.model_fields) == KEY_FIELDS
assert tuple(EnvironmentMetadata.model_fields) == ENVIRONMENT_FIELDS


class FieldDifference(BaseModel):
    """One field in which a stored tuning differs from what was asked for."""

    field: str
    stored: str
    yours: str

    def __str__(self) -> str:
        return f"{self.field}: stored {self.stored}, yours {self.yours}"


def differences(
    stored_key: TuningKey,
    stored_environment: EnvironmentMetadata,
    key: TuningKey,
    environment: EnvironmentMetadata,
) -> list[FieldDifference]:
    """Every key and environment field in which a stored tuning differs from a request.

    Key fields come first (in :data:`KEY_FIELDS` order), then environment fields (in
    :data:`ENVIRONMENT_FIELDS` order). An empty list means the tuning is usable.
    """
    found: list[FieldDifference] = []
    for stored, yours, fields in (
        (stored_key, key, KEY_FIELDS),
        (stored_environment, environment, ENVIRONMENT_FIELDS),
    ):
        for name in fields:
            a, b = str(getattr(stored, name)), str(getattr(yours, name))
            if a != b:
                found.append(FieldDifference(field=name, stored=a, yours=b))
    return found


# ------------------------------------------------------------------------------ names


class ArtifactKind(StrEnum):
    """What an artifact of a run holds.

    * ``flashinfer_autotune_v1``: FlashInfer's autotune cache file
      (``flashinfer.autotuner.AutoTuner.save_configs``); every succeeded run has one.
    * ``flashinfer_jit_module``: one FlashInfer JIT module (``cached_ops/<module>`` and
      ``generated/<module>``) as a gzipped tarball with nanosecond file times.
    * ``deep_gemm_jit_cache``: DeepGEMM's JIT cache directory as a gzipped tarball.
    * ``vllm_flashinfer_autotune_v1``: one of vLLM's per-rank autotune files.
    * ``flashinfer_autotune_v2_store``: FlashInfer's v2 store directory as a gzipped tarball.
    """

    FLASHINFER_AUTOTUNE = "flashinfer_autotune_v1"
    FLASHINFER_JIT_MODULE = "flashinfer_jit_module"
    DEEP_GEMM_JIT_CACHE = "deep_gemm_jit_cache"
    VLLM_RANK_FILE = "vllm_flashinfer_autotune_v1"
    FLASHINFER_V2_STORE = "flashinfer_autotune_v2_store"

    @property
    def media_type(self) -> str:
        """The media type its bytes are stored and served as."""
        return _MEDIA_TYPES[self]


JSON_MEDIA_TYPE = "application/json"
TAR_GZ_MEDIA_TYPE = "application/gzip"
_MEDIA_TYPES = {
    ArtifactKind.FLASHINFER_AUTOTUNE: JSON_MEDIA_TYPE,
    ArtifactKind.FLASHINFER_JIT_MODULE: TAR_GZ_MEDIA_TYPE,
    ArtifactKind.DEEP_GEMM_JIT_CACHE: TAR_GZ_MEDIA_TYPE,
    ArtifactKind.VLLM_RANK_FILE: JSON_MEDIA_TYPE,
    ArtifactKind.FLASHINFER_V2_STORE: TAR_GZ_MEDIA_TYPE,
}


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


class Scope(StrEnum):
    """What a token may do; each scope includes the ones before it.

    * ``read``: lookups, artifact and history GETs (open to anyone unless the service sets
      ``TUNECACHE_READ_TOKEN_REQUIRED``).
    * ``push``: a pod's push-back: artifacts and runs stored unverified, never current.
    * ``tune``: GPU nodes: runs that may become current.
    * ``admin``: tokens, re-tune requests, the audit log.
    """

    READ = "read"
    PUSH = "push"
    TUNE = "tune"
    ADMIN = "admin"

    def includes(self, other: "Scope") -> bool:
        """Whether a token of this scope may do what ``other`` allows."""
        order = list(Scope)
        return order.index(self) >= order.index(other)


class JobStatus(StrEnum):
    """A tuning job's state; ``queued`` and ``running`` jobs occupy their key (single-flight)."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"

    @property
    def active(self) -> bool:
        """Whether a job in this state occupies its key."""
        return self in ACTIVE_JOB_STATUSES


ACTIVE_JOB_STATUSES: tuple[JobStatus, ...] = (JobStatus.QUEUED, JobStatus.RUNNING)


class Stage(StrEnum):
    """Steps of a tuning, in the order vLLM 0.33's ``kernel_warmup`` runs them.

    ``deep_gemm``, ``gemm``, ``moe`` and ``attention`` are the warmup stages (the last
    three selectable with ``--stages``: :data:`TUNABLE_STAGES`); ``harvest`` collects the
    JIT modules afterwards; ``vllm`` is the whole of vLLM's own ``kernel_warmup`` (the
    ``vllm`` runner).
    """

    DEEP_GEMM = "deep_gemm"
    GEMM = "gemm"
    MOE = "moe"
    ATTENTION = "attention"
    HARVEST = "harvest"
    VLLM = "vllm"


TunableStage = Literal["gemm", "moe", "attention"]
#: The stages a job or ``tune --stages`` may choose, in the order they run.
TUNABLE_STAGES: tuple[str, ...] = get_args(TunableStage)


# ----------------------------------------------------------------------- write models


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


#: Deepest nesting of lists and objects accepted in free-form JSON (``summary``, ``hf_config``).
MAX_JSON_DEPTH = 64


def _depth(value: Any) -> int:
    """Nesting depth of lists and objects (0 for a scalar), without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is not None:
            deepest = max(deepest, depth + 1)
            stack.extend((child, depth + 1) for child in children)
    return deepest


def _storable_json(value: Any) -> str:
    """``value`` as JSON, refusing what neither database stores (NaN, Infinity, NUL) and
    nesting deeper than :data:`MAX_JSON_DEPTH`."""
    if _depth(value) > MAX_JSON_DEPTH:
        raise ValueError(f"is nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        encoded = json.dumps(value, allow_nan=False)
    except ValueError:
        raise ValueError("must not contain NaN or Infinity") from None
    if "\\u0000" in encoded:
        raise ValueError("must not contain NUL characters")
    return encoded


class RunSignature(BaseModel):
    """A detached Ed25519 signature over a run's manifest (:mod:`tunecache.signing`):
    the tuning key, the environment and every artifact's kind, name and sha256."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key_id: str = Field(pattern=r"^[0-9a-f]{16}$", description="first 16 hex digits of sha256 of the raw public key")
    signature: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9+/=]+$",
                           description="base64 of the 64-byte Ed25519 signature")


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
        if self.status is RunStatus.SUCCEEDED and not any(
            a.kind is ArtifactKind.FLASHINFER_AUTOTUNE for a in self.artifacts
        ):
            raise ValueError(
                f"a succeeded run needs a {ArtifactKind.FLASHINFER_AUTOTUNE} artifact (FlashInfer's cache file)"
            )
        return self


class LookupRequest(BaseModel):
    """Body of ``POST /v1/tunings/lookup``: the pod's key and its FlashInfer environment."""

    model_config = ConfigDict(extra="forbid")

    key: TuningKey
    environment: EnvironmentMetadata


class TuningRunQuery(BaseModel):
    """Filters and page of the tuning history (``GET /v1/tunings`` query parameters):
    key fields, status, ``current_only`` (runs current for their key and environment),
    ``limit`` (1-500) and ``offset``."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(default=None, max_length=512, pattern=NO_NUL)
    gpu_name: str | None = Field(default=None, max_length=128, pattern=NO_NUL)
    max_num_batched_tokens: int | None = Field(default=None, gt=0, le=MAX_NUM_BATCHED_TOKENS)
    status: RunStatus | None = None
    current_only: bool = False
    limit: int = Field(default=50, ge=1, le=500)
    offset: int = Field(default=0, ge=0, le=MAX_ID)


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
    gemm_backends: list[Annotated[str, Field(pattern=r"^[a-z0-9_-]{1,32}$")]] | None = Field(default=None, max_length=8)
    """FlashInfer GEMM backends to tune (default: the tuner's per-arch choice)."""
    stages: list[TunableStage] | None = Field(default=None, min_length=1, max_length=8)
    """Run only these tuner stages (default: every stage that applies to the model)."""

    @field_validator("hf_config")
    @classmethod
    def _config_is_small_storable_json(cls, config: dict[str, Any] | None) -> dict[str, Any] | None:
        if config is None:
            return None
        encoded = _storable_json(config)
        if len(encoded) > MAX_HF_CONFIG_BYTES:
            raise ValueError(f"is {len(encoded)} bytes as JSON; at most {MAX_HF_CONFIG_BYTES}")
        return config


# ------------------------------------------------------------------------ read models


class FieldError(BaseModel):
    """One invalid part of a request: where (``loc``, e.g. ``["body", "key", "arch"]``),
    why (``msg``, ``type``) and at most 100 characters of what was sent (``input``)."""

    loc: list[str | int]
    msg: str
    type: str
    input: Any = None
    ctx: dict[str, Any] | None = None


class ErrorBody(BaseModel):
    """The body of every error answer: ``detail`` is a message, or the list of invalid
    fields of a 422; ``missing`` lists the sha256 of artifacts a run refers to that were
    never uploaded."""

    detail: str | list[FieldError]
    missing: list[str] | None = None


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


class TuningRunRead(BaseModel):
    """One stored tuning run (``GET /v1/tunings/{id}``, a lookup's 200)."""

    id: int
    key: TuningKey
    environment: EnvironmentMetadata
    environment_hash: str
    status: RunStatus
    trigger: RunTrigger
    node: str | None
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
    """The name of the token that recorded the run (``None``: recorded on the database)."""

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


class TuningRunPage(BaseModel):
    """A page of ``GET /v1/tunings``, newest first."""

    items: list[TuningRunRead]
    total: int
    limit: int
    offset: int


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


class WorkerStatus(BaseModel):
    """Whether this node runs tuning jobs, for which GPU, or why not."""

    enabled: bool
    gpu_name: str | None = None
    arch: str | None = None
    name: str | None = None
    reason: str | None = None


class Health(BaseModel):
    """Answer of ``GET /v1/health``: only ``status`` without a token; the rest with one."""

    status: Literal["ok"]
    database: str | None = None
    schema_revision: str | None = None
    worker: WorkerStatus | None = None


class TuningJobRead(BaseModel):
    """A tuning job (``GET /v1/tuning-jobs/{id}``): state, progress and timings."""

    id: int
    key: TuningKey
    status: JobStatus
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
    """A page of ``GET /v1/tuning-jobs``, newest first."""

    items: list[TuningJobRead]
    total: int
    limit: int
    offset: int


# ---------------------------------------------------------------------- tuner events



TOKEN_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$"


class TokenCreate(BaseModel):
    """Body of ``POST /v1/tokens``: a new token's name (unique) and scope."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=TOKEN_NAME_PATTERN, description="letters, digits, _ . @ -; at most 64")
    scope: Scope


class TokenRead(BaseModel):
    """A token as listed (``GET /v1/tokens``): never its secret, which is stored as a hash only."""

    name: str
    scope: Scope
    created_at: dt.datetime
    last_used_at: dt.datetime | None
    """Last use, to within a minute."""
    revoked_at: dt.datetime | None
    created_by: str | None


class TokenCreated(TokenRead):
    """Answer of ``POST /v1/tokens``: the secret, shown this once."""

    token: str


class AuditEventRead(BaseModel):
    """One write to the service (``GET /v1/audit``): who (the token's name and scope), what
    (method, path, and what it did), when."""

    id: int
    at: dt.datetime
    token_name: str
    scope: Scope
    method: str
    path: str
    detail: str | None


class AuditPage(BaseModel):
    """A page of audit events, newest first; ``next_before`` continues it (``before=``)."""

    events: list[AuditEventRead]
    next_before: int | None

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
