"""The FastAPI application: ``create_app(settings)``. At startup it builds the process's
:class:`~tunecache.service.state.ServiceState` (engine, sessions, the hot-path caches, the job
worker, ...; its parts from the settings by :mod:`tunecache.service.assembly`) and keeps it as
``app.state.tunecache``. ``tunecache serve --processes N`` runs ``N`` processes of it
(uvicorn's factory mode); one of a node's processes runs the job worker."""

from __future__ import annotations

import importlib.metadata
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from sqlalchemy import Engine
from starlette.routing import Route, compile_path

from tunecache.contract import MAX_REPORT_BYTES
from tunecache.service import api_docs, assembly, dashboard, metrics, policy
from tunecache.service.client_address import TrustedProxyHeaders
from tunecache.service.errors import COMMON_ERRORS, install_error_handlers
from tunecache.service.limits import AllowedHosts, LoadShedding, RequestBodyGuard
from tunecache.service.routes import artifacts, audit, health, jobs, reports, tokens, tunings
from tunecache.service.routes import metrics as metrics_route
from tunecache.service.settings import Settings

#: Every router of the API, mounted under ``/v1``; each of their routes declares a caller
#: policy (:mod:`tunecache.service.policy`).
API_ROUTERS = (health.router, tunings.router, artifacts.router, jobs.router, jobs.workers_router, tokens.router, audit.router,
               reports.router, reports.fleet_router, tokens.proof_router)
#: Routers mounted at the root, outside ``/v1``: ``GET /metrics``, where Prometheus looks by default.
ROOT_ROUTERS = (metrics_route.router,)
#: ``(prefix, router)`` of every router the app serves.
MOUNTED_ROUTERS = tuple(("/v1", router) for router in API_ROUTERS) + tuple(("", router) for router in ROOT_ROUTERS)


def _server_version() -> str:
    """The installed ``tunecache-server`` version (shown in the OpenAPI document)."""
    try:
        return importlib.metadata.version("tunecache-server")
    except importlib.metadata.PackageNotFoundError:  # run from the source roots (GPU machines)
        return "unknown"


def create_app(settings: Settings | None = None, engine: Engine | None = None) -> FastAPI:
    """Build the app. On startup it refuses to run on a database whose schema is not at
    the head revision (:class:`tunecache.service.db.SchemaOutOfDate`), then starts the
    GPU job worker per ``settings.job_worker`` (:func:`tunecache.service.assembly.build_state`)."""
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with assembly.build_state(settings, engine) as state:
            app.state.tunecache = state
            yield

    app = FastAPI(
        title="tunecache",
        version=_server_version(),
        summary="Persistent autotune cache for LLM inference fleets",
        lifespan=lifespan,
        docs_url=None,  # /docs and /redoc: from files installed with the server, no CDN (api_docs)
        redoc_url=None,
    )
    # (path regex, methods) of every route, for the Allow of a 405 and the detail of a 404
    path_methods = [(compile_path(prefix + route.path)[0], frozenset(route.methods))
                    for prefix, router in (*MOUNTED_ROUTERS, ("", dashboard.router)) for route in router.routes]
    install_error_handlers(app, path_methods, retry_after_s=settings.retry_after_seconds)
    for prefix, router in MOUNTED_ROUTERS:
        app.include_router(router, prefix=prefix, responses=COMMON_ERRORS)
    dashboard_templates = dashboard.install(app)  # the web dashboard at / (HTML; not in the OpenAPI document)
    docs_templates = api_docs.install(app)  # /docs and /redoc with their files, open to anyone as /openapi.json
    _add_middleware(app, settings, _route_templates(app) | dashboard_templates | docs_templates)
    _document_optional_tokens(app, settings)
    return app


def _add_middleware(app: FastAPI, settings: Settings, templates: dict[int, str]) -> None:
    """The middleware every request passes, outermost last (the last added runs first):
    the request counter (``templates``: each route's path template), the trusted proxies'
    headers, the allowed hosts, load shedding, the body guard."""
    app.add_middleware(RequestBodyGuard, max_upload_bytes=settings.max_upload_bytes, max_json_bytes=settings.max_json_bytes,
                       max_report_bytes=MAX_REPORT_BYTES, timeout_s=settings.body_timeout_seconds)
    # Added late, so it runs early: a saturated process answers 503 before doing any work.
    app.add_middleware(LoadShedding, max_in_flight=settings.max_in_flight, retry_after_s=settings.retry_after_seconds)
    # Before any work: a Host the service does not answer to (DNS rebinding) gets 400.
    if settings.allowed_host_list != ["*"]:
        app.add_middleware(AllowedHosts, allowed_hosts=settings.allowed_host_list)
    # Before anything reads a request's client or scheme: believe X-Forwarded-* from the named proxies only.
    app.add_middleware(TrustedProxyHeaders, proxies=settings.trusted_proxy_list)
    # Outermost: counts every answer, the 503s of load shedding too (one increment each).
    app.add_middleware(metrics.RequestCounter, templates=templates)


def _route_templates(app: FastAPI) -> dict[int, str]:
    """The full path template of every route, by the ``id`` of its endpoint (what routing
    puts in a request's scope): FastAPI's own routes and those of :data:`MOUNTED_ROUTERS`,
    with the prefix they are mounted under (the label ``route`` of
    ``tunecache_http_requests_total``)."""
    templates = {id(route.endpoint): route.path_format for route in app.routes if isinstance(route, Route)}
    templates.update({id(route.endpoint): prefix + route.path_format
                      for prefix, router in MOUNTED_ROUTERS for route in router.routes})
    return templates


def _document_optional_tokens(app: FastAPI, settings: Settings) -> None:
    """In the OpenAPI document, the routes anyone may call (``PUBLIC``, and ``READ`` unless
    ``TUNECACHE_READ_TOKEN_REQUIRED``) take the bearer token as optional (``security: [{},
    {"HTTPBearer": []}]``); the others require it, as FastAPI writes it."""
    optional = {policy.PUBLIC} | (set() if settings.read_token_required else {policy.READ})
    build = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = build()
            for prefix, router in MOUNTED_ROUTERS:
                for route in router.routes:
                    if policy.policy_of(route) in optional:
                        for method in route.methods:
                            schema["paths"][prefix + route.path_format][method.lower()]["security"] = [{}, {"HTTPBearer": []}]
        return app.openapi_schema

    app.openapi = openapi
