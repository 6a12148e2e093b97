"""The admin token ``tunecache serve`` leaves in its data dir for client commands on its
machine, one file per database, each with the record of the service it belongs to
(:mod:`tunecache.formats.local_token` says the layout; ``tunecache.store.http.local_token``
reads it).

At each start (``TUNECACHE_BOOTSTRAP_ADMIN_TOKEN`` on), :func:`leave_admin_token` finds this
database's token file (its record names the database, or an older file without a record
holds a live token of it), else picks one: ``admin.token`` where it is free, else the
database's own ``admin-<hash>.token``, so a second service on another database never
overwrites the first's. On a database without tokens it creates the ``admin`` token there
(:func:`tunecache.service.tokens.bootstrap_admin_token`); wherever the file holds a live token
of this database, the address this start listens on is added to its record.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine
from sqlalchemy.engine import make_url

from tunecache.formats.local_token import (
    ADMIN_TOKEN,
    Listener,
    per_database_file,
    read_record,
    read_token,
    token_files,
    with_listener,
    write_record,
)
from tunecache.service import db, tokens


def database_identity(url: str) -> str:
    """The database as a token record names it: its URL without the password; a SQLite file
    by its absolute path (two services started from different directories on one relative
    path are two databases)."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database and parsed.database != ":memory:":
        parsed = parsed.set(database=os.path.abspath(parsed.database))
    return parsed.render_as_string(hide_password=True)


def _own_file(session, data_dir: Path, database: str) -> Path:
    """This database's token file in ``data_dir`` (see the module), existing or to be made."""
    files = token_files(data_dir)
    for path in files:
        record = read_record(path)
        if record is not None and record.database == database:
            return path
    for path in files:  # an older file, without a record: this database's if its token is live here
        token = read_token(path)
        if read_record(path) is None and token is not None and tokens.is_live(session, token):
            return path
    first = Path(data_dir) / ADMIN_TOKEN
    return first if not os.path.lexists(first) else per_database_file(data_dir, database)


@dataclass(frozen=True)
class LeftToken:
    """What :func:`leave_admin_token` did: the file, and whether it created the token in it."""

    path: Path
    created: bool


def leave_admin_token(engine: Engine, data_dir: Path, database_url: str, listener: Listener) -> LeftToken | None:
    """Create the first admin token on a database without tokens, in this database's token
    file, and record ``listener`` beside a file that holds a live token of this database.
    Returns the file and whether the token was created there; ``None`` when this database
    has no token file here (its tokens were made elsewhere).

    Raises:
        OSError: the token or its record cannot be written (a created token is rolled back).
    """
    database = database_identity(database_url)
    with db.session_factory(engine).begin() as session:
        path = _own_file(session, data_dir, database)
        created = tokens.bootstrap_admin_token(session, path)
        token = read_token(path) if not created else None
        if not created and (token is None or not tokens.is_live(session, token)):
            return None
        record = read_record(path)
        try:
            write_record(path, with_listener(record if record is not None and record.database == database else None,
                                             database, listener))
        except OSError:
            if created:  # its token is rolled back with the transaction: no file names it
                path.unlink(missing_ok=True)
            raise
    return LeftToken(path=path, created=created)
