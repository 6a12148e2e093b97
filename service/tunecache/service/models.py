"""SQLAlchemy 2.0 ORM models. Rows never leave the storage modules (repository, blobs, jobs).

The contract (:mod:`tunecache.contract`) shapes the schema: the key's unique constraint
is built from :data:`~tunecache.contract.KEY_FIELDS`, and every status and trigger column
has a CHECK constraint listing its enum's values (:func:`one_of`).

Tables:

* ``environments``: FlashInfer environment metadata, one row per distinct environment
  (``env_hash`` = :meth:`tunecache.contract.EnvironmentMetadata.environment_hash`).
* ``tuning_keys``: (GPU name, arch, model, max_num_batched_tokens, dtype, quantization,
  tensor-parallel size).
* ``tuning_runs``: the tunings recorded (history, append-only except for the status of a
  run in progress, its pin and the retention pass: :mod:`tunecache.service.retention`
  deletes runs past ``TUNECACHE_RUN_RETENTION`` per key and environment, never the
  current, a pinned or a job's run).
* ``artifact_blobs`` / ``artifact_chunks``: content-addressed bytes (sha256), shared
  between runs, stored in chunks so large JIT modules stream in and out; a blob no run
  refers to any more is collected (with its chunks) after a grace period.
* ``run_artifacts``: which blobs a run produced, under which kind and name.
* ``current_tunings``: the run that is current for a (key, environment); updated in
  the same transaction that records a successful run.
* ``tuning_generation``: one counter, moved in the transaction that moves a current
  tuning; processes cache lookup answers per generation.
* ``api_tokens``: bearer tokens (name, scope, sha256 of the secret, creation, last use,
  revocation); the secret itself is never stored.
* ``audit_events``: every write, with the name and scope of the token that made it.
* ``tuning_jobs``: the queue of requested tunings (HTTP-triggered re-tuning). At most one
  job per key is queued or running (a partial unique index: single-flight); a running
  job holds a lease that its worker renews, and a cancelled one carries
  ``cancel_requested_at`` until its worker has stopped it.
* ``workers``: the GPU job workers' heartbeats (name, GPU, arch, last seen), so that a
  request can tell whether any live worker will take its job.
* ``pod_reports``: what each install on a pod came to (``POST /v1/reports``), kept
  ``TUNECACHE_REPORT_RETENTION_DAYS``; the key is stored by value (and ``key_hash``), never
  as a ``tuning_keys`` row, so a report cannot add keys.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import TypeDecorator

from tunecache.contract import (ACTIVE_JOB_STATUSES, KEY_FIELDS, JobStatus, ReportOutcome, ReportSource, RunStatus,
                                RunTrigger, Scope, StrEnum)

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class UTCDateTime(TypeDecorator):
    """A timezone-aware datetime stored as UTC on every database.

    PostgreSQL keeps offsets itself; SQLite keeps none, so values are converted to UTC
    on the way in and marked UTC on the way out. Naive values are refused.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime: tunecache stores timezone-aware times only")
        return value.astimezone(dt.timezone.utc)

    def process_result_value(self, value: dt.datetime | None, dialect) -> dt.datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=dt.timezone.utc) if value.tzinfo is None else value.astimezone(dt.timezone.utc)


def one_of(column: str, values: Iterable[StrEnum]) -> str:
    """SQL condition ``column IN ('a', 'b', ...)`` over enum members (an enum class gives
    all its values), for CHECK constraints and partial indexes."""
    return f"{column} IN ({', '.join(repr(member.value) for member in values)})"


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {dt.datetime: UTCDateTime}


