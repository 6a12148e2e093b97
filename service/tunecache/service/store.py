"""The SQL implementation of the client's :class:`tunecache.store.TuningStore`.

Used where the tuner writes to the database itself: the service's job worker and
``tunecache tune --database``. Each call is one transaction (committed when the call
succeeds, rolled back when it raises) over the publishing and repository functions, which
never commit on their own.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from tunecache.contract import (
    EnvironmentMetadata,
    LookupMiss,
    RunVerification,
    TuningKey,
    TuningRunCreate,
    TuningRunPage,
    TuningRunQuery,
    TuningRunRead,
)
from tunecache.service import artifact_store, publishing, repository
from tunecache.store import NoCompatibleTuning, file_sha256


class SqlTuningStore:
    """A :class:`tunecache.store.TuningStore` on the service's database.

    Args:
        sessions: session factory of the database (``tunecache.service.db.session_factory``).
        owns_engine: dispose of the engine on :meth:`close` (a CLI that made it).
        trusted_keys: the keys whose runs may become current (the service's
            ``TUNECACHE_TRUSTED_KEYS``; :data:`tunecache.service.publishing.RECORD_POLICY`).
    """

    def __init__(self, sessions: sessionmaker[Session], *, owns_engine: bool = False,
                 trusted_keys: Mapping[str, Any] | None = None):
        self.sessions = sessions
        self.owns_engine = owns_engine
        self.trusted_keys = trusted_keys

    def close(self) -> None:
        if self.owns_engine:
            self.sessions.kw["bind"].dispose()

    def upload_file(self, path: Path, again: bool = False) -> str:
        """Store a file's bytes in the artifact store (the database's 4 MiB chunks, or the
        object store: :func:`tunecache.service.artifact_store.store_blob`), or nothing when
        they are stored already (``again`` changes nothing here: the
        database itself is asked); returns the sha256."""
        sha256 = file_sha256(path)
        with self.sessions.begin() as session, path.open("rb") as stream:
            artifact_store.store_blob(session, stream, sha256)
        return sha256

    def record_run(self, run: TuningRunCreate) -> TuningRunRead:
        """:func:`tunecache.service.publishing.record_run` in its own transaction.

        Raises:
            ArtifactsMissing, IndeterminateEnvironment (nothing is recorded).
        """
        with self.sessions.begin() as session:
            return publishing.record_run(session, run, trusted_keys=self.trusted_keys)

    def record_verification(self, run_id: int, verification: RunVerification) -> TuningRunRead:
        """:func:`tunecache.service.publishing.record_verification` in its own transaction."""
        with self.sessions.begin() as session:
            return publishing.record_verification(session, run_id, verification)

    def lookup(self, key: TuningKey, environment: EnvironmentMetadata) -> TuningRunRead:
        """The current run for this key and environment.

        Raises:
            NoCompatibleTuning: with the closest stored tunings and their differences.
        """
        with self.sessions.begin() as session:
            found = repository.lookup(session, key, environment)
        if isinstance(found, LookupMiss):
            raise NoCompatibleTuning(found)
        return found

    def list_runs(self, query: TuningRunQuery = TuningRunQuery()) -> TuningRunPage:
        """Tuning history, newest first (:func:`tunecache.service.repository.list_runs`)."""
        with self.sessions.begin() as session:
            return repository.list_runs(session, query)
