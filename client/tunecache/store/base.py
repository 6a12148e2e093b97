"""The one store interface of tunings, and the errors stores raise.

:class:`TuningStore` is what a tuner records into and a pod looks up in. Two stores
implement it: the HTTP client (:class:`tunecache.store.http.TunecacheClient`, for pods
and for GPU nodes that talk to a server) and the SQL store
(``tunecache.service.store.SqlTuningStore`` in ``tunecache-server``, for the service's
own worker and ``tunecache tune --database``). Code that records or looks up tunings
takes a ``TuningStore`` and never asks which one it has (MLflow's ``AbstractStore`` is the
model).

The errors are here, not beside the HTTP client, so that code which maps them to what a
user sees (the command kit's exit codes, :mod:`tunecache.cli_kit`) needs none of the pod
code.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Protocol, runtime_checkable

from typing import Any

from tunecache.contract import (
    EnvironmentMetadata,
    JobConflict,
    LookupMiss,
    RunVerification,
    TuningKey,
    TuningRunCreate,
    TuningRunPage,
    TuningRunQuery,
    TuningRunRead,
)


class TunecacheError(RuntimeError):
    """Base of the errors of every store and of the HTTP client."""


class NoCompatibleTuning(TunecacheError):
    """No stored tuning is usable by this key and environment (a lookup's 404).

    ``miss`` holds the reason and the closest stored tunings with each differing field.
    """

    def __init__(self, miss: LookupMiss):
        super().__init__(miss.detail)
        self.miss = miss

    @property
    def detail(self) -> str:
        return self.miss.detail

    def explain(self) -> str:
        """Multi-line text: the reason, then each closest tuning's differing fields."""
        return self.miss.explain()


class ArtifactsMissing(TunecacheError):
    """A run refers to artifacts whose bytes were never uploaded (``missing``: their sha256)."""

    def __init__(self, missing: list[str]):
        super().__init__(f"artifact bytes not uploaded: {', '.join(missing)}")
        self.missing = missing


class ServerUnreachable(TunecacheError):
    """No connection, or the server did not answer in time."""


class InstallDeadlineExceeded(ServerUnreachable):
    """The install deadline (``TUNECACHE_INSTALL_DEADLINE``) passed before the lookup and
    every download were done: the server did not answer, or answered too slowly. Raised
    before anything is written, never retried. A :class:`ServerUnreachable`, so whoever
    handles that handles this too (the CLI: exit 4)."""


class ServerError(TunecacheError):
    """The server answered with an error status (other than a lookup's 404)."""

    def __init__(self, status_code: int, detail: Any):
        shown = " ".join(str(detail).split())  # one line, however the server formats it
        super().__init__(f"server answered {status_code}: {shown[:300]}{'...' if len(shown) > 300 else ''}")
        self.status_code = status_code
        self.detail = detail
        #: A record's 422 for artifacts whose bytes are not stored: their sha256 (else empty).
        self.missing: list[str] = []


class JobConflictError(ServerError):
    """409 of ``POST /v1/tuning-jobs``: a job for the key is already queued or running with
    other options; ``conflict`` names the job and each difference."""

    def __init__(self, conflict: JobConflict):
        super().__init__(409, conflict.detail)
        self.conflict = conflict


class ArtifactCorrupt(TunecacheError):
    """Downloaded bytes do not hash to the sha256 the server announced."""


class DownloadTruncated(ArtifactCorrupt):
    """The connection closed before the whole body arrived."""


class AnswerTooLarge(ArtifactCorrupt):
    """An answer went past its byte bound (:func:`tunecache.store.http.transport.max_answer_bytes`
    for JSON answers, ``TUNECACHE_MAX_UNPACK_BYTES`` for an artifact); nothing of it is used."""


@runtime_checkable
class TuningStore(Protocol):
    """Where tunings are recorded and looked up."""

    def upload_file(self, path: Path, again: bool = False) -> str:
        """Store a file's bytes (streamed, never whole in memory), unless the store
        already has them (``again``: without asking first); returns their sha256 (64 hex
        digits)."""
        ...

    def record_run(self, run: TuningRunCreate) -> TuningRunRead:
        """Record a finished run whose artifacts were uploaded first; a succeeded,
        verified run becomes current for its key and environment.

        Raises:
            ArtifactsMissing (SQL) or ServerError 422 (HTTP): an artifact was not uploaded
                (``missing``: their sha256; :func:`record_uploaded` uploads them again).
        """
        ...

    def record_verification(self, run_id: int, verification: RunVerification) -> TuningRunRead:
        """Store the verification boot of a recorded run (:class:`tunecache.contract.RunVerification`)."""
        ...

    def lookup(self, key: TuningKey, environment: EnvironmentMetadata) -> TuningRunRead:
        """The current run for exactly this key and environment.

        Raises:
            NoCompatibleTuning: none; with the closest stored tunings and their differences.
        """
        ...

    def list_runs(self, query: TuningRunQuery = TuningRunQuery()) -> TuningRunPage:
        """Tuning history, newest first, filtered by key fields and status."""
        ...


def file_sha256(path: Path) -> str:
    """The sha256 (64 hex digits) of a file, read 1 MiB at a time: the address of its bytes
    in every store."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def record_uploaded(store: TuningStore, run: TuningRunCreate, paths: list[Path]) -> TuningRunRead:
    """Upload each of ``paths`` (skipped when the store has the bytes), then record ``run``.

    When the record is refused because bytes are missing (``ArtifactsMissing``, or a
    server's 422 naming them in ``missing``): the service's retention deleted them between
    the upload and the record, or a node still answered "stored" from a mirrored file of
    bytes already deleted. Those files are uploaded again, without asking whether they are
    there, and the run is recorded once more.

    Raises:
        whatever the store raises (the second refusal too).
    """
    for path in paths:
        store.upload_file(path)
    try:
        return store.record_run(run)
    except Exception as exc:  # ArtifactsMissing (SQL) or ServerError (HTTP), each with .missing
        missing = set(getattr(exc, "missing", None) or ())
        by_sha = {file_sha256(path): path for path in paths}
        if not missing or not missing <= by_sha.keys():
            raise
    for sha in sorted(missing):
        store.upload_file(by_sha[sha], again=True)
    return store.record_run(run)
