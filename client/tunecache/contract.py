"""The contract both sides of tunecache speak: identity, names, and the API's models.

Everything that crosses the wire between a pod (``tunecache-client``) and the service
(``tunecache-server``), or that both store and compare, is defined here once:

* identity: :class:`TuningKey` (what a pod asks for) and :class:`EnvironmentMetadata`
  (FlashInfer's ``_metadata`` fields), :func:`differences` between two of them;
* names: :class:`ArtifactKind` with its media types, :class:`RunStatus`,
  :class:`RunTrigger`, :class:`JobStatus`, :class:`Stage`;
* write models (``extra="forbid"``: a misspelt field is an error): :class:`ArtifactCreate`,
  :class:`TuningRunCreate`, :class:`LookupRequest`, :class:`TuningRunQuery`, :class:`TuningJobCreate`,
  :class:`PodReportCreate` (a pod's install report);
* read models (unknown fields ignored, so an older client reads a newer server):
  :class:`TuningRunRead`, :class:`TuningRunPage`, :class:`LookupMiss`,
  :class:`TuningJobRead`, :class:`TuningJobPage`, :class:`JobConflict`, :class:`WorkerList`,
  :class:`ArtifactStored`, :class:`Health`, :class:`TuningRunDiff` (a run diff),
  :class:`FleetView` (the fleet matrix and the tunings pods want);
* the tuner's progress events, one discriminated union (:data:`TunerEvent`), read by the
  service's worker and by the client's progress bar.

The service builds its SQL schema's constraints and its routes from these; the client
returns these models, never dicts. Pure Python: pydantic only.
"""

from __future__ import annotations

import base64
import datetime as dt
import enum
import hashlib
import json
import re
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

