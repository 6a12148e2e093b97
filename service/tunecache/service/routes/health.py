"""``/v1/health``: ok or degraded, within ``TUNECACHE_HEALTH_TIMEOUT`` whatever the database
does; details for a caller with a token."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import anyio
import anyio.to_thread
from fastapi import APIRouter, Request
from sqlalchemy import Engine, select
from sqlalchemy.exc import SQLAlchemyError

from tunecache.contract import Health
from tunecache.service import db
from tunecache.service.models import ArtifactBlob
from tunecache.service.policy import PublicCaller
from tunecache.service.state import state_of

router = APIRouter(tags=["health"])

#: Free space under which a disk the node writes to makes it ``degraded``.
LOW_DISK_BYTES = 64 * 1024 * 1024


def low_disks(data_dir: Path) -> list[str]:
    """A problem for each disk the node writes to with less than :data:`LOW_DISK_BYTES` free:
    the data directory (SQLite, the artifact mirror) and the upload spool (``TMPDIR``)."""
    problems = []
    for what, path in (("data directory", Path(data_dir)), ("upload spool", Path(tempfile.gettempdir()))):
        try:
            free = shutil.disk_usage(path).free
        except OSError:
            continue  # not there yet: nothing written to it either
        if free < LOW_DISK_BYTES:
            problems.append(f"{what} {path} has {free:,} bytes free")
    return problems


@router.get("/health", response_model=Health, response_model_exclude_none=True)
async def health(request: Request, caller: PublicCaller) -> Health:
    """Liveness and readiness: 200 within ``TUNECACHE_HEALTH_TIMEOUT`` (1 s), ``{"status":
    "ok"}`` when the database answered and the artifact mirror is writable, else
    ``{"status": "degraded"}``: the node still serves what it can (lookup answers it holds,
    artifacts from its mirror or from the database).

    Open to anyone, who learns only the status. With a valid token of any scope the answer
    also says what is wrong (``problems``), which database, its schema revision, and whether
    this node runs tuning jobs: ``{"status": "ok", "database": "sqlite"|"postgresql",
    "schema_revision": "0006", "worker": {"enabled": true, "gpu_name": "NVIDIA H200",
    "arch": "sm90", ...}, "max_upload_bytes": 268435456}`` (the upload limit, which ``tunecache
    push`` reads before it uploads). The database check is the read of the tuning generation that
    lookups share (:class:`~tunecache.service.lookup_cache.GenerationReader`: one at a time, on
    a connection and in a thread of its own, so a node whose threads are all busy is not
    called degraded); a read that does not finish in time goes on without the request.
    """
    state = state_of(request.app)
    timeout = state.settings.health_timeout
    problems: list[str] = []
    revision = None
    try:  # what a boot needs first: the generation, read as lookups read it
        with anyio.fail_after(max(request.state.deadline - anyio.current_time(), 0.0)):
            await state.generation_reader.current()
    except TimeoutError:
        problems.append(f"database did not answer within {timeout:g} s")
    except SQLAlchemyError as exc:
        problems.append(f"database unavailable ({type(exc).__name__})")
    if state.artifact_files.write_failure is not None:
        problems.append(state.artifact_files.write_failure)
    problems.extend(low_disks(state.settings.data_dir))
    problems.extend(await _stores_missing(state, request.state.deadline))
    status = "degraded" if problems else "ok"
    if caller.anonymous:
        return Health(status=status)
    try:  # the schema revision, for a caller with a token: left out when it cannot be read in time
        with anyio.fail_after(max(request.state.deadline - anyio.current_time(), 0.0)):
            revision = await state.health_probes.run(
                "revision", lambda: anyio.to_thread.run_sync(_revision, state.engine, limiter=state.health_threads))
    except (TimeoutError, SQLAlchemyError):
        pass
    return Health(status=status, problems=problems or None, database=state.engine.dialect.name,
                  schema_revision=revision, worker=state.worker_status,
                  max_upload_bytes=state.settings.max_upload_bytes)


#: Seconds a check for blobs in stores this process lacks is reused (it reads ``artifact_blobs``).
STORE_CHECK_SECONDS = 60.0


async def _stores_missing(state, deadline: float) -> list[str]:
    """A problem for each store that blobs are kept in and this process was not configured
    with (a replica without ``TUNECACHE_ARTIFACT_STORE`` where others have it: those blobs get
    503 here), checked at most every :data:`STORE_CHECK_SECONDS`; the last answer when the
    check does not finish in time."""
    checked_at, said = state.store_check
    if checked_at and time.monotonic() - checked_at < STORE_CHECK_SECONDS:
        return list(said)
    try:
        with anyio.fail_after(max(deadline - anyio.current_time(), 0.0)):
            lacking = await state.health_probes.run("stores", lambda: anyio.to_thread.run_sync(
                _unserved_locations, state.engine, state.artifact_stores.locations, limiter=state.health_threads))
    except (TimeoutError, SQLAlchemyError):
        return list(said)
    said = tuple(f"artifact blobs are kept in the {location!r} store, which this process has no "
                 "TUNECACHE_ARTIFACT_STORE for: they cannot be served here" for location in lacking)
    state.store_check = (time.monotonic(), said)
    return list(said)


def _unserved_locations(engine: Engine, served: frozenset[str]) -> list[str]:
    """The locations of blobs this process cannot read (one row each, at most)."""
    with engine.connect() as connection:
        return sorted(set(connection.scalars(
            select(ArtifactBlob.location).where(ArtifactBlob.location.not_in(sorted(served))).limit(10))))


def _revision(engine: Engine) -> str | None:
    """The schema revision, read with one pooled connection."""
    with engine.connect() as connection:
        return db.revision_of(connection)
