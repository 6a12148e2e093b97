"""The server's commands of ``tunecache``: ``serve``, ``db upgrade``, ``db move-artifacts``,
``prune`` and ``tune``.

Built with the client's command kit (:mod:`tunecache.cli_kit`: exit codes, the key
options, the root app), which holds none of the pod code. Registered on the client's typer
app through the ``tunecache.cli`` entry-point group (``tunecache.cli.load_command_plugins``
calls :func:`register`), so installing ``tunecache-server`` adds them to the same
``tunecache`` command; ``python -m tunecache.service`` runs them alone. This module imports
only typer and the kit at load time; the service's own dependencies (uvicorn, SQLAlchemy,
the tuner) are imported by the command that needs them, so the pod commands start as fast
with the server installed as without it. ``tune --server`` records through the store the
kit opens for a server (:func:`tunecache.cli_kit.server_store`: the client's HTTP client).
"""

from __future__ import annotations

import errno
import socket
import tempfile
from pathlib import Path
from typing import Annotated, Optional

import typer

from tunecache.cli_kit import (
    EngineArgsOpt,
    ExitCode,
    GemmBackendsOpt,
    KeyOptions,
    StagesOpt,
    client_errors,
    csv_option,
    engine_args_option,
    fail,
    first_error,
    key_options,
    server_store,
)
from tunecache.contract import RunTrigger

DatabaseOpt = Annotated[
    Optional[str], typer.Option("--database", envvar="TUNECACHE_DATABASE_URL", help="SQLAlchemy database URL")
]


def register(app: typer.Typer) -> None:
    """Add ``serve``, ``db upgrade``, ``prune`` and ``tune`` to the ``tunecache`` app (entry point of
    the ``tunecache.cli`` group)."""
    db_app = typer.Typer(help="Database schema commands.", no_args_is_help=True)
    db_app.command("upgrade")(db_upgrade)
    db_app.command("move-artifacts")(db_move_artifacts)
    db_app.command("admin-token")(db_admin_token)
    app.add_typer(db_app, name="db")
    app.command()(serve)
    app.command()(prune)
    app.command()(tune)


def _engine(url: str):
    """An engine for ``url``, or exit 9 naming what is wrong with it."""
    from tunecache.service import db

    try:
        return db.create_db_engine(url)
    except Exception as exc:  # bad URL, missing driver, unwritable SQLite directory
        fail(ExitCode.DATABASE, f"database URL {url!r} not usable: {type(exc).__name__}: {str(exc).splitlines()[0]}")


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