#: What tunecache records for a field the writing FlashInfer does not track at all (absent
#: from its ``_metadata``: FlashInfer 0.6.13's ``_collect_metadata()`` has no
#: ``cutlass_dsl_version``). ``AutoTuner.load_configs`` compares only the fields its own
#: ``_collect_metadata()`` returns (0.6.13: ``load_configs``; 0.7.4:
#: ``_classify_metadata_mismatches``), so a file without the field loads under a FlashInfer
#: that does not track it either and never under one that does: equal markers match, the
#: marker never equals a detected value.
NOT_TRACKED = "(not tracked)"

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

    Source: ``flashinfer.autotuner._collect_metadata`` (FlashInfer 0.7.4; 0.6.13 has no
    ``cutlass_dsl_version``: :data:`NOT_TRACKED`). Every value
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

        Keys FlashInfer may add in later versions are ignored; a field the writing
        FlashInfer does not track (absent: ``cutlass_dsl_version`` before FlashInfer 0.7)
        becomes :data:`NOT_TRACKED`.

        Raises:
            ValueError: ``metadata`` is not a JSON object, or a field is not a string or
                number, empty, too long or holds NUL (the message names the field).
        """
        if not isinstance(metadata, dict):
            raise ValueError("FlashInfer _metadata must be a JSON object")
        values = {}
        for field in ENVIRONMENT_FIELDS:
            value = metadata.get(field, NOT_TRACKED)
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

    def key_hash(self) -> str:
        """sha256 (64 hex chars) of the canonical JSON of every key field: how pod reports
        and the fleet view name a key without a row in the service's key table."""
        canonical = json.dumps(self.model_dump(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

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


def encode_run_cursor(created_at: dt.datetime, run_id: int) -> str:
    """The opaque ``cursor`` of a history page that ends at the run ``(created_at, run_id)``:
    URL-safe base64 (no padding) of ``["<created_at ISO 8601, UTC>", run_id]``."""
    position = json.dumps([created_at.astimezone(dt.timezone.utc).isoformat(), run_id], separators=(",", ":"))
    return base64.urlsafe_b64encode(position.encode()).decode().rstrip("=")


def decode_run_cursor(cursor: str) -> tuple[dt.datetime, int]:
    """``(created_at, run_id)`` of a cursor made by :func:`encode_run_cursor`.

    Raises:
        ValueError: not a cursor this service gives out.
    """
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created_at, run_id = json.loads(raw)
        when = dt.datetime.fromisoformat(created_at)
    except (ValueError, TypeError, UnicodeDecodeError):
        raise ValueError("is not a cursor of this service (pass the next_cursor of a page as it is)") from None
    if when.tzinfo is None or isinstance(run_id, bool) or not isinstance(run_id, int) or not 0 < run_id <= MAX_ID:
        raise ValueError("is not a cursor of this service (pass the next_cursor of a page as it is)")
    return when, run_id


_ISO_DATE_TIME = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}")


def _iso_date_time(value: Any) -> Any:
    """ISO 8601 text (or a datetime) only: pydantic alone would also take ``0.5`` as a Unix time."""
    if isinstance(value, str) and not _ISO_DATE_TIME.match(value):
        raise ValueError("must be an ISO 8601 date-time with a time zone, e.g. 2026-12-01T08:00:00Z")
    if isinstance(value, (int, float)):
        raise ValueError("must be an ISO 8601 date-time with a time zone, e.g. 2026-12-01T08:00:00Z")
    return value


def _in_utc(value: dt.datetime) -> dt.datetime:
    """The time in UTC, as the service stores and compares times; one that falls outside
    the years 1-9999 there (``0001-01-01T00:00:00+05:00``) is refused."""
    try:
        return value.astimezone(dt.timezone.utc)
    except OverflowError:
        raise ValueError("is outside the years 1-9999 once in UTC") from None


#: A timezone-aware time given as ISO 8601 (``2026-12-01T08:00:00Z``), never as a number; in UTC.
IsoDateTime = Annotated[AwareDatetime, BeforeValidator(_iso_date_time), AfterValidator(_in_utc)]


class TuningRunQuery(BaseModel):
    """Filters and page of the tuning history (``GET /v1/tunings`` query parameters).

    Filters, all optional and combined (AND):

    * every key field (:data:`KEY_FIELDS`: ``gpu_name``, ``arch``, ``model``,
      ``max_num_batched_tokens``, ``dtype``, ``quantization``, the parallel sizes) and every
      environment field (:data:`ENVIRONMENT_FIELDS`: ``flashinfer_version``, ``cuda_version``,
      ..., ``gpu``), each equal to the value given;
    * ``status``, ``trigger``; ``current_only``: runs current for their key and environment;
    * ``since`` / ``until``: ``since <= created_at < until`` (ISO 8601 with a time zone).

    Order: newest first, by ``created_at`` then ``id``. Pages of ``limit`` (1-500) runs:
    ``cursor`` (the ``next_cursor`` of the page before; a page never shifts when runs are
    recorded meanwhile) or ``offset`` (kept for existing callers); not both.

    ``format``: ``json`` (a :class:`TuningRunPage`) or ``csv`` (every matching run, from
    ``cursor`` on, streamed as CSV with a header row; ``limit`` and ``offset`` do not
    apply); ``Accept: text/csv`` asks for CSV too.
    """

    model_config = ConfigDict(extra="forbid")

    gpu_name: str | None = Field(default=None, min_length=1, max_length=128, pattern=NO_NUL)
    arch: str | None = Field(default=None, pattern=r"^sm[0-9]{2,3}[a-z]?$", max_length=16)
    model: str | None = Field(default=None, max_length=512, pattern=NO_NUL)
    max_num_batched_tokens: int | None = Field(default=None, gt=0, le=MAX_NUM_BATCHED_TOKENS)
    dtype: str | None = Field(default=None, min_length=1, max_length=32, pattern=NO_NUL)
    quantization: str | None = Field(default=None, min_length=1, max_length=32, pattern=NO_NUL)
    tensor_parallel_size: int | None = Field(default=None, gt=0, le=1024)
    data_parallel_size: int | None = Field(default=None, gt=0, le=1024)
    expert_parallel_size: int | None = Field(default=None, gt=0, le=1 << 20)
    flashinfer_version: str | None = Field(default=None, min_length=1, max_length=64, pattern=NO_NUL)
    cuda_version: str | None = Field(default=None, min_length=1, max_length=64, pattern=NO_NUL)
    cublas_version: str | None = Field(default=None, min_length=1, max_length=64, pattern=NO_NUL)
    cudnn_version: str | None = Field(default=None, min_length=1, max_length=64, pattern=NO_NUL)
    cudnn_frontend_version: str | None = Field(default=None, min_length=1, max_length=64, pattern=NO_NUL)
    cutlass_dsl_version: str | None = Field(default=None, min_length=1, max_length=4096, pattern=NO_NUL)
    gpu: str | None = Field(default=None, min_length=1, max_length=128, pattern=NO_NUL)
    status: RunStatus | None = None
    trigger: RunTrigger | None = None
    since: IsoDateTime | None = None
    until: IsoDateTime | None = None
    current_only: bool = False
    limit: int = Field(default=50, ge=1, le=500)
    offset: int = Field(default=0, ge=0, le=MAX_ID)
    cursor: str | None = Field(default=None, min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_-]+$",
                               description="next_cursor of the page before (opaque)")
    format: Literal["json", "csv"] = "json"

    @field_validator("cursor")
    @classmethod
    def _cursor_is_ours(cls, cursor: str | None) -> str | None:
        if cursor is not None:
            decode_run_cursor(cursor)
        return cursor

    @model_validator(mode="after")
    def _consistent(self) -> "TuningRunQuery":
        if self.since is not None and self.until is not None and self.until <= self.since:
            raise ValueError(f"until ({self.until.isoformat()}) must be later than since ({self.since.isoformat()})")
        if self.cursor is not None and self.offset:
            raise ValueError("offset and cursor cannot be combined: a cursor already says where the page starts")
        return self

    def filters(self) -> dict[str, Any]:
        """The key and environment fields this query filters on, ``{field: value}``."""
        return {f: getattr(self, f) for f in (*KEY_FIELDS, *ENVIRONMENT_FIELDS) if getattr(self, f) is not None}

    def position(self) -> tuple[dt.datetime, int] | None:
        """``(created_at, id)`` of the run the page starts after (from ``cursor``), or ``None``."""
        return decode_run_cursor(self.cursor) if self.cursor is not None else None


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
    """A page of ``GET /v1/tunings``, newest first (``created_at``, then ``id``).

    ``total``: runs matching the filters in all (not only from the cursor on).
    ``next_cursor``: pass it as ``cursor`` for the next page; ``None`` on the last page.
    """

    items: list[TuningRunRead]
    total: int
    limit: int
    offset: int
    next_cursor: str | None = None


