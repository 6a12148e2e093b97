"""Service settings, read from ``TUNECACHE_*`` environment variables (pydantic-settings)."""

from __future__ import annotations

import os
from pathlib import Path

from typing import Any, Literal

from pydantic import Field, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

#: Renamed variables: field -> the variable's old name, still read (after the new name
#: ``TUNECACHE_<FIELD>``, which wins when both are set; docs/glossary.md lists the renames).
RENAMED_VARIABLES = {"job_worker": "TUNECACHE_WORKER", "server_processes": "TUNECACHE_WORKERS"}
#: The same fields' old keyword names in ``Settings(...)``, still accepted.
RENAMED_FIELDS = {"worker": "job_worker", "workers": "server_processes"}


def _default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "tunecache"


def _environ_upper() -> dict[str, str]:
    # pydantic-settings reads TUNECACHE_* case-insensitively (case_sensitive=False); so do the old names
    return {name.upper(): value for name, value in os.environ.items()}


def variable_name(field: str) -> str:
    """The environment variable that sets ``field``, for messages: ``TUNECACHE_<FIELD>``, or a
    renamed variable's old name (:data:`RENAMED_VARIABLES`) where only the old one is set."""
    new, old = f"TUNECACHE_{field.upper()}", RENAMED_VARIABLES.get(field)
    environ = _environ_upper()
    return old if old is not None and new not in environ and old in environ else new


