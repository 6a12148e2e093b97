"""The one place that knows SQLite and PostgreSQL apart (insert-or-ignore, upsert)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Select, Table, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session


def _insert(session: Session, table: Table):
    name = session.get_bind().dialect.name
    if name == "postgresql":
        return postgresql.insert(table)
    if name == "sqlite":
        return sqlite.insert(table)
    raise NotImplementedError(f"unsupported database dialect {name!r} (use sqlite or postgresql)")


def insert_or_ignore(
    session: Session,
    table: Table,
    values: dict[str, Any],
    conflict: list[str],
    *,
    index_where: Any = None,
    returning: str | None = None,
) -> Any:
    """``INSERT ... ON CONFLICT (conflict) [WHERE index_where] DO NOTHING``: safe when two
    writers race. ``index_where`` names a partial unique index by its condition.

    Returns the inserted row's ``returning`` column, or ``None`` when nothing was
    inserted (or ``returning`` is not given).
    """
    stmt = _insert(session, table).values(**values).on_conflict_do_nothing(index_elements=conflict, index_where=index_where)
    if returning is None:
        session.execute(stmt)
        return None
    return session.execute(stmt.returning(table.c[returning])).scalar()


def upsert_if_newer(session: Session, table: Table, values: dict[str, Any], conflict: list[str], newer: str | None,
                    keep_old: dict[str, str] | None = None) -> None:
    """``INSERT ... ON CONFLICT (conflict) DO UPDATE ... WHERE table.newer < excluded.newer``
    (``newer`` ``None``: the update is unconditional); ``keep_old``: columns set by the update
    to the row's old value of another column (``{"previous_run_id": "run_id"}``).

    Writers racing on one row leave the largest ``newer`` value, whatever order they
    commit in (PostgreSQL re-checks the condition against the committed row).
    """
    stmt = _insert(session, table).values(**values)
    update = {k: stmt.excluded[k] for k in values if k not in conflict}
    update.update({column: table.c[old] for column, old in (keep_old or {}).items()})
    where = table.c[newer] < stmt.excluded[newer] if newer is not None else None
    session.execute(stmt.on_conflict_do_update(index_elements=conflict, set_=update, where=where))


def upsert_add(session: Session, table: Table, values: dict[str, Any], conflict: list[str], add: str) -> None:
    """``INSERT ... ON CONFLICT (conflict) DO UPDATE SET add = table.add + excluded.add`` (and
    every other column to the new value): a count that writers racing on one row add to."""
    stmt = _insert(session, table).values(**values)
    update = {k: stmt.excluded[k] for k in values if k not in conflict}
    update[add] = table.c[add] + stmt.excluded[add]
    session.execute(stmt.on_conflict_do_update(index_elements=conflict, set_=update))


def serialize(session: Session, lock_id: int) -> None:
    """Hold a lock named ``lock_id`` until the transaction ends, so that transactions that
    read and then write the same thing take turns. PostgreSQL: ``pg_advisory_xact_lock``.
    SQLite: nothing (one writer at a time; a server of several processes on SQLite may let
    two read before either writes)."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": lock_id})


def lock_for_claim(session: Session, query: Select) -> Select:
    """Make a claim query safe for concurrent workers.

    PostgreSQL: ``SELECT ... FOR UPDATE SKIP LOCKED`` (each worker skips rows another is
    claiming). SQLite: unchanged; SQLite has one writer at a time and the claim's
    conditional ``UPDATE ... WHERE status = 'queued'`` (checked by row count) settles a race.
    """
    if session.get_bind().dialect.name == "postgresql":
        return query.with_for_update(skip_locked=True, of=query.selected_columns[0].table)
    return query