#: The columns of the history's CSV export (``GET /v1/tunings?format=csv``), in order:
#: the run, its key, its environment, then what was recorded with it. Times are ISO 8601
#: (UTC); ``entries`` is the FlashInfer file's entry count; ``signing_key_id`` the key
#: that signed the run (empty: unsigned).
RUN_CSV_COLUMNS: tuple[str, ...] = (
    "id", "created_at", "status", "trigger", "verified", "is_current", *KEY_FIELDS, "environment_hash",
    *ENVIRONMENT_FIELDS, "node", "started_at", "finished_at", "duration_s", "entries", "recorded_by",
    "signing_key_id", "error",
)


def run_csv_row(run: TuningRunRead) -> list[str]:
    """The values of :data:`RUN_CSV_COLUMNS` for one run, as text (``""`` for none)."""

    def text(value: Any) -> str:
        if value is None:
            return ""
        if isinstance(value, dt.datetime):
            return value.astimezone(dt.timezone.utc).isoformat()
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(value)

    values = {
        "id": run.id, "created_at": run.created_at, "status": run.status, "trigger": run.trigger, "verified": run.verified,
        "is_current": run.is_current, **run.key.model_dump(), "environment_hash": run.environment_hash,
        **run.environment.model_dump(), "node": run.node, "started_at": run.started_at, "finished_at": run.finished_at,
        "duration_s": run.duration_s, "entries": run.entries, "recorded_by": run.recorded_by,
        "signing_key_id": run.signature.key_id if run.signature else None, "error": run.error,
    }
    return [text(values[column]) for column in RUN_CSV_COLUMNS]


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
    cancel_requested_at: dt.datetime | None = None
    """When ``DELETE /v1/tuning-jobs/{id}`` asked to stop this running job (its worker
    stops the tuner within seconds and records it ``cancelled``)."""
    cancelled_by: str | None = None
    """The name of the token that cancelled the job (or asked to)."""


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
    gpu_name: str
    arch: str
    model_config_dir: bool
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


# ------------------------------------------------------------- pod reports, fleet view


