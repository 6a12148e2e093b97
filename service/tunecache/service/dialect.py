"""The one place that knows SQLite and PostgreSQL apart (insert-or-ignore, upsert)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Table
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session


def _insert(session: Session, table: Table):
    name = session.get_bind().dialect.name
    if name == "postgresql":
        return postgresql.insert(table)
    if name == "sqlite":
        return sqlite.insert(table)
    raise NotImplementedError(f"unsupported database dialect {name!r} (use sqlite or postgresql)")


def insert_or_ignore(session: Session, table: Table, values: dict[str, Any], conflict: list[str]) -> None:
    """``INSERT ... ON CONFLICT (conflict) DO NOTHING``: safe when two writers race."""
    session.execute(_insert(session, table).values(**values).on_conflict_do_nothing(index_elements=conflict))


def upsert(session: Session, table: Table, values: dict[str, Any], conflict: list[str]) -> None:
    """``INSERT ... ON CONFLICT (conflict) DO UPDATE`` every non-conflict column."""
    stmt = _insert(session, table).values(**values)
    update = {k: stmt.excluded[k] for k in values if k not in conflict}
    session.execute(stmt.on_conflict_do_update(index_elements=conflict, set_=update))
