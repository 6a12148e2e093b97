"""What the server's commands share of the database: the ``--database`` option, an engine
for a URL (exit 9 naming what is wrong) and the exit code of a store's error."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from tunecache.cli_kit import ExitCode, client_errors, fail

DatabaseOpt = Annotated[
    Optional[str], typer.Option("--database", envvar="TUNECACHE_DATABASE_URL", help="SQLAlchemy database URL")
]


def open_engine(url: str):
    """An engine for ``url``, or exit 9 naming what is wrong with it."""
    from tunecache.service import db

    try:
        return db.create_db_engine(url)
    except Exception as exc:  # bad URL, missing driver, unwritable SQLite directory
        fail(ExitCode.DATABASE, f"database URL {url!r} not usable: {type(exc).__name__}: {str(exc).splitlines()[0]}")


def ready_engine(url: str):
    """An engine whose schema is current: SQLite is migrated here, PostgreSQL must already be
    (``tunecache db upgrade``). Exits 9 naming the problem otherwise."""
    from tunecache.service import db

    engine = open_engine(url)
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


def store_errors(exc: Exception):
    """Exit 9 for a database that failed under the SQL store; else as :func:`client_errors`."""
    from sqlalchemy.exc import SQLAlchemyError

    if isinstance(exc, SQLAlchemyError):
        fail(ExitCode.DATABASE, f"database error: {str(exc).splitlines()[0]}")
    client_errors(exc)