class ReportOutcome(StrEnum):
    """How a pod's install ended (:class:`PodReportCreate`).

    * ``installed``: the tuning (run ``run_id``) is in place for FlashInfer or vLLM;
    * ``miss``: the server has no tuning for the pod's key and environment (a lookup's
      404); vLLM tunes as without tunecache;
    * ``error``: something on the pod kept the install from happening (an untrusted run, a
      corrupt artifact, a full disk, ...): ``error_kind`` names it. (A server that could not
      be reached or failed is not sent a report: it would not take one either.)
    """

    INSTALLED = "installed"
    MISS = "miss"
    ERROR = "error"


class ReportSource(StrEnum):
    """Which install reported: ``tunecache pull`` (``cli``), the Python API
    (``install_tuning``, ``pull_autotune_file``: ``api``) or the vLLM plugin (``plugin``)."""

    CLI = "cli"
    API = "api"
    PLUGIN = "plugin"


#: Largest body of ``POST /v1/reports`` (bytes); a larger one is answered 413.
MAX_REPORT_BYTES = 32 * 1024
_FIELD_NAMES_PATTERN = "^(" + "|".join((*KEY_FIELDS, *ENVIRONMENT_FIELDS)) + ")$"


class ReportedDifference(BaseModel):
    """A field in which the closest stored tuning differs from what a pod asked for, as the
    lookup's 404 named it (:class:`FieldDifference`)."""

    model_config = ConfigDict(extra="forbid")

    field: str = Field(pattern=_FIELD_NAMES_PATTERN, description="a key or environment field")
    stored: Text = Field(max_length=4096)
    yours: Text = Field(max_length=4096)


class PodReportCreate(BaseModel):
    """Body of ``POST /v1/reports``: what one install on a pod came to, sent after it
    finished (best-effort, in the background: it never delays or fails an install).

    * ``key``, ``environment_hash``: what the pod asked for; ``environment``: the pod's
      FlashInfer environment in full, sent with a ``miss`` (so the fleet view can show what
      was wanted), optional otherwise; when given it must hash to ``environment_hash``;
    * ``outcome`` (:class:`ReportOutcome`): ``installed`` needs ``run_id`` (the run
      installed); ``miss`` may carry the closest run (``run_id``) and its ``differences``
      as the lookup's 404 named them; ``error`` needs ``error_kind`` (the error's class,
      e.g. ``UntrustedRun``, ``ArtifactCorrupt``, ``OSError``);
    * ``install_seconds``: from the start of the install to its end, seconds;
    * ``jit_modules`` / ``jit_skipped``: FlashInfer JIT modules installed, and those of the
      run not installed (unsigned run, built elsewhere, no workspace);
    * ``pod`` (the hostname), ``rank`` (vLLM's rank of the worker; ``None`` outside vLLM),
      ``source`` (:class:`ReportSource`), ``looked_up``: whether this install asked the
      server itself (``False``: a vLLM worker that took its pod's first worker's result).

    Nothing in a report chooses a path, a tuning or a token: the service only counts it.
    """

    model_config = ConfigDict(extra="forbid")

    key: TuningKey
    environment_hash: str = Field(pattern=SHA256_PATTERN)
    environment: EnvironmentMetadata | None = None
    outcome: ReportOutcome
    run_id: WholeNumber | None = Field(default=None, ge=1, le=MAX_ID)
    differences: list[ReportedDifference] = Field(default_factory=list, max_length=len(KEY_FIELDS) + len(ENVIRONMENT_FIELDS))
    error_kind: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_.]{0,63}$")
    install_seconds: float = Field(ge=0, le=86400)
    jit_modules: WholeNumber = Field(default=0, ge=0, le=100_000)
    jit_skipped: WholeNumber = Field(default=0, ge=0, le=100_000)
    pod: Text = Field(min_length=1, max_length=255)
    rank: WholeNumber | None = Field(default=None, ge=0, le=1 << 20)
    source: ReportSource
    looked_up: bool = True

    @model_validator(mode="after")
    def _consistent(self) -> "PodReportCreate":
        if self.environment is not None and self.environment.environment_hash() != self.environment_hash:
            raise ValueError("environment_hash is not the hash of environment")
        if self.outcome is ReportOutcome.INSTALLED and self.run_id is None:
            raise ValueError("an installed report needs run_id (the run installed)")
        if self.outcome is ReportOutcome.ERROR and self.error_kind is None:
            raise ValueError("an error report needs error_kind")
        if self.outcome is not ReportOutcome.ERROR and self.error_kind is not None:
            raise ValueError(f"error_kind belongs to error reports, not {self.outcome} ones")
        if self.outcome is not ReportOutcome.MISS and self.differences:
            raise ValueError("differences belong to miss reports")
        return self