class _OldVariableNames(PydanticBaseSettingsSource):
    """The renamed variables' old names (:data:`RENAMED_VARIABLES`), a settings source read
    after the environment's new names: a value under the new name wins."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        old = RENAMED_VARIABLES.get(field_name)
        return (_environ_upper().get(old) if old else None), field_name, False

    def __call__(self) -> dict[str, Any]:
        values = {}
        for field_name, field in self.settings_cls.model_fields.items():
            value, key, _ = self.get_field_value(field, field_name)
            if value is not None:
                values[key] = value
        return values


class Settings(BaseSettings):
    """Configuration of one service process.

    Environment variables (prefix ``TUNECACHE_``):

    * ``TUNECACHE_DATABASE_URL``: SQLAlchemy URL. Default: SQLite file
      ``<data_dir>/tunecache.db``. PostgreSQL: ``postgresql+psycopg://user@host/db``.
    * ``TUNECACHE_DATA_DIR``: where the default SQLite file lives
      (default ``$XDG_DATA_HOME/tunecache`` or ``~/.local/share/tunecache``).
    * ``TUNECACHE_MAX_UPLOAD_BYTES``: largest request body accepted (HTTP 413 above it).
    * ``TUNECACHE_HOST`` / ``TUNECACHE_PORT``: where ``tunecache serve`` listens.
    * ``TUNECACHE_JOB_WORKER`` (old name ``TUNECACHE_WORKER``, still read): ``auto`` (run
      the job worker when this node has a CUDA GPU), ``on`` (refuse to start without one)
      or ``off`` (lookups only).
    * ``TUNECACHE_LEASE_SECONDS``: a claimed job's lease, renewed every third of it.
    * ``TUNECACHE_JOB_TIMEOUT_SECONDS``: the tuner child is killed after this long.
    * ``TUNECACHE_JOB_MAX_ATTEMPTS``: claims of one job before it is failed.
    * ``TUNECACHE_WORKER_POLL_SECONDS``: an idle job worker's wait between claim attempts.
    * ``TUNECACHE_SERVER_PROCESSES`` (old name ``TUNECACHE_WORKERS``, still read): server
      processes of ``tunecache serve`` (uvicorn's worker processes); one of a node's
      processes runs the job worker.
    * ``TUNECACHE_THREADS``: threads per process that run database work (sync routes).
    * ``TUNECACHE_DB_POOL_SIZE``: database connections per process (default: the threads,
      and 3 more: the generation reader's, the report flusher's and the retention pass's).
    * ``TUNECACHE_DB_POOL_TIMEOUT``: seconds a request waits for a connection before 503.
    * ``TUNECACHE_DB_CONNECT_TIMEOUT`` / ``TUNECACHE_DB_STATEMENT_TIMEOUT``: seconds to
      connect to the database, and that one statement may run (PostgreSQL; SQLite's busy
      timeout).
    * ``TUNECACHE_DB_LOCK_TIMEOUT``: seconds a statement waits for a lock before it fails
      (PostgreSQL ``lock_timeout``): a table locked by a migration or a stuck session gives
      503 with ``Retry-After`` instead of holding the request's thread.
    * ``TUNECACHE_HEALTH_TIMEOUT``: ``/v1/health`` answers within this (1 s) whatever the
      database does, ``degraded`` when the database did not answer in it.
    * ``TUNECACHE_LOOKUP_STALE_SECONDS`` / ``TUNECACHE_LOOKUP_STALE_AFTER``: when the
      tuning generation cannot be read within ``..._STALE_AFTER`` seconds (0.5), a lookup
      answer held in memory from a generation read at most ``..._STALE_SECONDS`` (60) ago
      is served, marked ``Tunecache-Stale``; 0 turns this off.
    * ``TUNECACHE_FILE_THREADS``: threads per process that read mirrored artifact files,
      apart from ``TUNECACHE_THREADS``: file serving never waits for database work.
    * ``TUNECACHE_MAX_IN_FLIGHT``: requests one process handles at once; more are answered
      503 with ``Retry-After`` at once.
    * ``TUNECACHE_RETRY_AFTER_SECONDS``: the ``Retry-After`` of those answers.
    * ``TUNECACHE_LOOKUP_CACHE_ENTRIES``: lookup answers kept in memory per process.
    * ``TUNECACHE_MAX_JSON_BYTES``: largest body of the JSON routes (413 above it).
    * ``TUNECACHE_JOB_REQUEST_RATE``: tuning-job requests one token may make per
      process, in the ``limits`` package's notation (``30/minute``); past it: 429.
    * ``TUNECACHE_READ_TOKEN_REQUIRED``: reads (lookups, artifacts, history) need a token
      of any scope; off by default (trusted in-cluster networks keep pod boots simple).
      Writes always need one.
    * ``TUNECACHE_TOKEN_CACHE_SECONDS``: how long a process trusts a token it checked for a
      read (a revoked token still reads for at most this long; writes check every time).
    * ``TUNECACHE_SIGNING_KEY``: this tuner node's Ed25519 private key (``tunecache keys
      generate``); the job worker signs every run it records with it.
    * ``TUNECACHE_MODEL_CONFIG_DIR``: a directory of model configs on this node, one
      ``<org>/<name>/config.json`` per model: a tuning job that carries no ``hf_config``
      is tuned with its model's file here (a name with ``..``, an absolute name or a
      symlink out of the directory finds nothing). Unset: such a job fails at once.
    * ``TUNECACHE_KEEP_ALIVE_SECONDS``: an idle HTTP/1.1 connection is closed after this
      long (uvicorn's ``timeout_keep_alive``, 5 s). Behind a proxy or load balancer that
      keeps connections to the service open, set it above the proxy's idle timeout: a
      connection the service closes just as the proxy reuses it is reset.
      It also closes a new connection that sends nothing for this long.
    * ``TUNECACHE_HEADER_TIMEOUT_SECONDS``: a request's headers must be complete within this
      long of their first byte; past it: 408 and the connection closed
      (``tunecache.service.connections``).
    * ``TUNECACHE_BODY_TIMEOUT_SECONDS``: the longest wait for the next piece of a request
      body; past it: 408 and the connection closed (``tunecache.service.limits``).
    * ``TUNECACHE_SEND_TIMEOUT_SECONDS``: an answer the client stops reading is dropped (the
      connection reset) after this long.
    * ``TUNECACHE_MAX_CONNECTIONS_PER_ADDRESS``: connections one client address may hold
      open to one process; the next get 429 and are closed. Behind a proxy, every
      connection comes from the proxy's address.
    * ``TUNECACHE_ALLOWED_HOSTS``: the ``Host`` headers the service answers, comma-separated
      (starlette's ``TrustedHostMiddleware``: ``*.example.com`` allowed); others get 400.
      Default ``*``: any.
    * ``TUNECACHE_FORWARDED_ALLOW_IPS``: addresses of proxies whose ``X-Forwarded-Proto`` and
      ``X-Forwarded-For`` are believed (uvicorn's ``forwarded_allow_ips``, comma-separated,
      networks allowed, ``*``: any). Default: the loopback addresses.
    * ``TUNECACHE_ACCESS_LOG``: log every request (uvicorn's access log; off by default:
      under a boot storm it costs a fifth of the CPU).
    * ``TUNECACHE_REPORT_RETENTION_DAYS``: pod reports (``POST /v1/reports``) older than
      this are deleted (each process checks at most once a minute, after a report).
    * ``TUNECACHE_REPORT_SOURCE_MAX``: pod reports one source (a token's name, else the
      client address; an IPv6 one as its /64) may have stored per hour, per process
      (2,000); past it reports are answered 202 and not stored (never 429: a real pod behind
      a flooder's address is not refused), counted in ``tunecache_pod_reports_dropped_total``.
      48,000 reports a day per source and process: ~1.5 GB at the largest reports
      (32 KiB), ~50 MB at a pod's usual ~1 KB (``tunecache.service.report_bounds``).
    * ``TUNECACHE_REPORT_BOOTS_PER_KEY``: pod boots one source may count for one key per
      hour (100): one address cannot make a key look wanted by a fleet.
    * ``TUNECACHE_REPORT_NEW_KEYS``: keys without a current tuning one source may bring into
      the fleet view per hour (20).
    * ``TUNECACHE_REPORT_FLUSH_SECONDS``: pod reports are taken in memory and stored in
      batches at least this often (0.5 s; ``tunecache.service.report_intake``).
    * ``TUNECACHE_REPORT_INTAKE_MAX``: reports a process holds not yet stored at most
      (20,000); past it ``POST /v1/reports`` answers 503 with ``Retry-After``.
    * ``TUNECACHE_RUN_RETENTION``: runs kept per key and environment (10), newest first;
      older ones are deleted with their artifact rows, except the current run, pinned runs
      (``PUT /v1/tunings/{id}/pin``), a run a tuning job points at and runs recorded within
      the grace. ``off`` keeps every run; ``0`` is refused (say ``off``, or at least 1).
    * ``TUNECACHE_RETENTION_GRACE_SECONDS``: runs recorded and blobs uploaded within this
      long (3600) are never deleted: a run being recorded, bytes uploaded for a run not yet
      recorded. Blobs no run refers to any more are deleted once past it.
    * ``TUNECACHE_MIRROR_MAX_BYTES``: bytes of artifact files this node mirrors under
      ``<data dir>/artifact-cache`` at most (10 GiB); least recently used files are evicted
      past it (a file used in the last minute stays), and files of deleted blobs go.
    * ``TUNECACHE_RETENTION_INTERVAL_SECONDS``: each server process runs the retention pass
      (``tunecache.service.retention``) at most this often (3600), in a thread of its own,
      the first about a minute after start; ``tunecache prune`` runs one on demand.
    * ``TUNECACHE_ARTIFACT_STORE``: where artifact bytes are stored. Unset (or
      ``database``): in the database, 4 MiB chunks (the embedded default).
      ``s3://bucket/prefix``: objects in an S3-compatible store, reached as the AWS SDKs
      read the environment (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``,
      ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``); the metadata stays in the database, and
      blobs stored before the switch are still read where they are (``tunecache db
      move-artifacts`` moves them; :mod:`tunecache.service.artifact_store`).
    * ``TUNECACHE_ARTIFACT_REDIRECT``: ``on``: ``GET /v1/artifacts/{sha256}`` of a blob in the
      object store answers 307 to a presigned URL of the store, and pods download from the
      store directly (it must then be reachable from them at ``AWS_ENDPOINT_URL``). ``off``
      (the default): the service sends the bytes itself, from its mirror, so the store may
      be private to the service. Range requests are always served by the service.
    * ``TUNECACHE_PRESIGN_SECONDS``: how long a redirect's presigned URL is valid (300).

    Renamed settings (:data:`RENAMED_VARIABLES`): the old variable is read when the new one
    is unset, and ``Settings(worker=..., workers=...)`` still sets ``job_worker`` and
    ``server_processes``, which ``.worker`` and ``.workers`` still read.
    """

    model_config = SettingsConfigDict(env_prefix="TUNECACHE_", extra="ignore")

    database_url: str | None = None
    data_dir: Path = Field(default_factory=_default_data_dir)
    max_upload_bytes: int = Field(default=256 * 1024 * 1024, gt=0)
    host: str = "127.0.0.1"
    port: int = Field(default=8321, gt=0, lt=65536)
    job_worker: Literal["auto", "on", "off"] = "auto"
    lease_seconds: float = Field(default=60.0, gt=0)
    job_timeout_seconds: float = Field(default=3600.0, gt=0)
    job_max_attempts: int = Field(default=3, gt=0)
    worker_poll_seconds: float = Field(default=2.0, gt=0)
    server_processes: int = Field(default=1, gt=0, le=64)
    threads: int = Field(default=40, gt=0, le=1024)
    db_pool_size: int | None = Field(default=None, gt=0, le=1024)
    db_pool_timeout: float = Field(default=2.0, gt=0, le=300)
    db_connect_timeout: float = Field(default=5.0, gt=0, le=300)
    db_statement_timeout: float = Field(default=10.0, gt=0, le=3600)
    #: Seconds a statement waits for a lock (PostgreSQL lock_timeout; SQLite's busy timeout is the statement's).
    db_lock_timeout: float = Field(default=2.0, gt=0, le=3600)
    #: Seconds /v1/health takes at most, whatever the database does.
    health_timeout: float = Field(default=1.0, gt=0, le=60)
    #: Seconds a lookup answer stays servable from memory while the generation cannot be read.
    lookup_stale_seconds: float = Field(default=60.0, ge=0, le=86400)
    #: Seconds a lookup waits for the generation before it answers from memory (stale).
    lookup_stale_after: float = Field(default=0.5, gt=0, le=60)
    #: Threads per process that read mirrored artifact files (never taken by database work).
    file_threads: int = Field(default=8, gt=0, le=1024)
    max_in_flight: int = Field(default=256, gt=0, le=100_000)
    retry_after_seconds: int = Field(default=1, gt=0, le=3600)
    lookup_cache_entries: int = Field(default=4096, ge=0, le=1_000_000)
    max_json_bytes: int = Field(default=4 * 1024 * 1024, gt=0)
    keep_alive_seconds: int = Field(default=5, gt=0, le=3600)
    header_timeout_seconds: float = Field(default=10.0, gt=0, le=3600)
    body_timeout_seconds: float = Field(default=30.0, gt=0, le=3600)
    send_timeout_seconds: float = Field(default=30.0, gt=0, le=3600)
    max_connections_per_address: int = Field(default=512, gt=0, le=1_000_000)
    allowed_hosts: str = "*"
    forwarded_allow_ips: str = "127.0.0.1,::1"
    access_log: bool = False
    job_request_rate: str = "30/minute"
    read_token_required: bool = False
    signing_key: Path | None = None
    #: Ed25519 public keys whose runs may become current (a file or inline keys, as pods read
    #: them: tunecache.signing.load_trusted_keys); unset: any verified run may.
    trusted_keys: str | None = None
    model_config_dir: Path | None = None
    token_cache_seconds: float = Field(default=10.0, gt=0, le=3600)
    report_retention_days: float = Field(default=14.0, gt=0, le=3650)
    report_source_max: int = Field(default=2000, ge=1, le=100_000_000)
    report_boots_per_key: int = Field(default=100, ge=1, le=100_000_000)
    report_new_keys: int = Field(default=20, ge=1, le=100_000_000)
    #: serve creates the first admin token (in <data dir>/admin.token) on a database with none;
    #: off on nodes whose data directory no operator reads (a tuner pod).
    bootstrap_admin_token: bool = True
    #: Where this node's job worker fetches a recorded vLLM warmup from for its verification
    #: boot (serve sets it to its own listen address when unset; "off": no verification boot).
    verify_url: str | None = Field(default=None, max_length=2048)
    #: Opt-in: queue a vLLM warmup of an engine variant once this many pod boots reported it
    #: missing within auto_tune_variant_hours (0: never; tunecache.service.variant_autotune).
    auto_tune_variants: int = Field(default=0, ge=0, le=1_000_000)
    auto_tune_variant_hours: float = Field(default=1.0, gt=0, le=720)
    #: Pod reports are stored in batches at least this often, seconds (tunecache.service.report_intake).
    report_flush_seconds: float = Field(default=0.5, gt=0, le=60)
    #: Reports a process holds not yet stored at most; past it POST /v1/reports answers 503.
    report_intake_max: int = Field(default=20_000, ge=1, le=10_000_000)
    #: Runs kept per key and environment (None: "off", every run); tunecache.service.retention.
    run_retention: int | None = Field(default=10, ge=1, le=1_000_000)
    #: Seconds within which recorded runs and uploaded blobs are never deleted.
    retention_grace_seconds: float = Field(default=3600.0, ge=0, le=365 * 86400)
    #: Bytes of mirrored artifact files per node at most (least recently used evicted past it).
    mirror_max_bytes: int = Field(default=10 * 1024**3, gt=0)
    #: Seconds between a process's retention passes.
    retention_interval_seconds: float = Field(default=3600.0, gt=0, le=30 * 86400)
    #: Where artifact bytes are stored: None/"database", or s3://bucket/prefix (tunecache.service.artifact_store).
    artifact_store: str | None = None
    #: GET of an artifact in the object store answers 307 to a presigned URL.
    artifact_redirect: bool = False
    #: Seconds a presigned URL is valid.
    presign_seconds: int = Field(default=300, ge=1, le=7 * 86400)

    def __init__(self, **values: Any) -> None:
        for old, new in RENAMED_FIELDS.items():  # old keyword names, kept for compatibility
            if old in values:
                values.setdefault(new, values.pop(old))
        super().__init__(**values)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """pydantic-settings' sources, with the renamed variables' old names read right
        after the environment (earlier sources win)."""
        return init_settings, env_settings, _OldVariableNames(settings_cls), dotenv_settings, file_secret_settings

    @property
    def worker(self) -> str:
        """``job_worker`` under its old name (kept for compatibility)."""
        return self.job_worker

    @property
    def workers(self) -> int:
        """``server_processes`` under its old name (kept for compatibility)."""
        return self.server_processes

    @property
    def pool_size(self) -> int:
        """Connections per process: ``db_pool_size``, or one per thread and one each for
        the generation reader, the report flusher and the retention pass (which hold theirs
        outside the threads), so that a thread never waits for a connection another thread
        is not using."""
        return self.db_pool_size or self.threads + 3

    @property
    def admin_token_file(self) -> Path:
        """Where ``tunecache serve`` writes the admin token it creates on a service with none."""
        return self.data_dir / "admin.token"

    @property
    def artifact_cache_dir(self) -> Path:
        """Where downloaded artifacts are mirrored as files (content-addressed, immutable)."""
        return self.data_dir / "artifact-cache"

    @property
    def allowed_host_list(self) -> list[str]:
        """``allowed_hosts`` as a list, for starlette's ``TrustedHostMiddleware``."""
        return [host.strip() for host in self.allowed_hosts.split(",") if host.strip()]

    @field_validator("allowed_hosts")
    @classmethod
    def _hosts(cls, value: str) -> str:
        hosts = [host.strip() for host in value.split(",") if host.strip()]
        if not hosts:
            raise ValueError("must name at least one host, or * for any")
        for host in hosts:
            if host != "*" and "*" in host and not (host.startswith("*.") and "*" not in host[2:]):
                raise ValueError(f"{host!r}: a wildcard may only begin a domain, as *.example.com")
        return value

    @field_validator("run_retention", mode="before")
    @classmethod
    def _retention(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip().lower() == "off":
            return None
        if value is not None and str(value).strip() == "0":
            raise ValueError("0 would keep only the current and pinned runs: say off to keep every run, or at least 1")
        return value

    @field_validator("artifact_store")
    @classmethod
    def _artifact_store(cls, value: str | None) -> str | None:
        if value is None or not value.strip() or value.strip() == "database":
            return None
        from urllib.parse import urlsplit

        parts = urlsplit(value.strip())
        if parts.scheme != "s3" or not parts.netloc or parts.query or parts.fragment:
            raise ValueError("must be database or s3://bucket/prefix")
        return value.strip()

    @field_validator("job_request_rate")
    @classmethod
    def _rate(cls, value: str) -> str:
        from limits import parse_many

        try:
            rates = parse_many(value)
        except ValueError:
            rates = []
        if len(rates) != 1 or rates[0].amount < 1:
            raise ValueError("must be one rate of at least 1, like 30/minute (count/second|minute|hour|day)")
        return value

    def resolved_database_url(self) -> str:
        """The database URL; the SQLite default is ``sqlite:///<data_dir>/tunecache.db``."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{self.data_dir / 'tunecache.db'}"

