"""``/metrics``: the service's Prometheus metrics (outside ``/v1``, where Prometheus looks by default)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from tunecache.service import metrics
from tunecache.service.policy import ReadCaller
from tunecache.service.state import state_of

router = APIRouter(tags=["metrics"])


@router.get("/metrics", response_class=Response,
            responses={200: {"description": "Prometheus text exposition format 0.0.4",
                             "content": {"text/plain": {"schema": {"type": "string"}}}}})
def get_metrics(request: Request, _caller: ReadCaller) -> Response:
    """Counters and histograms of every process of this server (requests by route template
    and status, lookups by outcome and source, artifact bytes served, job and stage
    durations) and the job gauges read from the database (jobs by state, queue depth,
    oldest queued job); see :mod:`tunecache.service.metrics`.

    Only counts, durations and route templates: no token names, paths, keys or models.
    Open like the other reads: a token of any scope is needed once
    ``TUNECACHE_READ_TOKEN_REQUIRED`` is set (Prometheus: ``authorization.credentials_file``).
    """
    return Response(content=metrics.exposition(state_of(request.app).sessions), media_type=metrics.CONTENT_TYPE)
