"""What one server process holds while it serves: :class:`ServiceState`, made when the app
starts (its lifespan, :func:`tunecache.service.app.create_app`) and kept as
``app.state.tunecache``; routes, caller policies and the dashboard read it with
:func:`state_of`."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    import anyio
    from cachetools import TTLCache
    from sqlalchemy import Engine
    from sqlalchemy.orm import Session, sessionmaker
    from starlette.applications import Starlette

    from tunecache.contract import WorkerStatus
    from tunecache.service.artifact_store import ArtifactStores
    from tunecache.service.artifact_files import ArtifactFiles
    from tunecache.service.lookup_cache import GenerationReader, LookupCache
    from tunecache.service.single_flight import SingleFlight
    from tunecache.service.limits import RateLimit
    from tunecache.service.report_bounds import SourceGate
    from tunecache.service.report_intake import ReportIntake
    from tunecache.service.report_retention import Pruner
    from tunecache.service.retention import Maintenance
    from tunecache.service.settings import Settings
    from tunecache.service.tokens import Caller


@dataclass(eq=False)
class ServiceState:
    """One server process's state: its settings, database, caches, limits and background work."""

    settings: Settings
    # -- the database
    engine: Engine
    #: Sessions on the engine, each carrying ``artifact_stores`` (``tunecache.service.artifact_store.stores_of``).
    sessions: sessionmaker[Session]
    artifact_stores: ArtifactStores
    # -- lookups (routes/tunings.py) and callers (tunecache.service.policy)
    #: Reads the current-run counter, one read at a time, on a connection of its own.
    generation_reader: GenerationReader
    lookup_cache: LookupCache
    #: Presented token -> the caller it authenticated, for reads (``TUNECACHE_TOKEN_CACHE_SECONDS``).
    token_cache: TTLCache[str, Caller]
    #: ``TUNECACHE_TRUSTED_KEYS``: key id -> public key (``None``: unset).
    trusted_keys: Mapping[str, Any] | None
    # -- artifacts (routes/artifacts.py)
    artifact_files: ArtifactFiles
    #: One mirroring of an artifact at a time, shared by the requests that ask for it meanwhile.
    artifact_mirrors: SingleFlight
    #: Threads that read mirrored files, apart from the database's (``TUNECACHE_FILE_THREADS``).
    file_threads: anyio.CapacityLimiter
    # -- run diffs, jobs and pod reports
    #: :data:`tunecache.service.run_diff.DIFFS_AT_ONCE` slots.
    diff_slots: threading.BoundedSemaphore
    #: Tuning-job requests per token (``TUNECACHE_JOB_REQUEST_RATE``).
    job_requests: RateLimit
    report_gate: SourceGate
    report_pruner: Pruner
    report_intake: ReportIntake
    # -- /v1/health
    health_probes: SingleFlight
    #: The one health probe of the database in flight.
    health_threads: anyio.CapacityLimiter
    # -- background work
    worker_status: WorkerStatus
    #: This node's job worker's lock (``<data dir>/worker.lock``), held by the process that runs it.
    worker_lock: IO | None
    #: The retention pass (``tunecache.service.retention``).
    maintenance: Maintenance
    #: The app's exception handlers wrapped to answer pages, made at the dashboard's first
    #: error (``tunecache.service.dashboard.render``).
    dashboard_error_handlers: tuple | None = None
    #: ``(monotonic time, problems)`` of the last check for blobs in stores this process lacks
    #: (``tunecache.service.routes.health``; time 0: never checked).
    store_check: tuple[float, tuple[str, ...]] = (0.0, ())


def state_of(app: Starlette) -> ServiceState:
    """The state of the process serving ``app`` (``request.app``), once it has started."""
    return app.state.tunecache