def serve(
    host: Annotated[Optional[str], typer.Option(help="listen address (TUNECACHE_HOST, default 127.0.0.1)")] = None,
    port: Annotated[Optional[int], typer.Option(help="listen port (TUNECACHE_PORT, default 8321)")] = None,
    database: DatabaseOpt = None,
    processes: Annotated[
        Optional[int],
        typer.Option(min=1, help="server processes (TUNECACHE_SERVER_PROCESSES, default 1); one runs the job worker"),
    ] = None,
    ssl_certfile: Annotated[Optional[Path], typer.Option(help="serve HTTPS with this certificate (PEM)")] = None,
    ssl_keyfile: Annotated[Optional[Path], typer.Option(help="the certificate's private key (PEM)")] = None,
    workers: Annotated[
        Optional[int], typer.Option("--workers", min=1, hidden=True, help="old name of --processes (deprecated)")
    ] = None,
) -> None:
    """Run the HTTP service.

    On SQLite (the default) the schema is migrated first; on PostgreSQL it must already be current (tunecache db upgrade). On a database with no tokens at all, the first start creates an ``admin`` token and writes it to ``<data dir>/admin.token`` (mode 0600; ``admin-<hash>.token`` where that file is another database's), with the addresses the service listens on beside it (``admin.token.json``); client commands on this machine send it to this service only.
    """
    import os

    import uvicorn
    from pydantic import ValidationError

    from tunecache.service.assembly import server_trusted_keys
    from tunecache.service.settings import Settings, variable_name

    if workers is not None:
        if processes is not None and processes != workers:
            fail(ExitCode.USAGE, "--workers is the old name of --processes: give one of them")
        typer.echo("tunecache: --workers is deprecated, use --processes", err=True)
        processes = workers
    overrides = {k: v for k, v in {"host": host, "port": port, "database_url": database,
                                   "server_processes": processes}.items() if v is not None}
    try:
        settings = Settings(**overrides)
    except ValidationError as exc:
        error = exc.errors()[0]
        fail(ExitCode.USAGE, f"invalid setting {error['loc'][0]} ({variable_name(str(error['loc'][0]))}): {error['msg']}")
    try:  # refuse in one line now, not in the app's startup
        server_trusted_keys(settings)
    except Exception as exc:  # SigningError: no usable keys, an unreadable file
        fail(ExitCode.USAGE, f"invalid setting trusted_keys ({variable_name('trusted_keys')}): {exc}")
    if settings.job_worker == "on":  # refuse at once, in one line, rather than in the app's startup
        from tunecache.service.worker import detect_gpu

        gpu, reason = detect_gpu()
        if gpu is None:
            fail(ExitCode.SERVE_FAILED, f"{variable_name('job_worker')}=on but this node cannot tune: {reason}")
    if (ssl_certfile is None) != (ssl_keyfile is None):
        fail(ExitCode.USAGE, "--ssl-certfile and --ssl-keyfile go together")
    if ssl_certfile is not None:  # refuse in one line now, not in a worker's traceback later
        import ssl

        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(ssl_certfile, ssl_keyfile)
        except (OSError, ssl.SSLError) as exc:
            fail(ExitCode.SERVE_FAILED, f"cannot serve TLS with {ssl_certfile} and {ssl_keyfile}: "
                                        f"{getattr(exc, 'strerror', None) or exc}")
    scheme = "https" if ssl_certfile else "http"
    where = f"{scheme}://{settings.host}:{settings.port} with {settings.server_processes} process(es)"
    _check_listen(settings.host, settings.port, where)  # before the database is created, migrated or given a token
    engine = _ready_engine(settings.resolved_database_url())
    shown = engine.url.render_as_string(hide_password=True)
    if settings.bootstrap_admin_token:
        _leave_admin_token(engine, settings, scheme)
    engine.dispose()
    # Every process builds its app from the environment (uvicorn's factory mode).
    # (options override variables: write back what the processes' own Settings() will read)
    if settings.verify_url is None:  # the job worker's verification boots fetch from this service
        loopback = "127.0.0.1" if settings.host in ("0.0.0.0", "", "::") else settings.host
        os.environ["TUNECACHE_VERIFY_URL"] = (f"{'https' if ssl_certfile else 'http'}://"
                                              f"{f'[{loopback}]' if ':' in loopback else loopback}:{settings.port}")
    os.environ.update({"TUNECACHE_DATABASE_URL": settings.resolved_database_url(), "TUNECACHE_DATA_DIR": str(settings.data_dir),
                       "TUNECACHE_HOST": settings.host, "TUNECACHE_PORT": str(settings.port),
                       "TUNECACHE_SERVER_PROCESSES": str(settings.server_processes)})
    typer.echo(f"tunecache starting on {where} (database {shown})", err=True)
    metrics_dir = _metrics_multiprocess_dir(settings.server_processes)
    try:
        uvicorn.run("tunecache.service.app:create_app", factory=True, host=settings.host, port=settings.port,
                    workers=settings.server_processes, log_level="info", access_log=settings.access_log,
                    timeout_keep_alive=settings.keep_alive_seconds,
                    # uvicorn's protocol with bounds on slow, idle and unreading clients and on
                    # connections per address (tunecache.service.connections)
                    http="tunecache.service.connections:GuardedHttpProtocol",
                    proxy_headers=False,  # X-Forwarded-*: TUNECACHE_TRUSTED_PROXIES only (service.client_address)
                    timeout_graceful_shutdown=10,
                    ssl_certfile=str(ssl_certfile) if ssl_certfile else None,
                    ssl_keyfile=str(ssl_keyfile) if ssl_keyfile else None)
    except SystemExit as exc:  # uvicorn exits 3 when it cannot bind or start
        if exc.code not in (0, None):
            fail(ExitCode.SERVE_FAILED, f"could not serve on {settings.host}:{settings.port} (see the log above)")
    finally:
        if metrics_dir is not None:
            import shutil

            shutil.rmtree(metrics_dir, ignore_errors=True)