class FleetRun(BaseModel):
    """A key's current run in one environment (``GET /v1/fleet``)."""

    run_id: int
    environment_hash: str
    flashinfer_version: str
    created_at: dt.datetime
    age_s: float
    """Seconds since the run was recorded, by the service's clock."""
    entries: int | None
    trigger: RunTrigger


class FleetKey(BaseModel):
    """One row of the fleet matrix: a key with its current runs (one per environment that
    has one; none when only pods' reports name the key) and what pods reported for it over
    the window: ``reports`` in all, ``installed``, ``missed``, ``errors``, and ``hit_rate``
    = ``installed / reports`` (``None`` without reports)."""

    key: TuningKey
    current: list[FleetRun]
    reports: int
    installed: int
    missed: int
    errors: int
    hit_rate: float | None
    last_report_at: dt.datetime | None


class WantedTuning(BaseModel):
    """A key and environment pods asked for in the window and that still has no current
    tuning: from their ``miss`` reports. ``pods``: distinct pod names that asked;
    ``reports``: miss reports; ``last_asked_at``: the latest; ``closest_run_id`` and
    ``differences``: the closest stored run and how it differs, as the latest report carried
    them; ``environment``: the pods' FlashInfer environment (when the report sent it)."""

    key: TuningKey
    environment_hash: str
    environment: EnvironmentMetadata | None
    pods: int
    reports: int
    last_asked_at: dt.datetime
    closest_run_id: int | None
    differences: list[FieldDifference]


#: Keys (``limit``), and wanted tunings (``wanted_limit``), of a ``GET /v1/fleet`` page
#: when not given.
FLEET_PAGE_DEFAULT = 100
#: The most keys, and the most wanted tunings, one ``GET /v1/fleet`` page lists.
FLEET_PAGE_MAX = 1000


class FleetView(BaseModel):
    """Answer of ``GET /v1/fleet``: one page of the fleet matrix and one page of the wanted
    list over the last ``hours`` (from ``since``, by the pods' reports; ``generated_at``:
    the service's clock when it answered, which ``age_s`` counts from).

    * ``keys``: at most ``limit`` rows of the matrix (:class:`FleetKey`) from ``offset``
      (0-based) of ``total_keys`` in all; order: most reports in the window first, then
      ``model``, ``gpu_name``, ``max_num_batched_tokens``, key hash;
    * ``wanted``: at most ``wanted_limit`` tunings pods want (:class:`WantedTuning`) from
      ``wanted_offset`` of ``total_wanted`` in all; order: most distinct pods first, then
      most reports, latest asked, key hash, environment hash.

    Both orders are total, so pages of one window do not overlap; counts move as reports
    arrive, so a page asked later may start at another key. A page past the end is empty.
    """

    hours: float
    since: dt.datetime
    generated_at: dt.datetime
    total_keys: int
    limit: int
    offset: int
    keys: list[FleetKey]
    total_wanted: int
    wanted_limit: int
    wanted_offset: int
    wanted: list[WantedTuning]


# --------------------------------------------------------------------------- run diff


class EntryChange(StrEnum):
    """How one entry of FlashInfer's autotune file differs between run ``a`` and run ``b``
    of a diff. Entries are matched by their exact file key, as ``AutoTuner`` looks them up.

    * ``added``: only in ``b``; ``removed``: only in ``a`` (a pod of ``b`` runs that bucket
      on FlashInfer's default tactic);
    * ``changed``: in both, with another tactic. Entries with the same tactic in both are
      only counted (:attr:`TuningRunDiffSummary.unchanged`).
    """

    ADDED = "added"
    REMOVED = "removed"
    CHANGED = "changed"


