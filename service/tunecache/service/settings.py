"""Service settings, read from ``TUNECACHE_*`` environment variables (pydantic-settings)."""

from __future__ import annotations

import os
from pathlib import Path

from typing import Any, Literal

from pydantic import Field, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from tunecache.service.client_address import parse_trusted_proxies

#: Renamed variables: field -> the variable's old name, still read (after the new name
#: ``TUNECACHE_<FIELD>``, which wins when both are set; docs/glossary.md lists the renames).
RENAMED_VARIABLES = {"job_worker": "TUNECACHE_WORKER", "server_processes": "TUNECACHE_WORKERS",
                     "trusted_proxies": "TUNECACHE_FORWARDED_ALLOW_IPS"}
#: The same fields' old keyword names in ``Settings(...)``, still accepted.
RENAMED_FIELDS = {"worker": "job_worker", "workers": "server_processes", "forwarded_allow_ips": "trusted_proxies"}
#: Variables no longer read -> the field that replaced them (whose description says so).
RETIRED_VARIABLES = {"TUNECACHE_REPORT_RATE": "report_source_max"}

#: A node's variables read from the environment where they are used, not through
#: :class:`Settings` (the tuner reads them in its own process): each declared as a field is,
#: its default and its ``description`` (the operator guide's settings table shows them).
NODE_VARIABLES: dict[str, FieldInfo] = {
    "TUNECACHE_GPU_LOCK_DIR": Field(default=None, json_schema_extra={
        "shown_default": "the system's temporary directory", "accepted": "path"}, description=(
        "where tuners keep their GPU lock files (`tunecache-gpu-<CUDA_VISIBLE_DEVICES or all>.lock`): a second "
        "tuner for the same GPUs waits for the first (`tunecache.service.tuner.guard`)")),
    "TUNECACHE_VLLM_ENGINE_ARGS": Field(default=None, json_schema_extra={"accepted": "JSON object"}, description=(
        "on a tuning node, extra `vllm.LLM` arguments of the vLLM warmup (`tune --warmup vllm`) as a JSON object of "
        "identifiers (e.g. `{\"attention_backend\": \"FLASHINFER\"}`): the fleet's engine settings that decide which "
        "kernels warm up; an argument the key sets (model, max_num_batched_tokens, parallel sizes, dtype, ...) is "
        "refused; the node operator's own, so not held to the engine-argument allow-list that a variant's "
        "`--engine-args` and a job's `engine_args` are, which go over them (`tunecache.service.tuner.vllm_warmup`)")),
}
#: Set by a tuner's parent (the job worker, ``tunecache tune``) for the child processes it starts
#: (the tuner, a verification boot), through their environment: not a setting to give.
TUNER_HANDOFF_VARIABLES: dict[str, FieldInfo] = {
    "TUNECACHE_TUNER_PARENT_PID": Field(default=None, json_schema_extra={
        "shown_default": "the parent's process id"}, description=(
        "the tuner child and the verification boot: each kills its process group once its parent is no longer "
        "that process (`tunecache.service.tuner.guard.die_with_parent`)")),
}


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


#: Default of ``TUNECACHE_MAX_UPLOAD_BYTES``: 4 GiB, above the largest artifact a tuner makes.
DEFAULT_MAX_UPLOAD_BYTES = 4 << 30