def _check_listen(host: str, port: int, where: str) -> None:
    """Exit 11 in one line when ``host:port`` cannot be listened on (address in use, a host
    that does not resolve or is not this machine's), before ``serve`` touches the database.

    Binds every address of ``host`` as uvicorn's server then does (``SO_REUSEADDR``, IPv6
    sockets v6-only, an address family not enabled here skipped) and closes them again; a port taken between this check and uvicorn's
    bind is still caught by uvicorn (exit 11 after its log)."""
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        fail(ExitCode.SERVE_FAILED, f"could not serve on {where}: host {host!r} not found "
                                    f"({getattr(exc, 'strerror', None) or exc})")
    unavailable = None
    bound = 0
    for family, kind, proto, _, address in dict.fromkeys(addresses):
        try:
            with socket.socket(family, kind, proto) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                probe.bind(address)
                bound += 1
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL:  # a family not enabled here: asyncio skips it too
                unavailable = unavailable or exc
                continue
            fail(ExitCode.SERVE_FAILED, f"could not serve on {where}: {exc.strerror or exc}")
    if not bound and unavailable is not None:  # an address of no interface of this machine
        fail(ExitCode.SERVE_FAILED, f"could not serve on {where}: {unavailable.strerror or unavailable}")


def _metrics_multiprocess_dir(processes: int) -> str | None:
    """Prometheus metrics of several processes (``GET /metrics``, :mod:`tunecache.service.metrics`):
    prometheus-client's multiprocess mode, where each process counts into files of its own in
    ``PROMETHEUS_MULTIPROC_DIR`` and a scrape adds them up. With more than one process and
    the variable unset (or empty), a private directory is made and set for the processes;
    returns it, for removal at exit. A set variable is used as it is (it must be a
    directory, emptied by whoever runs the service before each start); exits 2 when it is not.
    """
    import os

    given = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if given:
        if not Path(given).is_dir():
            fail(ExitCode.USAGE, f"PROMETHEUS_MULTIPROC_DIR={given} is not a directory (unset it: serve makes its own)")
        return None
    os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)  # empty counts as unset
    if processes == 1:
        return None
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = made = tempfile.mkdtemp(prefix="tunecache-metrics-")
    return made


def _leave_admin_token(engine, settings, scheme: str) -> None:
    """The first admin token on a database with none, and where it listens (:mod:`tunecache.service.local_token`)."""
    from tunecache.formats.local_token import Listener
    from tunecache.service.local_token import leave_admin_token

    listener = Listener(scheme=scheme, host=settings.host, port=settings.port)
    try:
        left = leave_admin_token(engine, settings.data_dir, settings.resolved_database_url(), listener)
    except OSError as exc:
        fail(ExitCode.SERVE_FAILED, f"cannot write the first admin token in {settings.data_dir}: {exc.strerror or exc}")
    if left is not None and left.created:
        typer.echo(f"tunecache: no tokens yet: created token 'admin' (scope admin) in {left.path} (mode 0600); client "
                   f"commands on this machine send it to {listener.url} only, others need it in TUNECACHE_TOKEN", err=True)


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


def db_admin_token(
    name: Annotated[str, typer.Option("--name", help="the new token's name (names are never reused)")] = "admin-recovered",
    database: DatabaseOpt = None,
) -> None:
    """Create an admin token directly in the database and print it (the token, on stdout).

    For a service whose admin tokens are lost (the first start's admin.token was on a pod's emptyDir, or on a tuner pod), or to make the first one where the operator chooses: whoever can reach the database (TUNECACHE_DATABASE_URL) can already do anything, so this asks for no token. Store it in a Secret; revoke the lost ones with it (tunecache token revoke).

    Exit 2 when the name is taken, 9 when the database fails."""
    from tunecache.contract import Scope
    from tunecache.service import db, tokens
    from tunecache.service.settings import Settings

    url = database or Settings().resolved_database_url()
    engine = _ready_engine(url)
    try:
        with db.session_factory(engine).begin() as session:
            created = tokens.create_token(session, name, Scope.ADMIN, created_by="tunecache db admin-token")
    except tokens.TokenNameTaken as exc:
        fail(ExitCode.USAGE, f"{exc}: give another --name")
    except Exception as exc:
        _store_errors(exc)
    finally:
        engine.dispose()
    typer.echo(created.token)


