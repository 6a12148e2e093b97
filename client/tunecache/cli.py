"""``tunecache`` command line (typer).

Pod-side commands (``pull``, ``push``) import only the client; server commands
(``serve``, ``db``, ``tune``) import the service lazily.

Exit codes (also in the README):

====  =====================================================================
0     success (``pull``: tuning installed)
1     unexpected error
2     usage error (bad or missing option)
3     no compatible tuning on the server (``pull``); the closest ones are printed
4     server unreachable (connection refused, DNS, timeout)
5     the server answered with an error (4xx/5xx other than a lookup miss)
6     downloaded artifact corrupt (sha256 mismatch); nothing was installed
7     bad input file (not a FlashInfer autotune file, unreadable environment file,
      bad model config)
8     tuning failed (``tune``): the tuner process reported an error, died, or timed out
9     database not usable (schema out of date: run ``tunecache db upgrade``; unreachable;
      bad URL)
10    ``retune --wait``: the job did not finish within ``--wait-timeout`` (it goes on)
11    ``serve`` could not start listening (address in use, bad host)
12    ``pull``: the install could not be written (disk full, permissions); nothing was
      left half-written
====  =====================================================================
"""

from __future__ import annotations

import enum
import json
import re
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated, NoReturn, Optional

import typer

from tunecache.client.autotune_file import ARTIFACT_KIND, MEDIA_TYPE, NotAnAutotuneFile, parse_autotune_file
from tunecache.client.environment import EnvironmentUnavailable, detect_arch, detect_environment, environment_from_file
from tunecache.client.http import (
    ArtifactCorrupt,
    NoCompatibleTuning,
    ServerUnreachable,
    TunecacheClient,
    TunecacheError,
    client_from_environment,
)
from tunecache.client.install import check_file_name, fetch_tuning, install_jit_modules, pull_autotune_file
from tunecache.client.layouts import flashinfer_v2_root, install_v2_store, install_vllm_rank_files, vllm_autotune_root
from tunecache.client.jit_install import BadJitArtifact
from tunecache.identity import TuningKey


#: Tuner stage names (``tunecache.service.tuner.stages.STAGES``), for option checks.
STAGE_NAMES = ("gemm", "moe", "attention")


class ExitCode(enum.IntEnum):
    OK = 0
    UNEXPECTED = 1
    USAGE = 2
    NO_COMPATIBLE_TUNING = 3
    SERVER_UNREACHABLE = 4
    SERVER_ERROR = 5
    ARTIFACT_CORRUPT = 6
    BAD_INPUT = 7
    TUNING_FAILED = 8
    DATABASE = 9
    WAIT_TIMEOUT = 10
    SERVE_FAILED = 11
    INSTALL_FAILED = 12