class Settings(BaseSettings):
    """Configuration of one service process, read from ``TUNECACHE_<FIELD>`` variables.

    Each field's ``description`` is its documentation: the operator guide's settings table is
    made from them (``scripts/settings_docs.py``), with :data:`NODE_VARIABLES` beside them.

    Renamed settings (:data:`RENAMED_VARIABLES`): the old variable is read when the new one
    is unset, and ``Settings(worker=..., workers=...)`` still sets ``job_worker`` and
    ``server_processes``, which ``.worker`` and ``.workers`` still read.
    """

    model_config = SettingsConfigDict(env_prefix="TUNECACHE_", extra="ignore")

    database_url: str | None = Field(default=None, json_schema_extra={
        "shown_default": "`sqlite:///<data dir>/tunecache.db`"}, description=(
        "SQLAlchemy URL of the database; PostgreSQL as `postgresql+psycopg://user:pw@host/db`. Unset: the SQLite "
        "file `tunecache.db` in `TUNECACHE_DATA_DIR`"))
    data_dir: Path = Field(default_factory=_default_data_dir, json_schema_extra={
        "shown_default": "`$XDG_DATA_HOME/tunecache` or `~/.local/share/tunecache`"}, description=(
        "where the default SQLite file lives, and the node's `admin.token` and artifact mirror (`artifact-cache`)"))
    max_upload_bytes: int = Field(default=DEFAULT_MAX_UPLOAD_BYTES, gt=0, description=(
        "largest request body accepted (an artifact upload), checked as it streams to the spool; above it: 413. The "
        "default fits the largest artifacts a tuner makes: one FlashInfer JIT module's tarball (its `.so` and "
        "objects) of a fused-MoE or wide-head-dim kernel family is hundreds of MB, a whole architecture's "
        "ahead-of-time module set about 2 GB; pods unpack at most `TUNECACHE_MAX_UNPACK_BYTES` of it"))
    host: str = Field(default="127.0.0.1", description="where `tunecache serve` listens (`serve --host`)")
    port: int = Field(default=8321, gt=0, lt=65536, description=(
        "the port `tunecache serve` listens on (`serve --port`); a value that is not a port (Kubernetes' "
        "`TUNECACHE_PORT=tcp://...` of a Service called `tunecache`) is refused, exit 2"))
    job_worker: Literal["auto", "on", "off"] = Field(default="auto", description=(
        "`auto`: run the job worker when this node has a CUDA GPU; `on`: refuse to start without a usable one; "
        "`off`: lookups only"))
    lease_seconds: float = Field(default=60.0, gt=0, description="a claimed job's lease, renewed every third of it")
    job_timeout_seconds: float = Field(default=3600.0, gt=0, description="the tuner child is killed after this long")
    job_max_attempts: int = Field(default=3, gt=0, description=(
        "claims of one job before it is failed (its job workers kept dying)"))
    worker_poll_seconds: float = Field(default=2.0, gt=0, description=(
        "an idle job worker's wait between claim attempts"))
    server_processes: int = Field(default=1, gt=0, le=64, description=(
        "server processes of `tunecache serve` (`serve --processes N`, uvicorn's worker processes in its factory "
        "mode); one of a node's processes runs the job worker (a lock file in the data dir)"))
    threads: int = Field(default=40, gt=0, le=1024, description=(
        "threads per process that run database work (the sync routes)"))
    db_pool_size: int | None = Field(default=None, gt=0, le=1024, json_schema_extra={
        "shown_default": "`TUNECACHE_THREADS` + 3"}, description=(
        "database connections per process: by default one per thread, and one each for the generation reader, the "
        "report flusher and the retention pass (no overflow: a thread never waits for a connection another thread "
        "is not using)"))
    db_pool_timeout: float = Field(default=2.0, gt=0, le=300, description=(
        "seconds a request waits for a database connection; then 503 + `Retry-After`"))
    db_connect_timeout: float = Field(default=5.0, gt=0, le=300, description="seconds to connect to the database")
    db_statement_timeout: float = Field(default=10.0, gt=0, le=3600, description=(
        "seconds one statement may run (PostgreSQL `statement_timeout`; SQLite's busy timeout)"))
    db_lock_timeout: float = Field(default=2.0, gt=0, le=3600, description=(
        "seconds a statement waits for a lock before it fails (PostgreSQL `lock_timeout`; SQLite's busy timeout is "
        "the statement's): a table locked by a migration or a stuck session gives 503 + `Retry-After` instead of "
        "holding the request's thread for the statement timeout"))
    health_timeout: float = Field(default=1.0, gt=0, le=60, description=(
        "`/v1/health` answers within this many seconds whatever the database does: `degraded` when the database "
        "did not answer in time (see [when the disk or the database fails]"
        "(operator-guide.md#when-the-disk-or-the-database-fails))"))
    lookup_stale_seconds: float = Field(default=60.0, ge=0, le=86400, description=(
        "while the tuning generation cannot be read, a lookup answer held in memory is served stale (header "
        "`Tunecache-Stale`) if the generation's last read began at most this long ago; 0: never"))
    lookup_stale_after: float = Field(default=0.5, gt=0, le=60, description=(
        "seconds a lookup waits for the tuning generation before it answers from memory (stale, see "
        "`TUNECACHE_LOOKUP_STALE_SECONDS`)"))
    file_threads: int = Field(default=8, gt=0, le=1024, description=(
        "threads per process that read mirrored artifact files, apart from `TUNECACHE_THREADS`: file serving never "
        "waits for database work"))
    max_in_flight: int = Field(default=256, gt=0, le=100_000, description=(
        "requests one process handles at once; the next get 503 + `Retry-After` at once"))
    retry_after_seconds: int = Field(default=1, gt=0, le=3600, description="the `Retry-After` of every 503")
    lookup_cache_entries: int = Field(default=4096, ge=0, le=1_000_000, description=(
        "lookup answers held in memory per process (0: off)"))
    max_json_bytes: int = Field(default=4 * 1024 * 1024, gt=0, description=(
        "largest body of the JSON routes; above it: 413"))
    keep_alive_seconds: int = Field(default=5, gt=0, le=3600, description=(
        "an idle HTTP/1.1 connection (after an answer, or new and silent) is closed after this long (uvicorn's "
        "`timeout_keep_alive`). Behind a proxy or load balancer that keeps connections to the service open, set it "
        "above the proxy's idle timeout: else the proxy now and then reuses a connection just as the service "
        "closes it, and gets a reset"))
    header_timeout_seconds: float = Field(default=10.0, gt=0, le=3600, description=(
        "a request's headers must be complete this long after their first byte; past it: 408 and the connection "
        "closed (`tunecache.service.connections`)"))
    body_timeout_seconds: float = Field(default=30.0, gt=0, le=3600, description=(
        "the longest wait for the next piece of a request body (an upload that keeps moving is never cut); past it: "
        "408 and the connection closed (`tunecache.service.limits`)"))
    send_timeout_seconds: float = Field(default=30.0, gt=0, le=3600, description=(
        "an answer the client takes nothing of for this long is dropped (the connection reset)"))
    max_connections_per_address: int = Field(default=512, gt=0, le=1_000_000, description=(
        "connections one client address may hold open to one process; the next get 429 and are closed. Behind a "
        "proxy every connection comes from the proxy's address(es): keep it above the proxy's connections to one "
        "process"))
    allowed_hosts: str = Field(default="*", description=(
        "the `Host` headers the service answers, comma-separated (`tunecache.internal,*.svc.cluster.local`; "
        "starlette's `TrustedHostMiddleware`; a wildcard only begins a domain, as `*.example.com`); another gets "
        "400. `*`: any. Name every name pods, probes and proxies use (a kubelet probe sends the pod's IP)"))
    trusted_proxies: str = Field(default="", json_schema_extra={"shown_default": "none", "accepted": (
        "addresses and networks, comma-separated")}, description=(
        "the proxies whose `X-Forwarded-For` and `X-Forwarded-Proto` are believed (`10.0.0.5,10.1.0.0/16`; `*` is "
        "refused: name each). From any other peer, loopback included, both are ignored and the client is the "
        "connection's peer. Behind a TLS proxy named here, the dashboard's cookies are `Secure` and a pod report's "
        "source is the pod's address (`tunecache.service.client_address`)"))
    access_log: bool = Field(default=False, description=(
        "log every request (uvicorn's access log, one line per request; off by default: under a boot storm it costs "
        "a fifth of the CPU)"))
    job_request_rate: str = Field(default="30/minute", description=(
        "tuning-job requests one token may make per process, one rate of at least 1 in the `limits` package's "
        "notation (count/second|minute|hour|day); past it: 429 + `Retry-After`"))
    read_token_required: bool = Field(default=False, description=(
        "reads (lookups, artifacts, history, jobs) need a token of any scope; off by default (trusted in-cluster "
        "networks keep pod boots simple). Writes always need one"))
    reads_show_identities: bool = Field(default=False, description=(
        "every reader sees the token names and the host names of nodes, pods and job workers that runs, jobs and "
        "reports carry (`recorded_by`, `node`, `worker`, `cancelled_by`, a job's log tail, a report's pod); off by "
        "default: only an `admin` token sees them, others see `(hidden)` (`tunecache.service.redaction`)"))
    signing_key: Path | None = Field(default=None, description=(
        "this tuner node's Ed25519 private key (`tunecache keys generate`); the job worker signs every run it "
        "records with it (`tune --signing-key` reads it too)"))
    trusted_keys: str | None = Field(default=None, description=(
        "Ed25519 public keys whose runs may become current (a file or inline keys, as pods read them: "
        "`tunecache.signing.load_trusted_keys`): the service verifies each run's signature at record and holds back "
        "any other (the promotion policy, [trust.md](trust.md#publishing-what-becomes-current)); unset: any verified "
        "run of a `tune` or `admin` token may"))
    model_config_dir: Path | None = Field(default=None, description=(
        "a directory of model configs on this node, one `<org>/<name>/config.json` per model: a tuning job that "
        "carries no `hf_config` is tuned with its model's file here (a name with `..`, an absolute name or a "
        "symlink out of the directory finds nothing). Unset: such a job fails at once"))
    token_cache_seconds: float = Field(default=10.0, gt=0, le=3600, description=(
        "how long a process trusts a token it checked for a read (a revoked token still reads for at most this "
        "long; writes check every time)"))
    report_retention_days: float = Field(default=14.0, gt=0, le=3650, description=(
        "pod reports (`POST /v1/reports`) older than this are deleted (each process checks at most once a minute, "
        "after a report it took)"))
    report_source_max: int = Field(default=2000, ge=1, le=100_000_000, description=(
        "pod reports one source (a token's name, else the client address; an IPv6 one by its /64) may have stored "
        "per hour, per process; past it: 202 and not stored (never 429: a real pod behind a flooder's address is not "
        "refused), counted in `tunecache_pod_reports_dropped_total{reason=\"source\"}`. That bounds a source's "
        "growth of the database to 48,000 reports a day per process: ~1.5 GB at the largest reports (32 KiB), "
        "~50 MB at a pod's usual ~1 KB (`tunecache.service.report_bounds`). Replaces `TUNECACHE_REPORT_RATE` "
        "(its 429 is gone)"))
    report_boots_per_key: int = Field(default=100, ge=1, le=100_000_000, description=(
        "pod boots one source may count for one key per hour, per process (one address cannot make a key look "
        "wanted by a fleet); past it: 202 and not stored (`reason=\"key\"`)"))
    report_new_keys: int = Field(default=20, ge=1, le=100_000_000, description=(
        "keys without a current run one source may bring into the fleet view per hour, per process; past it: 202 "
        "and not stored (`reason=\"new_key\"`)"))
    bootstrap_admin_token: bool = Field(default=True, description=(
        "`serve` on a database without tokens creates the first admin token, in `<data dir>/admin.token` "
        "(`admin-<hash>.token` where that file is another database's), and records beside it where it listens, for "
        "client commands on the machine to send it there only ([trust.md](trust.md#the-local-admin-token)); `false` "
        "on nodes whose data directory no operator reads (a tuner pod); `tunecache db admin-token` makes one in the "
        "database anytime"))
    verify_url: str | None = Field(default=None, max_length=2048, json_schema_extra={
        "shown_default": "`serve`'s own address (`http://127.0.0.1:<port>`, `https` with `--ssl-certfile`)"},
        description=(
        "where this node's job worker fetches a recorded vLLM warmup from for its verification boot (with the "
        "service's own token settings, trusting the node's `TUNECACHE_SIGNING_KEY`); `off`: no verification boot"))
    auto_tune_variants: int = Field(default=0, ge=0, le=1_000_000, description=(
        "opt-in: queue a vLLM warmup of an [engine variant](pods.md#the-whole-warm-state) once pods reported it "
        "missing with this many distinct tokens (of `TUNECACHE_AUTO_TUNE_TOKEN_SCOPE` or above, not revoked) within "
        "`TUNECACHE_AUTO_TUNE_VARIANT_HOURS`, with the engine arguments the most of those tokens reported; reports "
        "without a token never count ([auto-tune](operator-guide.md#automatic-tuning-of-engine-variants), "
        "`tunecache.service.variant_autotune`); 0: never"))
    auto_tune_variant_hours: float = Field(default=1.0, gt=0, le=720, description=(
        "the window of `TUNECACHE_AUTO_TUNE_VARIANTS`; a variant queued within it is not queued again (a tuning that "
        "fails is not repeated every batch of reports)"))
    auto_tune_token_scope: Literal["read", "push", "tune", "admin"] = Field(default="read", description=(
        "the least scope of a token whose pod reports count towards an automatic tuning; `push` where pods hold "
        "push tokens and people hold read ones"))
    auto_tune_jobs_per_key: int = Field(default=1, ge=1, le=1_000_000, description=(
        "automatic tuning jobs (`TUNECACHE_AUTO_TUNE_VARIANTS`) one key may get per hour; past it the variant is "
        "refused (`tunecache_auto_tune_refused_total{reason=\"budget_key\"}`)"))
    auto_tune_jobs_per_hour: int = Field(default=10, ge=1, le=1_000_000, description=(
        "automatic tuning jobs the whole service may queue per hour (every key, every process and replica); past "
        "it: `reason=\"budget_hour\"`"))
    auto_tune_jobs_queued: int = Field(default=2, ge=1, le=1_000_000, description=(
        "automatic tuning jobs queued or running at once, at most; past it: `reason=\"budget_queued\"`"))
    report_flush_seconds: float = Field(default=0.5, gt=0, le=60, description=(
        "pod reports are taken in memory and stored in batches (one insert each) at least this often "
        "(`tunecache.service.report_intake`)"))
    report_intake_max: int = Field(default=20_000, ge=1, le=10_000_000, description=(
        "pod reports a process holds not yet stored at most; past it `POST /v1/reports` answers 503 + "
        "`Retry-After`"))
    run_retention: int | None = Field(default=10, ge=1, le=1_000_000, description=(
        "runs kept per key and environment, newest first; older ones are deleted with their artifact rows (see "
        "[retention](operator-guide.md#retention), `tunecache.service.retention`), never the current run, a pinned "
        "run (`PUT /v1/tunings/{id}/pin`), a run a tuning job points at or one recorded within the grace. `off`: "
        "every run is kept; `0` is refused (say `off`, or at least 1)"))
    retention_grace_seconds: float = Field(default=3600.0, ge=0, le=365 * 86400, description=(
        "runs recorded and blobs uploaded within this long are never deleted (a run being recorded; bytes uploaded "
        "for a run not recorded yet); blobs no run refers to any more are deleted once past it"))
    mirror_max_bytes: int = Field(default=10 * 1024**3, gt=0, description=(
        "bytes of artifact files this node mirrors (`<data dir>/artifact-cache`) at most; past it the least recently "
        "used files are evicted (a file used in the last minute stays); files of deleted blobs are removed"))
    retention_interval_seconds: float = Field(default=3600.0, gt=0, le=30 * 86400, description=(
        "each server process runs the retention pass at most this often, in a thread of its own (the first about a "
        "minute after start); `tunecache prune` runs one on demand"))
    artifact_store: str | None = Field(default=None, json_schema_extra={"shown_default": "unset (the database)"},
                                       description=(
        "where artifact bytes are stored: unset or `database`, 4 MiB chunks in the database (the embedded default); "
        "`s3://bucket/prefix`, objects in an S3-compatible store reached as the AWS SDKs read the environment "
        "(`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`). The metadata stays in "
        "the database, and blobs stored before a switch are still read where they are (`tunecache db "
        "move-artifacts` moves them; [choosing the artifact store](operator-guide.md#choosing-the-artifact-store), "
        "`tunecache.service.artifact_store`)"))
    artifact_redirect: bool = Field(default=False, json_schema_extra={"shown_default": "`off`"}, description=(
        "`on`: `GET /v1/artifacts/{sha256}` of a blob in the object store answers 307 to a presigned URL of the "
        "store, and pods download from the store directly (it must then be reachable from them at "
        "`AWS_ENDPOINT_URL`); `off`: the service sends the bytes itself, from its mirror, so the store may be "
        "private to the service. Range requests are always served by the service"))
    presign_seconds: int = Field(default=300, ge=1, le=7 * 86400, description=(
        "how long a redirect's presigned URL is valid"))

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
    def artifact_cache_dir(self) -> Path:
        """Where downloaded artifacts are mirrored as files (content-addressed, immutable)."""
        return self.data_dir / "artifact-cache"

    @property
    def allowed_host_list(self) -> list[str]:
        """``allowed_hosts`` as a list, for starlette's ``TrustedHostMiddleware``."""
        return [host.strip() for host in self.allowed_hosts.split(",") if host.strip()]

    @property
    def trusted_proxy_list(self) -> list[str]:
        """``trusted_proxies`` as a list (:func:`tunecache.service.client_address.parse_trusted_proxies`)."""
        return parse_trusted_proxies(self.trusted_proxies)

    @field_validator("trusted_proxies")
    @classmethod
    def _proxies(cls, value: str) -> str:
        parse_trusted_proxies(value)  # raises naming the entry
        return value

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

