"""``tunecache serve``: the HTTP service under uvicorn, after one-line checks of its settings,
its address and its database, and the first admin token on a database with none."""

from __future__ import annotations

import errno
import socket
import tempfile
from pathlib import Path
from typing import Annotated, Optional

import typer

from tunecache.cli_kit import ExitCode, fail
from tunecache.service.cli.database import DatabaseOpt, ready_engine


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
    engine = ready_engine(settings.resolved_database_url())
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