def db_move_artifacts(
    to: Annotated[str, typer.Option("--to", help="s3://bucket/prefix (the object store) or database")],
    database: DatabaseOpt = None,
) -> None:
    """Move the stored artifacts' bytes into the object store, or back into the database.

    Each blob is copied, verified against its sha256, its new location recorded, and only then deleted from where it was: a move stopped anywhere (even killed) loses nothing, and running it again finishes it. The service may keep running meanwhile: it reads each blob where its row says it is. Moving into the object store needs --to to be the service's TUNECACHE_ARTIFACT_STORE (set it once the move is done, or before: new uploads then go there); moving back needs TUNECACHE_ARTIFACT_STORE to name the store to empty. The object store is reached with the AWS_* variables, as the service reaches it.
    """
    import os

    from sqlalchemy import select

    from tunecache.service import artifact_store, db
    from tunecache.service.models import ArtifactBlob
    from tunecache.service.settings import Settings

    configured = os.environ.get("TUNECACHE_ARTIFACT_STORE") or None
    try:
        configured = Settings(artifact_store=configured).artifact_store
        if to == "database":
            if configured is None:
                fail(ExitCode.USAGE, "--to database moves the bytes out of the object store that "
                                     "TUNECACHE_ARTIFACT_STORE names: set it")
            object_store = artifact_store.S3Store(configured)
            stores = artifact_store.ArtifactStores(artifact_store.DatabaseStore(), object_store)
        else:
            object_store = artifact_store.S3Store(to)
            if configured is not None and configured.rstrip("/") != to.rstrip("/"):
                fail(ExitCode.USAGE, f"--to {to} is not the service's object store (TUNECACHE_ARTIFACT_STORE={configured}): "
                                     "blobs are moved into the store the service reads")
            stores = artifact_store.ArtifactStores(object_store)
    except ValueError as exc:
        fail(ExitCode.USAGE, str(exc).splitlines()[0])
    target = stores.at("database" if to == "database" else object_store.location)
    url = database or Settings().resolved_database_url()
    engine = _ready_engine(url)
    sessions = db.session_factory(engine)
    sessions.configure(info={"artifact_stores": stores})
    moved = size_moved = 0
    try:
        with sessions.begin() as session:
            todo = session.execute(select(ArtifactBlob.sha256, ArtifactBlob.size_bytes)
                                   .where(ArtifactBlob.location != target.location).order_by(ArtifactBlob.sha256)).all()
        typer.echo(f"moving {len(todo)} artifacts ({sum(size for _, size in todo):,} bytes) to {target.describe()}")
        for sha, size in todo:
            with sessions.begin() as session:
                source = artifact_store.move_blob(session, stores, sha, target)
            if source is None:
                continue
            if source != artifact_store.blobs.LOCATION:  # after the commit: the row names the target
                stores.at(source).delete(None, sha)
            moved += 1
            size_moved += size
            typer.echo(f"moved {sha} ({size:,} bytes) from {source}")
        with sessions.begin() as session:
            leftovers = artifact_store.delete_leftovers(session, stores)
    except (artifact_store.ArtifactStoreUnavailable, artifact_store.blobs.DigestMismatch) as exc:
        fail(ExitCode.SERVER_ERROR, f"{exc} ({moved} artifacts moved; run it again to go on)")
    except Exception as exc:
        _store_errors(exc)
    finally:
        engine.dispose()
    typer.echo(f"moved {moved} artifacts ({size_moved:,} bytes) to {to}"
               + (f"; deleted {leftovers} copies an earlier move left behind" if leftovers else ""))


