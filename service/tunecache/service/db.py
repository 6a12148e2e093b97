"""Engine, sessions and schema migrations (Alembic) for SQLite and PostgreSQL."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker


class SchemaOutOfDate(RuntimeError):
    """The database is not at the schema revision this tunecache needs."""


def normalize_url(url: str) -> str:
    """Use psycopg 3 for plain ``postgresql://`` URLs."""
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def create_db_engine(
    url: str,
    *,
    pool_size: int = 5,
    pool_timeout_s: float = 30.0,
    connect_timeout_s: float = 5.0,
    statement_timeout_s: float = 30.0,
    lock_timeout_s: float | None = None,
) -> Engine:
    """An engine for ``url`` whose every wait is bounded.

    * ``pool_size`` connections and no overflow; a checkout waits at most ``pool_timeout_s``
      (then ``sqlalchemy.exc.TimeoutError``, answered 503 by the service);
    * PostgreSQL: ``connect_timeout`` and, set on each new connection,
      ``statement_timeout`` and ``lock_timeout`` (``lock_timeout_s``, default the statement
      timeout: a frozen or locked database ends a statement with an error instead of
      holding the request);
    * SQLite: WAL, foreign keys and a busy timeout of ``statement_timeout_s``; a file's
      parent directory is created if missing.
    """
    url = normalize_url(url)
    parsed = make_url(url)
    pool = {"pool_size": pool_size, "max_overflow": 0, "pool_timeout": pool_timeout_s}
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": statement_timeout_s, "check_same_thread": False}, **pool)
        busy_ms = int(statement_timeout_s * 1000)

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection, _record):  # noqa: ANN001
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute(f"PRAGMA busy_timeout={busy_ms}")
            cursor.close()

        return engine
    engine = create_engine(url, pool_pre_ping=True, connect_args={"connect_timeout": max(1, round(connect_timeout_s))}, **pool)
    statement_ms = int(statement_timeout_s * 1000)
    lock_ms = int((lock_timeout_s if lock_timeout_s is not None else statement_timeout_s) * 1000)

    @event.listens_for(engine, "connect")
    def _statement_timeout(dbapi_connection, _record):  # noqa: ANN001
        with dbapi_connection.cursor() as cursor:
            cursor.execute(f"SET statement_timeout = {statement_ms}")
            cursor.execute(f"SET lock_timeout = {max(lock_ms, 1)}")
        dbapi_connection.commit()

    return engine


def engine_for(settings) -> Engine:
    """The engine of a service's :class:`~tunecache.service.settings.Settings` (pool sized
    to its threads, its timeouts)."""
    return create_db_engine(
        settings.resolved_database_url(),
        pool_size=settings.pool_size,
        pool_timeout_s=settings.db_pool_timeout,
        connect_timeout_s=settings.db_connect_timeout,
        statement_timeout_s=settings.db_statement_timeout,
        lock_timeout_s=settings.db_lock_timeout,
    )


def session_factory(engine: Engine) -> sessionmaker[Session]:
    """Sessions on ``engine``; callers own the transaction (``with factory.begin() as session``)."""
    return sessionmaker(engine, expire_on_commit=False)


def migrations_dir() -> Path:
    """The Alembic script directory: ``tunecache/service/migrations`` in an installed wheel,
    the repository's ``migrations/`` in a checkout (editable install)."""
    packaged = Path(__file__).with_name("migrations")
    if (packaged / "env.py").is_file():
        return packaged
    checkout = Path(__file__).resolve().parents[3] / "migrations"
    if (checkout / "env.py").is_file():
        return checkout
    raise FileNotFoundError("tunecache's migrations directory is missing from this installation")


def alembic_config(engine: Engine) -> Config:
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    config.attributes["engine"] = engine
    return config


def head_revision() -> str:
    """The newest migration revision of this tunecache (what ``db upgrade`` brings a database to)."""
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    return ScriptDirectory.from_config(config).get_current_head()


def revision_of(connection: Connection) -> str | None:
    """The Alembic revision of the database behind ``connection`` (``None``: not migrated)."""
    return MigrationContext.configure(connection).get_current_revision()


def current_revision(engine: Engine) -> str | None:
    """The Alembic revision of the database (``None``: not migrated)."""
    with engine.connect() as connection:
        return revision_of(connection)


#: The PostgreSQL advisory lock that migrations take turns on (with the schema's hash, so that
#: deployments in other schemas of one database do not wait on each other); not retention's.
MIGRATION_LOCK = 0x7475_6E65_6D69_6772 & 0x7FFF_FFFF_FFFF_FFFF
_PG_LOCK = "SELECT {}(:key # hashtextextended(coalesce(current_schema(), ''), 0))"


@contextlib.contextmanager
def _migration_lock(engine: Engine):
    """On a SQLite file: an exclusive ``flock`` on ``<file>.migrate.lock`` for the block, so that
    two ``tunecache db upgrade`` (or two first starts of ``serve``) at once migrate one after the
    other: SQLite runs an ``ALTER`` of a table as a copy into ``_alembic_tmp_<table>`` and a
    rename, and two at once left that copy behind (2 of 6 rounds in a probe), breaking every
    later migration. On PostgreSQL: a session advisory lock (:data:`MIGRATION_LOCK` with the
    schema's hash, as retention's), held on a connection of its own for the block: two
    upgrades at once both created the version table, and the loser failed with a raw
    ``UniqueViolation``; now the second waits, then finds the schema at the head. An in-memory
    database has nothing to share."""
    if engine.dialect.name == "postgresql":
        with engine.connect() as holder:
            holder.execute(text(_PG_LOCK.format("pg_advisory_lock")), {"key": MIGRATION_LOCK})
            holder.commit()
            try:
                yield
            finally:
                holder.execute(text(_PG_LOCK.format("pg_advisory_unlock")), {"key": MIGRATION_LOCK})
                holder.commit()
        return
    database = engine.url.database if engine.dialect.name == "sqlite" else None
    if not database or database == ":memory:" or database.startswith("file:"):
        yield
        return
    import fcntl

    path = Path(database).expanduser().resolve().with_name(Path(database).name + ".migrate.lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Apply migrations up to ``revision`` (``alembic upgrade``), one process at a time on a
    SQLite file (:func:`_migration_lock`)."""
    with _migration_lock(engine):
        command.upgrade(alembic_config(engine), revision)


def downgrade(engine: Engine, revision: str) -> None:
    """Revert migrations down to ``revision`` (``"base"`` drops every table)."""
    with _migration_lock(engine):
        command.downgrade(alembic_config(engine), revision)


def check_schema(engine: Engine) -> str:
    """Return the current revision if it is the head, else raise.

    Raises:
        SchemaOutOfDate: with the message telling the operator to run ``tunecache db upgrade``.
    """
    current, head = current_revision(engine), head_revision()
    if current != head:
        raise SchemaOutOfDate(
            f"database schema is at revision {current or 'none (empty database)'}, this tunecache "
            f"needs {head}: run `tunecache db upgrade --database URL`"
        )
    return current