app = typer.Typer(
    name="tunecache",
    help="Persistent autotune cache for LLM inference fleets: tune once per GPU node, install on every pod.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
db_app = typer.Typer(help="Database schema commands.", no_args_is_help=True)
app.add_typer(db_app, name="db")


def fail(code: ExitCode, message: str) -> NoReturn:
    """Print ``tunecache: error: <message>`` to stderr and exit with ``code``."""
    typer.echo(f"tunecache: error: {message}", err=True)
    raise typer.Exit(int(code))


ServerOpt = Annotated[str, typer.Option("--server", envvar="TUNECACHE_URL", help="tunecache server URL")]
ModelOpt = Annotated[str, typer.Option("--model", help="model name as given to vLLM (--model)")]
MnbtOpt = Annotated[int, typer.Option("--max-num-batched-tokens", min=1, help="vLLM's max_num_batched_tokens")]
DtypeOpt = Annotated[str, typer.Option("--dtype", help="vLLM's --dtype ('auto': as the checkpoint says)")]
QuantOpt = Annotated[str, typer.Option("--quantization", help="vLLM's --quantization ('auto': as the checkpoint says)")]
TpOpt = Annotated[int, typer.Option("--tensor-parallel-size", "-tp", min=1, help="tensor-parallel size")]
GpuNameOpt = Annotated[Optional[str], typer.Option("--gpu-name", help="GPU name (default: the environment's 'gpu')")]
ArchOpt = Annotated[Optional[str], typer.Option("--arch", help="GPU arch such as sm90 (default: detected)")]
EnvironmentOpt = Annotated[
    Optional[Path],
    typer.Option(help="FlashInfer cache file or JSON of its _metadata fields (default: detect with FlashInfer)"),
]
GemmBackendsOpt = Annotated[
    Optional[str], typer.Option("--gemm-backends", help="comma-separated FlashInfer GEMM backends (default: per arch)")
]
StagesOpt = Annotated[
    Optional[str], typer.Option("--stages", help="comma-separated tuner stages: gemm,moe,attention (default: all that apply)")
]
DatabaseOpt = Annotated[Optional[str], typer.Option("--database", envvar="TUNECACHE_DATABASE_URL", help="SQLAlchemy database URL")]


def _csv(value: str | None) -> list[str] | None:
    return [part.strip() for part in value.split(",") if part.strip()] if value else None


def _key(model: str, mnbt: int, gpu_name: str, arch: str | None, dtype: str, quantization: str, tp: int) -> TuningKey:
    try:
        return TuningKey(
            gpu_name=gpu_name,
            arch=arch or detect_arch(gpu_name),
            model=model,
            max_num_batched_tokens=mnbt,
            dtype=dtype,
            quantization=quantization,
            tensor_parallel_size=tp,
        )
    except EnvironmentUnavailable as exc:
        fail(ExitCode.USAGE, str(exc))
    except ValueError as exc:  # pydantic ValidationError
        fail(ExitCode.USAGE, f"invalid key: {exc.errors()[0]['loc'][0]}: {exc.errors()[0]['msg']}")  # type: ignore[attr-defined]


def _client_errors(exc: Exception) -> NoReturn:
    if isinstance(exc, ServerUnreachable):
        fail(ExitCode.SERVER_UNREACHABLE, str(exc))
    if isinstance(exc, ArtifactCorrupt):
        fail(ExitCode.ARTIFACT_CORRUPT, f"{exc}; nothing was installed")
    if isinstance(exc, TunecacheError):  # ServerError, or an answer that makes no sense
        fail(ExitCode.SERVER_ERROR, str(exc))
    raise exc


def _environment(path: Path | None):
    """The environment from ``--environment FILE`` (exit 7 if unusable), else detected with
    FlashInfer (exit 2 if FlashInfer is missing: the user must pass the file)."""
    try:
        return environment_from_file(path) if path else detect_environment()
    except EnvironmentUnavailable as exc:
        fail(ExitCode.BAD_INPUT if path else ExitCode.USAGE, str(exc))


def _client(server: str) -> TunecacheClient:
    """A client with the timeouts and retries of the environment (``client_from_environment``)."""
    try:
        return client_from_environment(server)
    except ValueError as exc:
        fail(ExitCode.USAGE, str(exc))


def _ready_engine(url: str):
    """An engine whose schema is current: SQLite is migrated here, PostgreSQL must already be
    (``tunecache db upgrade``). Exits 9 naming the problem otherwise."""
    from tunecache.service import db

    engine = _engine(url)
    try:
        if engine.dialect.name == "sqlite":
            db.upgrade(engine)
        db.check_schema(engine)
    except db.SchemaOutOfDate as exc:
        fail(ExitCode.DATABASE, str(exc))
    except Exception as exc:  # connection failures (OperationalError)
        shown = engine.url.render_as_string(hide_password=True)
        fail(ExitCode.DATABASE, f"database {shown} not usable: {str(exc).splitlines()[0]}")
    return engine


def _engine(url: str):
    """An engine for ``url``, or exit 9 naming what is wrong with it."""
    from tunecache.service import db

    try:
        return db.create_db_engine(url)
    except Exception as exc:  # bad URL, missing driver, unwritable SQLite directory
        fail(ExitCode.DATABASE, f"database URL {url!r} not usable: {type(exc).__name__}: {str(exc).splitlines()[0]}")


@app.command()
def push(
    file: Annotated[Path, typer.Argument(help="FlashInfer autotune cache file (AutoTuner.save_configs output)")],
    server: ServerOpt,
    model: ModelOpt,
    max_num_batched_tokens: MnbtOpt,
    gpu_name: GpuNameOpt = None,
    arch: ArchOpt = None,
    dtype: DtypeOpt = "auto",
    quantization: QuantOpt = "auto",
    tensor_parallel_size: TpOpt = 1,
    trigger: Annotated[str, typer.Option(help="'upload', or 'pod' for a pod's own tuning (stored unverified)")] = "upload",
) -> None:
    """Upload a FlashInfer autotune cache file; its environment is read from its _metadata."""
    try:
        data = file.read_bytes()
        parsed = parse_autotune_file(data, source=str(file))
    except OSError as exc:
        fail(ExitCode.BAD_INPUT, f"cannot read {file}: {exc.strerror}")
    except NotAnAutotuneFile as exc:
        fail(ExitCode.BAD_INPUT, str(exc))
    if trigger not in ("upload", "pod"):
        fail(ExitCode.USAGE, "--trigger must be 'upload' or 'pod'")
    key = _key(model, max_num_batched_tokens, gpu_name or parsed.environment.gpu, arch, dtype, quantization, tensor_parallel_size)
    with _client(server) as client:
        try:
            sha256 = client.upload_artifact(data)
            run = client.record_run(
                {
                    "key": key.model_dump(),
                    "environment": parsed.environment.model_dump(),
                    "trigger": trigger,
                    "node": socket.gethostname(),
                    "summary": {"entries": parsed.entries},
                    "artifacts": [{"kind": ARTIFACT_KIND, "name": "autotune.json", "media_type": MEDIA_TYPE, "sha256": sha256}],
                }
            )
        except Exception as exc:
            _client_errors(exc)
    state = "current" if run["is_current"] else "recorded, not current"
    typer.echo(f"stored run {run['id']} ({parsed.entries} entries, {state}) for {key.model} on {key.gpu_name}")


class Layout(str, enum.Enum):
    file = "file"
    vllm = "vllm"
    flashinfer_v2 = "flashinfer-v2"


@app.command()
def pull(
    server: ServerOpt,
    model: ModelOpt,
    max_num_batched_tokens: MnbtOpt,
    dest: Annotated[
        Optional[Path],
        typer.Option("--dest", help="file layout: directory for the cache file; vllm / flashinfer-v2: root (default: where vLLM reads)"),
    ] = None,
    environment: EnvironmentOpt = None,
    gpu_name: GpuNameOpt = None,
    arch: ArchOpt = None,
    dtype: DtypeOpt = "auto",
    quantization: QuantOpt = "auto",
    tensor_parallel_size: TpOpt = 1,
    layout: Annotated[
        Layout,
        typer.Option(help="file: a FlashInfer cache file; vllm: vLLM's per-rank files for every rank; flashinfer-v2: FlashInfer's v2 store"),
    ] = Layout.file,
    vllm_config_hash: Annotated[
        Optional[str], typer.Option(help="vllm layout: the <hash> directory (sha256 of VllmConfig.compute_hash) of the deployment")
    ] = None,
    data_parallel_size: Annotated[int, typer.Option(min=1, help="vllm layout: data-parallel size")] = 1,
    pipeline_parallel_size: Annotated[int, typer.Option(min=1, help="vllm layout: pipeline-parallel size (ranks per dp = tp x pp)")] = 1,
    file_name: Annotated[Optional[str], typer.Option(help="file layout: the file's name (default: from the key)")] = None,
    jit: Annotated[bool, typer.Option("--jit", help="also install the tuning's FlashInfer JIT modules into this pod's FlashInfer workspace")] = False,
    jit_workspace: Annotated[
        Optional[Path], typer.Option(help="install the JIT modules into this FlashInfer workspace directory instead")
    ] = None,
) -> None:
    """Fetch the tuning matching this GPU and environment and install it where FlashInfer or vLLM read it.

    Prints the installed path(s). Layout 'file': use with flashinfer.autotune(False, cache=PATH).
    """
    if file_name is not None:
        try:
            check_file_name(file_name)
        except ValueError as exc:
            fail(ExitCode.USAGE, str(exc))
    if layout is Layout.file and dest is None:
        fail(ExitCode.USAGE, "--dest DIR is needed for --layout file")
    if layout is Layout.vllm and not (vllm_config_hash and re.fullmatch(r"[0-9a-f]{64}", vllm_config_hash)):
        fail(ExitCode.USAGE, "--layout vllm needs --vllm-config-hash (64 hex digits; the tunecache vLLM plugin computes it itself)")
    env = _environment(environment)
    if environment is None and env.indeterminate_fields():
        fail(
            ExitCode.USAGE,
            f"FlashInfer could not detect {', '.join(env.indeterminate_fields())} here (no GPU?); "
            "pass --environment FILE",
        )
    key = _key(model, max_num_batched_tokens, gpu_name or env.gpu, arch, dtype, quantization, tensor_parallel_size)
    with _client(server) as client:
        try:
            if layout is Layout.file:
                installed = pull_autotune_file(client, key, env, dest, file_name, jit_workspace or jit)
                paths, modules, workspace = [installed.path], installed.jit_modules, installed.jit_workspace
            else:
                fetched = fetch_tuning(client, key, env, jit=bool(jit_workspace or jit))
                modules, workspace = install_jit_modules(fetched, jit_workspace or True) if (jit or jit_workspace) else ([], None)
                if layout is Layout.vllm:
                    root = dest or vllm_autotune_root(fetched.workspace_subdir)
                    # vLLM's world rank: data_parallel_rank * (tp * pp) + local rank
                    per_dp = tensor_parallel_size * pipeline_parallel_size
                    ranks = [(dp, dp * per_dp + rank) for dp in range(data_parallel_size) for rank in range(per_dp)]
                    paths = install_vllm_rank_files(fetched.autotune, root, vllm_config_hash, ranks)
                else:
                    paths = [install_v2_store(fetched.autotune, dest or flashinfer_v2_root())]
        except NoCompatibleTuning as exc:
            fail(ExitCode.NO_COMPATIBLE_TUNING, exc.explain())
        except BadJitArtifact as exc:
            fail(ExitCode.ARTIFACT_CORRUPT, f"{exc}; the tuning was not installed")
        except ImportError as exc:
            fail(ExitCode.USAGE, f"--layout {layout.value} needs FlashInfer installed here ({exc})")
        except ValueError as exc:
            fail(ExitCode.USAGE, str(exc))
        except OSError as exc:
            fail(ExitCode.INSTALL_FAILED, f"cannot write the install: {exc}")
        except Exception as exc:
            _client_errors(exc)
    if modules:
        typer.echo(f"installed {len(modules)} FlashInfer JIT modules into {workspace}", err=True)
    for path in paths:
        typer.echo(str(path))


@app.command()
def doctor(
    server: ServerOpt,
    model: ModelOpt,
    max_num_batched_tokens: MnbtOpt,
    environment: EnvironmentOpt = None,
    gpu_name: GpuNameOpt = None,
    arch: ArchOpt = None,
    dtype: DtypeOpt = "auto",
    quantization: QuantOpt = "auto",
    tensor_parallel_size: TpOpt = 1,
) -> None:
    """Show this machine's FlashInfer environment, the key it would ask for, and what the
    server has for it: the matching run, or the closest ones and each field that differs.

    Exit 0 when the server has a matching tuning, 3 when not (as pull), 4/5 for server trouble.
    """
    env = _environment(environment)
    typer.echo("environment (FlashInfer _metadata" + (f", from {environment})" if environment else ", detected)"))
    for field, value in env.model_dump().items():
        typer.echo(f"  {field}: {value}")
    typer.echo(f"  environment hash: {env.environment_hash()}")
    if env.indeterminate_fields():
        typer.echo(f"  undetected: {', '.join(env.indeterminate_fields())} (no tuning can match these)")
    key = _key(model, max_num_batched_tokens, gpu_name or env.gpu, arch, dtype, quantization, tensor_parallel_size)
    typer.echo("key")
    for field, value in key.model_dump().items():
        typer.echo(f"  {field}: {value}")
    with _client(server) as client:
        try:
            run = client.lookup(key, env)
        except NoCompatibleTuning as exc:
            typer.echo(f"server {server}: no matching tuning")
            typer.echo(exc.explain())
            raise typer.Exit(int(ExitCode.NO_COMPATIBLE_TUNING)) from None
        except Exception as exc:
            _client_errors(exc)
    kinds = sorted({a["kind"] for a in run["artifacts"]})
    typer.echo(
        f"server {server}: run {run['id']} matches ({run['summary'].get('entries')} entries, "
        f"finished {run['finished_at'] or run['created_at']}, artifacts: {', '.join(kinds)})"
    )


@app.command()
def serve(
    host: Annotated[Optional[str], typer.Option(help="listen address (TUNECACHE_HOST, default 127.0.0.1)")] = None,
    port: Annotated[Optional[int], typer.Option(help="listen port (TUNECACHE_PORT, default 8321)")] = None,
    database: DatabaseOpt = None,
) -> None:
    """Run the HTTP service. On SQLite (the default) the schema is migrated first; on
    PostgreSQL it must already be current (tunecache db upgrade)."""
    import uvicorn

    from tunecache.service.app import create_app
    from tunecache.service.settings import Settings

    from pydantic import ValidationError

    overrides = {k: v for k, v in {"host": host, "port": port, "database_url": database}.items() if v is not None}
    try:
        settings = Settings(**overrides)
    except ValidationError as exc:
        error = exc.errors()[0]
        fail(ExitCode.USAGE, f"invalid setting {error['loc'][0]} (TUNECACHE_{str(error['loc'][0]).upper()}): {error['msg']}")
    engine = _ready_engine(settings.resolved_database_url())
    shown = engine.url.render_as_string(hide_password=True)
    typer.echo(f"tunecache starting on http://{settings.host}:{settings.port} (database {shown})", err=True)
    try:
        uvicorn.run(create_app(settings, engine=engine), host=settings.host, port=settings.port, log_level="info")
    except SystemExit as exc:  # uvicorn exits 3 when it cannot bind or start
        if exc.code not in (0, None):
            fail(ExitCode.SERVE_FAILED, f"could not serve on {settings.host}:{settings.port} (see the log above)")


@db_app.command("upgrade")
def db_upgrade(database: DatabaseOpt = None) -> None:
    """Apply the schema migrations (Alembic) to the database."""
    from tunecache.service import db
    from tunecache.service.settings import Settings

    url = database or Settings().resolved_database_url()
    engine = _engine(url)
    try:
        db.upgrade(engine)
        revision = db.check_schema(engine)
    except Exception as exc:
        fail(ExitCode.DATABASE, f"cannot upgrade {engine.url.render_as_string(hide_password=True)}: {str(exc).splitlines()[0]}")
    typer.echo(f"database at revision {revision}")


@app.command()
def tune(
    model: ModelOpt,
    max_num_batched_tokens: MnbtOpt,
    config: Annotated[
        Optional[str],
        typer.Option(help="HF config: a directory with config.json, a JSON file, or a model type (default: --model)"),
    ] = None,
    dtype: DtypeOpt = "auto",
    quantization: QuantOpt = "auto",
    tensor_parallel_size: TpOpt = 1,
    server: Annotated[Optional[str], typer.Option("--server", help="store the run on this tunecache server")] = None,
    database: Annotated[
        Optional[str],
        typer.Option("--database", envvar="TUNECACHE_DATABASE_URL", help="store the run in this database directly"),
    ] = None,
    gemm_backends: GemmBackendsOpt = None,
    stages: StagesOpt = None,
    runner: Annotated[str, typer.Option(help="'native' (tunecache's stages) or 'vllm' (vLLM's own kernel_warmup; needs vllm and tp > 1)")] = "native",
    timeout: Annotated[float, typer.Option(min=1, help="seconds before the tuner process is killed")] = 3600.0,
    work_dir: Annotated[Optional[Path], typer.Option(help="keep the tuner's files here (default: a temporary directory)")] = None,
) -> None:
    """On a GPU node: run FlashInfer's autotuner for a model in a child process and store the run."""
    from tunecache.service.tuner.model_config import ModelConfigError, load_hf_config
    from tunecache.progress import ProgressDisplay
    from tunecache.service.tuner.runner import TunerFailed, run_tuner
    from tunecache.service.tuner.stages import TuneSpec

    if runner not in ("native", "vllm"):
        fail(ExitCode.USAGE, "--runner must be 'native' or 'vllm'")
    if server is not None:
        database = None  # --server wins over TUNECACHE_DATABASE_URL
    elif database is None:
        fail(ExitCode.USAGE, "give --server URL or --database URL (or set TUNECACHE_DATABASE_URL)")
    try:
        hf_config = load_hf_config(config or model)
    except ModelConfigError as exc:
        fail(ExitCode.BAD_INPUT, str(exc))
    spec = TuneSpec(
        model=model,
        hf_config=hf_config,
        max_num_batched_tokens=max_num_batched_tokens,
        tensor_parallel_size=tensor_parallel_size,
        dtype=dtype,
        quantization=quantization,
        gemm_backends=_csv(gemm_backends),
        stages=_csv(stages),
        runner=runner,
    )
    node = socket.gethostname()
    with tempfile.TemporaryDirectory(prefix="tunecache-tune-") as tmp:
        directory = work_dir or Path(tmp)
        try:
            with ProgressDisplay() as progress:
                result = run_tuner(spec, directory, timeout, on_event=progress.update)
        except TunerFailed as failure:
            _store_failure(spec, failure, server, database, node)
            fail(ExitCode.TUNING_FAILED, f"{failure.message}\n{failure.log_tail}".rstrip())
        run = _store_result(spec, result, server, database, node)
    typer.echo(
        f"stored run {run['id']}: {result.summary['entries']} entries in {result.summary['tuning_seconds']:.1f} s "
        f"for {model} on {result.gpu_name} ({result.arch})"
    )


@app.command()
def retune(
    server: ServerOpt,
    model: ModelOpt,
    max_num_batched_tokens: MnbtOpt,
    gpu_name: Annotated[str, typer.Option("--gpu-name", help="GPU to tune for, e.g. 'NVIDIA H200'")],
    arch: ArchOpt = None,
    dtype: DtypeOpt = "auto",
    quantization: QuantOpt = "auto",
    tensor_parallel_size: TpOpt = 1,
    config: Annotated[
        Optional[Path], typer.Option(help="HF config.json (or its directory) to send with the job")
    ] = None,
    gemm_backends: GemmBackendsOpt = None,
    stages: StagesOpt = None,
    wait: Annotated[bool, typer.Option("--wait", help="follow the job to its end with a progress bar")] = False,
    wait_timeout: Annotated[float, typer.Option(min=0, help="seconds to wait with --wait")] = 7200.0,
    poll: Annotated[float, typer.Option(min=0.05, help="seconds between polls with --wait")] = 2.0,
) -> None:
    """Ask the service to (re-)tune a key on a GPU node; one job per key however many ask."""
    key = _key(model, max_num_batched_tokens, gpu_name, arch, dtype, quantization, tensor_parallel_size)
    hf_config = None
    if config is not None:
        path = config / "config.json" if config.is_dir() else config
        try:
            hf_config = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            fail(ExitCode.BAD_INPUT, f"cannot read model config {path}: {exc}")
        if not isinstance(hf_config, dict):
            fail(ExitCode.BAD_INPUT, f"model config {path} is not a JSON object")
    unknown = sorted(set(_csv(stages) or []) - set(STAGE_NAMES))
    if unknown:
        fail(ExitCode.USAGE, f"unknown stages {', '.join(unknown)} (choose from {', '.join(STAGE_NAMES)})")
    with _client(server) as client:
        try:
            job = client.create_job(key, hf_config, _csv(gemm_backends), _csv(stages))
            typer.echo(f"job {job['id']}: {job['status']} ({key.model}, {key.gpu_name}, max_num_batched_tokens {key.max_num_batched_tokens})")
            if not wait:
                return
            deadline = time.monotonic() + wait_timeout
            from tunecache.progress import ProgressDisplay

            with ProgressDisplay() as progress:
                while job["status"] in ("queued", "running"):
                    if time.monotonic() > deadline:
                        fail(ExitCode.WAIT_TIMEOUT, f"job {job['id']} still {job['status']} after {wait_timeout:g} s")
                    time.sleep(poll)
                    job = client.get_job(job["id"])
                    progress.update_from_job(job)
        except Exception as exc:
            _client_errors(exc)
    if job["status"] == "failed":
        fail(ExitCode.TUNING_FAILED, f"job {job['id']} failed: {job['error']}")
    typer.echo(f"job {job['id']}: succeeded in {job['duration_s']:.1f} s; run {job['run_id']} is current")


def _store_result(spec, result, server: str | None, database: str | None, node: str) -> dict:
    from tunecache.service.tuner import recording

    if server is not None:
        with _client(server) as client:
            try:
                return recording.record_over_http(client, spec, result, "cli", node)
            except Exception as exc:
                _client_errors(exc)
    with _database_session(database) as session:
        return recording.record_in_database(session, spec, result, "cli", node).model_dump(mode="json")


def _store_failure(spec, failure, server: str | None, database: str | None, node: str) -> None:
    """Record a failed run in the history when the tuner got far enough to know its GPU."""
    from tunecache.service.tuner.recording import failed_run_record

    record = failed_run_record(spec, failure, "cli", node)
    if record is None:
        return
    if server is not None:
        with _client(server) as client:
            try:
                client.record_run(record.model_dump(mode="json"))
            except Exception as exc:
                _client_errors(exc)
        return
    from tunecache.service import repository

    with _database_session(database) as session:
        repository.record_run(session, record)
        session.commit()


def _database_session(url: str):
    from tunecache.service import db

    return db.session_factory(_ready_engine(url))()


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