def prune(
    database: DatabaseOpt = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="say what would be deleted, delete nothing")] = False,
    keep: Annotated[
        Optional[str], typer.Option(help="runs kept per key and environment, or 'off' (default: TUNECACHE_RUN_RETENTION, 10)")
    ] = None,
) -> None:
    """Run one retention pass now.

    It deletes runs past the retention (never the current, a pinned or a job's run, nor one recorded within TUNECACHE_RETENTION_GRACE_SECONDS), the blobs no run refers to any more, and this node's mirrored files of deleted blobs and past TUNECACHE_MIRROR_MAX_BYTES. The service does the same by itself every TUNECACHE_RETENTION_INTERVAL_SECONDS; this is for an operator who wants it now, or to see first what it would delete (--dry-run).
    """
    from pydantic import ValidationError

    from tunecache.service import db
    from tunecache.service.artifact_files import ArtifactFiles
    from tunecache.service.assembly import retention_policy
    from tunecache.service.retention import run_pass
    from tunecache.service.settings import Settings, variable_name

    overrides = {"database_url": database} if database else {}
    if keep is not None:
        overrides["run_retention"] = keep
    try:
        settings = Settings(**overrides)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = str(error["loc"][0]) if error["loc"] else ""
        message = error["msg"].removeprefix("Value error, ")
        where = "--keep" if field == "run_retention" and keep is not None else f"{field} ({variable_name(field)})"
        fail(ExitCode.USAGE, f"invalid {where}: {message}")
    engine = _ready_engine(settings.resolved_database_url())
    mirror = settings.artifact_cache_dir
    try:
        report = run_pass(db.session_factory(engine), ArtifactFiles(mirror) if mirror.is_dir() else None,
                          retention_policy(settings), dry_run=dry_run)
    except Exception as exc:
        _store_errors(exc)
    finally:
        engine.dispose()
    typer.echo(f"{'would delete' if dry_run else 'deleted'} {report.line()}")
    for line in report.details():  # the runs' ids; a dry run's kept blobs and why
        typer.echo(line)


@key_options(gpu="detected")
def tune(
    key_options: KeyOptions,
    config: Annotated[
        Optional[str],
        typer.Option(help="HF config: a directory with config.json, a JSON file, or a model type (default: --model)"),
    ] = None,
    server: Annotated[Optional[str], typer.Option("--server", help="store the run on this tunecache server")] = None,
    database: Annotated[
        Optional[str],
        typer.Option("--database", envvar="TUNECACHE_DATABASE_URL", help="store the run in this database directly"),
    ] = None,
    gemm_backends: GemmBackendsOpt = None,
    stages: StagesOpt = None,
    warmup: Annotated[str, typer.Option(help="'stages' (tunecache's own warmup stages) or 'vllm' (a boot of the node's vLLM, whose whole warm state is stored: the releases of docs/pods.md's table)")] = "stages",
    runner: Annotated[Optional[str], typer.Option(hidden=True, help="deprecated name of --warmup ('native': 'stages')")] = None,
    timeout: Annotated[float, typer.Option(min=1, help="seconds before the tuner process is killed")] = 3600.0,
    signing_key: Annotated[
        Optional[Path], typer.Option(envvar="TUNECACHE_SIGNING_KEY", help="sign the run with this Ed25519 key (tunecache keys generate)")
    ] = None,
    work_dir: Annotated[Optional[Path], typer.Option(help="keep the tuner's files here (default: a temporary directory)")] = None,
    verify: Annotated[bool, typer.Option(help="with --warmup vllm and --server: boot the stored run in a new vLLM "
                                              "process as a pod would and store what it still compiled")] = True,
    engine_args: EngineArgsOpt = None,
) -> None:
    """On a GPU node: run the warmup and autotune stages for a model and store the run.

    The stages run in a child process; the run is stored (on a server with --server, in a database with --database). A failure after the tuner found its GPU is stored as a failed run with the reason; before that (no CUDA device, no torch) nothing is stored, since without the GPU there is no key to file it under. Either way it exits 8 and says which. With --signing-key the run is signed: pods install its JIT modules only then. With --warmup vllm, --engine-args '{"max_model_len": 8192}' tunes that engine variant of the key.
    """
    from pydantic import ValidationError

    from tunecache.progress import ProgressDisplay
    from tunecache.service.tuner.model_config import ModelConfigError, load_hf_config
    from tunecache.service.tuner.process import TunerFailed, run_tuner
    from tunecache.service.tuner.stages import TuneSpec
    from tunecache.signing import SigningError, load_signing_key

    if runner is not None:  # the deprecated --runner native|vllm
        if runner not in ("native", "vllm"):
            fail(ExitCode.USAGE, "--runner must be 'native' or 'vllm'")
        warmup = "stages" if runner == "native" else runner
    if warmup not in ("stages", "vllm", "native"):  # 'native': the deprecated name of 'stages'
        fail(ExitCode.USAGE, "--warmup must be 'stages' or 'vllm'")
    warmup = "stages" if warmup == "native" else warmup
    if server is None and database is None:
        fail(ExitCode.USAGE, "give --server URL or --database URL (or set TUNECACHE_DATABASE_URL)")
    variant_args = engine_args_option(engine_args)
    if variant_args and warmup != "vllm":
        fail(ExitCode.USAGE, "--engine-args names an engine variant, which only --warmup vllm tunes")
    try:
        signer = load_signing_key(signing_key) if signing_key is not None else None
    except SigningError as exc:
        fail(ExitCode.BAD_INPUT, str(exc))
    try:
        hf_config = load_hf_config(config or key_options.model)
    except ModelConfigError as exc:
        fail(ExitCode.BAD_INPUT, str(exc))
    try:
        spec = TuneSpec(
            deployment=key_options.deployment(),
            hf_config=hf_config,
            gemm_backends=csv_option(gemm_backends),
            stages=csv_option(stages),
            warmup=warmup,
            engine_args=variant_args or {},
        )
    except ValidationError as exc:
        fail(ExitCode.USAGE, f"invalid option {first_error(exc)}")
    # --server wins over TUNECACHE_DATABASE_URL; nothing below asks which store it is.
    store = server_store(server) if server is not None else _sql_store(database)
    node = socket.gethostname()
    try:
        with tempfile.TemporaryDirectory(prefix="tunecache-tune-") as tmp:
            try:
                with ProgressDisplay() as progress:
                    result = run_tuner(spec, work_dir or Path(tmp), timeout, on_event=progress.update)
            except TunerFailed as failure:
                record = failure.run_record(spec, RunTrigger.CLI, node)
                if record is not None:
                    kept = f"recorded as failed run {store.record_run(record).id}"
                else:
                    kept = "no run recorded: the tuner failed before it found its GPU, so there is no key to file it under"
                # the tuner's log tail only where it ran (a node without a GPU: its one line says all)
                tail = f"\n{failure.log_tail}" if failure.started is not None and failure.log_tail else ""
                fail(ExitCode.TUNING_FAILED, f"{failure.message} ({kept}){tail}".rstrip())
            run = result.record(store, spec, RunTrigger.CLI, node, signer)
            typer.echo(
                f"stored run {run.id}: {result.summary['entries']} entries in {result.summary['tuning_seconds']:.1f} s "
                f"for {key_options.model} on {result.gpu_name} ({result.arch})"
            )
            if spec.warmup == "vllm" and verify:
                _verify(store, run.id, spec, server, (work_dir or Path(tmp)) / "verification", timeout, signer)
    except typer.Exit:
        raise
    except Exception as exc:
        _store_errors(exc)
    finally:
        store.close()


