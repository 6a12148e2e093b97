"""Tuning runs: artifacts, recording and reading runs, the history's query, pages and
cursors, lookups and their misses, run signatures, and run diffs."""

from __future__ import annotations

import base64
import datetime as dt
import json
import re
from typing import Annotated, Any, Literal, Optional

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    create_model,
    field_validator,
    model_validator,
)

from tunecache.contract.identity import (
    INDETERMINATE_VALUES,
    ENVIRONMENT_FIELDS,
    KEY_FIELDS,
    MAX_ID,
    NO_NUL,
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


def _filters_of(model: type[BaseModel]) -> dict[str, Any]:
    """One optional filter per field of ``model``, with the field's constraints, as a query
    string gives it: text without NUL (``pattern``), a plain integer."""
    filters: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        constraints = {attr: getattr(item, attr) for item in field.metadata
                       for attr in ("gt", "ge", "lt", "le", "min_length", "max_length", "pattern")
                       if getattr(item, attr, None) is not None}
        if field.annotation is str:
            constraints.setdefault("pattern", NO_NUL)
        filters[name] = (Optional[field.annotation], Field(default=None, **constraints))
    return filters


#: The history's filters on every key field (read from :class:`TuningKey`) and every
#: environment field (from :class:`EnvironmentMetadata`), in that order.
_RunFilters = create_model("_RunFilters", __module__=__name__, **_filters_of(TuningKey), **_filters_of(EnvironmentMetadata))


class TuningRunQuery(_RunFilters):
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


#: What a spreadsheet takes a cell starting with for a formula (OWASP's list for CSV
#: injection): a text cell of the export that starts with one gets a leading ``'``.
CSV_FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")


def csv_text_cell(value: str) -> str:
    """``value`` as a CSV cell a spreadsheet shows as text: prefixed with ``'`` when it starts
    with one of :data:`CSV_FORMULA_PREFIXES` (a model named ``=HYPERLINK(...)`` would
    otherwise run as a formula where the export is opened)."""
    return "'" + value if value.startswith(CSV_FORMULA_PREFIXES) else value


def run_csv_row(run: TuningRunRead) -> list[str]:
    """The values of :data:`RUN_CSV_COLUMNS` for one run, as text (``""`` for none); text
    values through :func:`csv_text_cell`, numbers, times and booleans as they are."""

    def text(value: Any) -> str:
        if value is None:
            return ""
        if isinstance(value, dt.datetime):
            return value.astimezone(dt.timezone.utc).isoformat()
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, (int, float)):
            return str(value)
        return csv_text_cell(str(value))

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
