"""A run taken out of use (``POST /v1/tunings/{id}/retire``, ``tunecache retire RUN``)."""

from __future__ import annotations

from pydantic import BaseModel

from tunecache.contract.runs import TuningRunRead


class RunRetired(BaseModel):
    """The answer of a retirement: the run as stored now (``retired_at`` set, not current),
    and what is current for its key and environment in its place: the newest usable run
    recorded before it (succeeded, not a pod's, not held, not retired), or ``None``: none, so
    pods of that key miss until a new run is recorded or one is promoted."""

    run: TuningRunRead
    current_run_id: int | None