class TacticChange(BaseModel):
    """One entry of FlashInfer's autotune file that differs between the two runs of a diff.

    Which entry, from its file key ``str((op, runner_class, nearest_profile, extras))``
    (``flashinfer/autotuner/autotuner.py``: ``ProfilingCacheKey.file_key``, written by
    ``AutoTuner.save_configs``), read without evaluating it:

    * ``op``: FlashInfer's custom op, e.g. ``bf16_gemm``; ``runner``: the runner class,
      e.g. ``CudnnBf16GemmRunner``;
    * ``shapes``: ``nearest_profile``, the input shapes with each tuned dimension mapped to
      its bucket (``-1``: a dimension a constraint derives); ``bucket``: the same, readable,
      ``AxB`` per input (``1024x4096 4096x14336 0 0 -1x14336 -1``): the file does not say
      which dimension is the tuned one, so every one is shown;
    * ``extras``: the runner's further key fields as FlashInfer wrote them
      (``torch.bfloat16, False, True, True``); ``file_key``: the key itself.

    A key that cannot be read keeps ``op`` = ``file_key``, ``runner`` = the entry's runner
    class, ``shapes`` = ``None``.

    What each run chose and measured (``_a`` / ``_b``; ``None`` on the side without the
    entry, and where the file records nothing: FlashInfer before 0.7.4 writes no
    ``selection`` record):

    * ``tactic``: FlashInfer's tactic as JSON (an int; a list for compound tactics);
    * ``time_ms``: the chosen tactic's measured time, milliseconds;
    * ``margin``: how far it was ahead of the fastest other candidate, relative
      (``runner_up_ms / time_ms - 1``; negative when FlashInfer's tie tolerance kept an
      earlier tactic over a slightly faster one; ``None`` with a single candidate).

    ``slowdown``: ``time_ms_b / time_ms_a - 1`` when both times are recorded (``0.05``:
    ``b`` is 5 % slower).

    ``regression`` ("slower beyond its recorded margin"): ``status`` is ``changed``, both
    times and at least one margin are recorded, both were measured under the same policy
    (``[runner, tactic, policy, selection]``'s ``policy``: CUDA-graph replays, L2 cache),
    and ``time_ms_b > time_ms_a * (1 + m)`` with ``m`` the larger of ``|margin_a|`` and
    ``|margin_b|``. Why: each run's margin is how far apart its tuner itself measured its
    best two candidates. A re-tune that picks another tactic whose time is within that gap
    picked between candidates the tuner could not tell apart (two fresh tunings of one key
    differ in many such near-tied entries, with margins well under 1 %); only a slowdown
    beyond the larger of the two gaps is more than such a flip. The absolute value keeps a
    negative margin's gap (a tie FlashInfer settled by tolerance) as wide as it was.
    ``note`` says why a regression could not be decided, when it could not (e.g.
    ``"no recorded times"``).
    """

    status: EntryChange
    op: str
    runner: str
    bucket: str
    shapes: list[list[int]] | None = None
    extras: str = ""
    file_key: str
    tactic_a: Any = None
    tactic_b: Any = None
    time_ms_a: float | None = None
    time_ms_b: float | None = None
    margin_a: float | None = None
    margin_b: float | None = None
    slowdown: float | None = None
    regression: bool = False
    note: str | None = None


class TuningRunDiffSummary(BaseModel):
    """Counts of a run diff: entries in each file, how many were ``added``, ``removed``,
    ``changed`` (another tactic) or ``unchanged`` (same tactic), how many changes are
    ``regressions``, and how many entries of each file record a time (``timed_a``,
    ``timed_b``; 0: the file has no recorded times, so nothing in it can be a regression)."""

    entries_a: int
    entries_b: int
    added: int
    removed: int
    changed: int
    unchanged: int
    regressions: int
    timed_a: int
    timed_b: int


class TuningRunDiff(BaseModel):
    """Answer of ``GET /v1/tunings/{run_a}/diff/{run_b}``: how run ``b``'s FlashInfer
    autotune file differs from run ``a``'s, entry by entry.

    ``differences``: every key and environment field in which the runs differ
    (:func:`differences` with ``a`` as ``stored`` and ``b`` as ``yours``): times measured in
    different environments are not comparable one to one. ``entries``: the added, removed
    and changed entries (:class:`TacticChange`), ordered by op, runner and shapes.
    """

    run_a: int
    run_b: int
    key_a: TuningKey
    key_b: TuningKey
    environment_hash_a: str
    environment_hash_b: str
    differences: list[FieldDifference]
    entries: list[TacticChange]
    summary: TuningRunDiffSummary


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
