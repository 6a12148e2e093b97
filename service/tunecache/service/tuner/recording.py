"""Store a tuner's outcome: in the database directly (GPU node with the DB) or over HTTP."""

from __future__ import annotations

from sqlalchemy.orm import Session

from tunecache.client.http import TunecacheClient
from tunecache.identity import EnvironmentMetadata
from tunecache.service import blobs, repository
from tunecache.service.schemas import TuningRunCreate, TuningRunRead
from tunecache.service.tuner.runner import TunerFailed, TunerResult
from tunecache.service.tuner.stages import TuneSpec


def failed_run_record(spec: TuneSpec, failure: TunerFailed, trigger: str, node: str | None) -> TuningRunCreate | None:
    """A ``failed`` run for the history, or ``None`` when the child died before it knew its GPU
    (without a GPU name there is no key to file the failure under)."""
    started = failure.started
    if started is None:
        return None
    return TuningRunCreate(
        key=spec.key(started["gpu_name"], started["arch"]),
        environment=EnvironmentMetadata.from_flashinfer_metadata(started["environment"]),
        status="failed",
        trigger=trigger,
        node=node,
        started_at=failure.started_at,
        finished_at=failure.finished_at,
        error=f"{failure.message}\n{failure.log_tail}".strip()[:65536],
    )


def record_in_database(session: Session, spec: TuneSpec, result: TunerResult, trigger: str, node: str | None) -> TuningRunRead:
    """Store the result's artifact bytes and its run in one transaction (committed here)."""
    for artifact, path in result.artifacts:
        with path.open("rb") as stream:
            blobs.store_blob(session, stream, artifact.sha256)
    run = repository.record_run(session, result.run_record(spec, trigger, node))
    session.commit()
    return run


def record_over_http(client: TunecacheClient, spec: TuneSpec, result: TunerResult, trigger: str, node: str | None) -> dict:
    """Upload the result's artifacts (streamed; skipped when the server has them), then its
    run; returns the stored run (JSON)."""
    for _artifact, path in result.artifacts:
        client.upload_file(path)
    return client.record_run(result.run_record(spec, trigger, node).model_dump(mode="json"))
