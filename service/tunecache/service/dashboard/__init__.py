"""The web dashboard, served by the service at ``/``: server-rendered HTML (Jinja2, autoescape
on), charts as inline SVG drawn on the server, no script and no front-end build.

Pages: the fleet matrix and the wanted list (``/``), the run history with the tuning time
per stage (``/history``), pod install reports (``/reports``), tuning jobs (``/jobs``), a run
(``/runs/{id}``), a run diff (``/diff?a=&b=``), a key's re-tune form (``/retune``), a job
(``/jobs/{id}``) and the audit log (``/audit``, admin only:
:mod:`~tunecache.service.dashboard.operations`). The pictures: :mod:`~tunecache.service.dashboard.figures`. Each
route declares its caller policy (:mod:`~tunecache.service.dashboard.security`; the table:
:mod:`~tunecache.service.dashboard.pages`) and stays out of the OpenAPI document, which
remains the API's.
"""

from __future__ import annotations

from fastapi import FastAPI

from tunecache.service.dashboard.pages import router


def install(app: FastAPI) -> dict[int, str]:
    """Serve the dashboard (:data:`router`) on ``app``, at the root. Returns the path template
    of each of its routes by the ``id`` of its endpoint, for ``tunecache_http_requests_total``'s
    ``route`` label."""
    app.include_router(router)
    return {id(route.endpoint): route.path_format for route in router.routes}