class Environment(Base):
    __tablename__ = "environments"

    id: Mapped[int] = mapped_column(primary_key=True)
    env_hash: Mapped[str] = mapped_column(String(64), unique=True)
    flashinfer_version: Mapped[str] = mapped_column(String(64))
    cuda_version: Mapped[str] = mapped_column(String(64))
    cublas_version: Mapped[str] = mapped_column(String(64))
    cudnn_version: Mapped[str] = mapped_column(String(64))
    cudnn_frontend_version: Mapped[str] = mapped_column(String(64))
    cutlass_dsl_version: Mapped[str] = mapped_column(Text)
    gpu: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class TuningKeyRow(Base):
    __tablename__ = "tuning_keys"
    __table_args__ = (
        UniqueConstraint(*KEY_FIELDS, name="uq_tuning_keys_identity"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    gpu_name: Mapped[str] = mapped_column(String(128))
    arch: Mapped[str] = mapped_column(String(16))
    model: Mapped[str] = mapped_column(String(512), index=True)
    max_num_batched_tokens: Mapped[int] = mapped_column(Integer)
    dtype: Mapped[str] = mapped_column(String(32))
    quantization: Mapped[str] = mapped_column(String(32))
    tensor_parallel_size: Mapped[int] = mapped_column(Integer)
    data_parallel_size: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    expert_parallel_size: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    engine: Mapped[str] = mapped_column(String(32), default="vllm", server_default="vllm")
    """The engine the key is for (:attr:`tunecache.contract.TuningKey.engine`)."""
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class TuningRun(Base):
    __tablename__ = "tuning_runs"
    __table_args__ = (
        CheckConstraint(one_of("status", RunStatus), name="status"),
        CheckConstraint(one_of("trigger", RunTrigger), name="trigger"),
        # the history's order and cursor, newest first; and the same within a key, an environment
        Index("ix_tuning_runs_created_id", "created_at", "id"),
        Index("ix_tuning_runs_key_created", "key_id", "created_at", "id"),
        Index("ix_tuning_runs_environment_created", "environment_id", "created_at", "id"),
        Index("ix_tuning_runs_key_variant", "key_id", "variant"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    key_id: Mapped[int] = mapped_column(ForeignKey("tuning_keys.id"), index=True)
    environment_id: Mapped[int] = mapped_column(ForeignKey("environments.id"), index=True)
    status: Mapped[str] = mapped_column(String(16))
    trigger: Mapped[str] = mapped_column(String(16))
    node: Mapped[str | None] = mapped_column(String(255))
    started_at: Mapped[dt.datetime | None] = mapped_column()
    finished_at: Mapped[dt.datetime | None] = mapped_column()
    duration_s: Mapped[float | None] = mapped_column(Float)
    error: Mapped[str | None] = mapped_column(Text)
    summary: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    verified: Mapped[bool] = mapped_column(Boolean, default=True)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow, index=True)
    signing_key_id: Mapped[str | None] = mapped_column(String(16))
    signature: Mapped[str | None] = mapped_column(String(128))
    recorded_by: Mapped[str | None] = mapped_column(String(64))
    """Name of the token that recorded the run; ``None`` for runs written on the database."""
    held: Mapped[str | None] = mapped_column(Text)
    """Why this succeeded, verified run did not become current at record (the promotion
    policy: not signed by a key the service trusts, emptier than the current run, or a
    flagged regression against it); cleared when it is promoted."""
    signature_manifest: Mapped[int | None] = mapped_column(Integer)
    signature_signed_at: Mapped[int | None] = mapped_column(BigInteger)
    signature_expires_at: Mapped[int | None] = mapped_column(BigInteger)
    """The manifest format the signature is over (:attr:`tunecache.contract.RunSignature.manifest`)."""
    signature_verified: Mapped[bool | None] = mapped_column(Boolean)
    """Whether the service checked the signature against its own trusted keys (``None``:
    it has none, or the run is unsigned)."""
    verification: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    """Its verification boot (:class:`tunecache.contract.RunVerification` as JSON; ``None``: none)."""
    pinned: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    variant: Mapped[str | None] = mapped_column(String(16))
    """The engine variant its compile cache is for (:attr:`tunecache.contract.TuningRunCreate.variant`)."""
    retired_at: Mapped[dt.datetime | None] = mapped_column()
    """When an admin retired it (:mod:`tunecache.service.retiring`; ``None``: in use): never
    current again, never served, kept for the history."""
    """An admin pinned it (``PUT /v1/tunings/{id}/pin``): retention never deletes it."""
    image: Mapped[str | None] = mapped_column(String(16))
    """The image its warm state was built on: :func:`tunecache.formats.dependencies.image_of` of
    its ``summary.dependencies`` (``None``: none recorded, a run of every image)."""

    key: Mapped[TuningKeyRow] = relationship(lazy="joined")
    environment: Mapped[Environment] = relationship(lazy="joined")
    artifacts: Mapped[list["RunArtifact"]] = relationship(
        back_populates="run", lazy="selectin", order_by="RunArtifact.id"
    )


class ArtifactBlob(Base):
    __tablename__ = "artifact_blobs"

    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    # deferred: loading a blob does not name it (the database's chunk writes work on a schema before 0015)
    location: Mapped[str] = mapped_column(String(16), server_default="database", deferred=True)
    """Where the bytes are: ``database`` (the ``artifact_chunks`` rows) or ``s3`` (the object
    store of ``TUNECACHE_ARTIFACT_STORE``); :mod:`tunecache.service.artifact_store`."""


class ArtifactChunk(Base):
    """Part ``seq`` (0-based) of a blob's bytes; a blob is its chunks concatenated in order."""

    __tablename__ = "artifact_chunks"

    sha256: Mapped[str] = mapped_column(
        ForeignKey("artifact_blobs.sha256", ondelete="CASCADE"), primary_key=True
    )
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    data: Mapped[bytes] = mapped_column(LargeBinary)


class RunArtifact(Base):
    __tablename__ = "run_artifacts"
    __table_args__ = (UniqueConstraint("run_id", "name", name="uq_run_artifacts_run_name"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("tuning_runs.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String(64))
    name: Mapped[str] = mapped_column(String(255))
    media_type: Mapped[str] = mapped_column(String(128))
    sha256: Mapped[str] = mapped_column(ForeignKey("artifact_blobs.sha256"), index=True)
    size_bytes: Mapped[int] = mapped_column(BigInteger)

    run: Mapped[TuningRun] = relationship(back_populates="artifacts")


class CurrentTuning(Base):
    __tablename__ = "current_tunings"

    key_id: Mapped[int] = mapped_column(ForeignKey("tuning_keys.id"), primary_key=True)
    environment_id: Mapped[int] = mapped_column(ForeignKey("environments.id"), primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("tuning_runs.id"))
    updated_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    previous_run_id: Mapped[int | None] = mapped_column(Integer)
    """The run current before ``updated_at`` (no foreign key: retention deletes it in time)."""


class CurrentVariant(Base):
    """The current run of one engine variant of a key in an environment (beside
    :class:`CurrentTuning`, the key's current run, which moves to every new current run)."""

    __tablename__ = "current_variants"

    key_id: Mapped[int] = mapped_column(ForeignKey("tuning_keys.id"), primary_key=True)
    environment_id: Mapped[int] = mapped_column(ForeignKey("environments.id"), primary_key=True)
    variant: Mapped[str] = mapped_column(String(16), primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("tuning_runs.id"), index=True)
    updated_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    previous_run_id: Mapped[int | None] = mapped_column(Integer)
    """The run current for the variant before ``updated_at``."""


class CurrentImage(Base):
    """The current run of a key in an environment for the pods of one image (the package
    versions its warm state is built with: :attr:`TuningRun.image`), beside
    :class:`CurrentTuning`: a pod of that image gets it where the key's current run was made
    on another image."""

    __tablename__ = "current_images"

    key_id: Mapped[int] = mapped_column(ForeignKey("tuning_keys.id"), primary_key=True)
    environment_id: Mapped[int] = mapped_column(ForeignKey("environments.id"), primary_key=True)
    image: Mapped[str] = mapped_column(String(16), primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("tuning_runs.id"), index=True)
    updated_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    previous_run_id: Mapped[int | None] = mapped_column(Integer)
    """The run current for the image before ``updated_at``."""


class TuningGeneration(Base):
    """The one row whose ``value`` moves whenever a current tuning changes."""

    __tablename__ = "tuning_generation"
    __table_args__ = (CheckConstraint("id = 1", name="one_row"),)

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    value: Mapped[int] = mapped_column(BigInteger)


#: Jobs that occupy their key (see the partial unique index below).
ACTIVE_JOB_CONDITION = text(one_of("status", ACTIVE_JOB_STATUSES))


class TuningJob(Base):
    __tablename__ = "tuning_jobs"
    __table_args__ = (
        Index(
            "uq_tuning_jobs_active_key", "key_id", unique=True,
            postgresql_where=ACTIVE_JOB_CONDITION, sqlite_where=ACTIVE_JOB_CONDITION,
        ),
        Index("ix_tuning_jobs_status_created", "status", "created_at"),
        CheckConstraint(one_of("status", JobStatus), name="status"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    key_id: Mapped[int] = mapped_column(ForeignKey("tuning_keys.id"))
    status: Mapped[str] = mapped_column(String(16))
    hf_config: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    options: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    """Tuner options of the request: ``gemm_backends``, ``stages`` (see ``TuningJobCreate``)."""
    requested_by: Mapped[str | None] = mapped_column(String(255))
    stage: Mapped[str | None] = mapped_column(String(64))
    step: Mapped[int | None] = mapped_column(Integer)
    total: Mapped[int | None] = mapped_column(Integer)
    log_tail: Mapped[str | None] = mapped_column(Text)
    worker: Mapped[str | None] = mapped_column(String(255))
    lease_expires_at: Mapped[dt.datetime | None] = mapped_column()
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[str | None] = mapped_column(Text)
    run_id: Mapped[int | None] = mapped_column(ForeignKey("tuning_runs.id"))
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    started_at: Mapped[dt.datetime | None] = mapped_column()
    finished_at: Mapped[dt.datetime | None] = mapped_column()
    cancel_requested_at: Mapped[dt.datetime | None] = mapped_column()
    """Set by a cancel of a running job; its worker stops the tuner and records ``cancelled``."""
    cancelled_by: Mapped[str | None] = mapped_column(String(64))
    """Name of the token that cancelled the job."""

    key: Mapped[TuningKeyRow] = relationship(lazy="joined")


class Worker(Base):
    """A GPU job worker's latest heartbeat (upserted every ``heartbeat_s`` by its node)."""

    __tablename__ = "workers"

    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    gpu_name: Mapped[str] = mapped_column(String(128))
    arch: Mapped[str] = mapped_column(String(16))
    model_config_dir: Mapped[bool] = mapped_column(Boolean, default=False)
    vllm_version: Mapped[str | None] = mapped_column(String(64))
    """The vLLM of the worker's image (a job naming one is taken only by such a worker)."""
    """Whether the node has a ``TUNECACHE_MODEL_CONFIG_DIR`` (jobs without ``hf_config``)."""
    heartbeat_s: Mapped[float] = mapped_column(Float)
    started_at: Mapped[dt.datetime] = mapped_column()
    last_seen: Mapped[dt.datetime] = mapped_column(index=True)
    stopped_at: Mapped[dt.datetime | None] = mapped_column()


class ApiToken(Base):
    """A bearer token ``tc_<token_id>_<secret>``: looked up by ``token_id``, checked by
    comparing sha256 of the secret in constant time."""

    __tablename__ = "api_tokens"
    __table_args__ = (CheckConstraint(one_of("scope", Scope), name="scope"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    token_id: Mapped[str] = mapped_column(String(16), unique=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    scope: Mapped[str] = mapped_column(String(16))
    secret_sha256: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    created_by: Mapped[str | None] = mapped_column(String(64))
    last_used_at: Mapped[dt.datetime | None] = mapped_column()
    revoked_at: Mapped[dt.datetime | None] = mapped_column()


class AuditEvent(Base):
    """One write: which token (name and scope at the time), method, path, what it did."""

    __tablename__ = "audit_events"
    __table_args__ = (CheckConstraint(one_of("scope", Scope), name="scope"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    token_name: Mapped[str] = mapped_column(String(64), index=True)
    scope: Mapped[str] = mapped_column(String(16))
    method: Mapped[str] = mapped_column(String(8))
    path: Mapped[str] = mapped_column(String(512))
    detail: Mapped[str | None] = mapped_column(String(1024))


class PodReport(Base):
    """One install on a pod (:class:`tunecache.contract.PodReportCreate`), as received.

    The key's fields are copied (reports name keys that were never tuned) and grouped by
    ``key_hash`` (:meth:`tunecache.contract.TuningKey.key_hash`). Indexes serve the fleet
    view's two queries and the retention delete: ``(received_at, key_hash, outcome, boot_id)``
    (hit rates over a window, in distinct boots; rows older than the retention) and ``(outcome, received_at,
    key_hash, environment_hash)`` (the misses of a window, by key and environment).
    """

    __tablename__ = "pod_reports"
    __table_args__ = (
        CheckConstraint(one_of("outcome", ReportOutcome), name="outcome"),
        CheckConstraint(one_of("source", ReportSource), name="source"),
        Index("ix_pod_reports_received_key", "received_at", "key_hash", "outcome", "boot_id"),
        Index("ix_pod_reports_outcome_received", "outcome", "received_at", "key_hash", "environment_hash"),
        # the reports an automatic tuning counts (tunecache.service.variant_autotune): only those sent with a token
        Index("ix_pod_reports_token_variant", "key_hash", "variant", "received_at",
              postgresql_where=text("token_name IS NOT NULL"), sqlite_where=text("token_name IS NOT NULL")),
    )

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    received_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    key_hash: Mapped[str] = mapped_column(String(64))
    gpu_name: Mapped[str] = mapped_column(String(128))
    arch: Mapped[str] = mapped_column(String(16))
    model: Mapped[str] = mapped_column(String(512))
    max_num_batched_tokens: Mapped[int] = mapped_column(Integer)
    dtype: Mapped[str] = mapped_column(String(32))
    quantization: Mapped[str] = mapped_column(String(32))
    tensor_parallel_size: Mapped[int] = mapped_column(Integer)
    data_parallel_size: Mapped[int] = mapped_column(Integer)
    expert_parallel_size: Mapped[int] = mapped_column(Integer)
    engine: Mapped[str] = mapped_column(String(32), default="vllm", server_default="vllm")
    environment_hash: Mapped[str] = mapped_column(String(64))
    environment: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    """The pod's FlashInfer environment, when the report carried it (misses)."""
    outcome: Mapped[str] = mapped_column(String(16))
    run_id: Mapped[int | None] = mapped_column(Integer)
    """The run installed, or the closest run of a miss: the pod's word, not a foreign key."""
    differences: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)
    error_kind: Mapped[str | None] = mapped_column(String(64))
    install_seconds: Mapped[float] = mapped_column(Float)
    jit_modules: Mapped[int] = mapped_column(Integer, default=0)
    jit_skipped: Mapped[int] = mapped_column(Integer, default=0)
    pod: Mapped[str] = mapped_column(String(255))
    rank: Mapped[int | None] = mapped_column(Integer)
    source: Mapped[str] = mapped_column(String(16))
    looked_up: Mapped[bool] = mapped_column(Boolean, default=True)
    compiled: Mapped[dict[str, int] | None] = mapped_column(JSON)
    """The boot's attestation (:attr:`tunecache.contract.PodReportCreate.compiled`), when sent."""
    compiled_total: Mapped[int | None] = mapped_column(Integer)
    """The sum of ``compiled`` (0: the boot compiled nothing), for the fleet view's counts."""
    boot_id: Mapped[str | None] = mapped_column(String(64))
    """The pod boot (:attr:`tunecache.contract.PodReportCreate.boot_id`); ``None``: a client
    before it (the report counts as a boot of its own)."""
    variant: Mapped[str | None] = mapped_column(String(16))
    """The pod's engine variant (:attr:`tunecache.contract.PodReportCreate.variant`), when it knew it."""
    variant_missing: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    """No warm state is stored for the pod's variant: it got the key's run without its compile cache."""
    engine_args: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    """The vLLM engine arguments the pod named its variant with (to tune it: ``retune --engine-args``)."""
    missing_kinds: Mapped[str | None] = mapped_column(String(255))
    """The kinds of the installed run the pod left out as built on another image
    (:attr:`tunecache.contract.PodReportCreate.missing_kinds`), comma-separated; ``None``: none."""
    installed_from: Mapped[list[int] | None] = mapped_column(JSON)
    """Every run the boot installed from (:attr:`tunecache.contract.PodReportCreate.installed_from`); ``None``: not said."""
    sender: Mapped[str | None] = mapped_column(String(128))
    """The source that sent it: the client address (an IPv6 one as its /64), or ``token:``
    and the token's name (:func:`tunecache.service.report_bounds.source_of`)."""
    token_name: Mapped[str | None] = mapped_column(String(64))
    """The token the report was sent with (its name: names are never reused); ``None``: no
    token. Only reports sent with a token count towards an automatic tuning
    (:mod:`tunecache.service.variant_autotune`), once per distinct token."""


class AutoTuneRefusal(Base):
    """Automatic tunings of an engine variant refused (:mod:`tunecache.service.auto_tune_refusals`):
    how many times per hour (``hour``: its start, UTC), key, variant and reason, and the last."""

    __tablename__ = "auto_tune_refusals"

    hour: Mapped[dt.datetime] = mapped_column(primary_key=True)
    key_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    variant: Mapped[str] = mapped_column(String(16), primary_key=True)
    reason: Mapped[str] = mapped_column(String(16), primary_key=True)
    count: Mapped[int] = mapped_column(Integer)
    last_at: Mapped[dt.datetime] = mapped_column()