def _verify(store, run_id: int, spec, server: str | None, scratch: Path, timeout: float, signer) -> None:
    """The run's verification boot (:mod:`tunecache.service.tuner.verification`), stored
    with the run and said in one line; with ``--database`` there is no server for the boot
    to fetch from, and that is said instead."""
    from tunecache.service.tuner.verification import shown, verify_run
    from tunecache.signing import format_public_key

    if server is None:
        typer.echo("not verified: a verification boot fetches the run from a server (--server)")
        return
    trusted = format_public_key(signer.public_key()) if signer is not None else None
    verification = verify_run(spec, server, scratch, timeout, trusted_keys=trusted)
    store.record_verification(run_id, verification)
    typer.echo(shown(verification))


def _sql_store(url: str):
    from tunecache.service import db
    from tunecache.service.store import SqlTuningStore

    from tunecache.service.assembly import server_trusted_keys
    from tunecache.service.settings import Settings

    return SqlTuningStore(db.session_factory(_ready_engine(url)), owns_engine=True,
                          trusted_keys=server_trusted_keys(Settings()))


def _store_errors(exc: Exception):
    """Exit 9 for a database that failed under the SQL store; else as :func:`client_errors`."""
    from sqlalchemy.exc import SQLAlchemyError

    if isinstance(exc, SQLAlchemyError):
        fail(ExitCode.DATABASE, f"database error: {str(exc).splitlines()[0]}")
    client_errors(exc)
