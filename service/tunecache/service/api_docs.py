"""The API's documentation pages, ``/docs`` (Swagger UI) and ``/redoc`` (ReDoc), served with
their JavaScript, stylesheet and icon from files installed with the server: they work on a
network that reaches nothing but the service (FastAPI's own pages load them from a CDN).

The files come from the ``fastapi-offline`` distribution, which ships Swagger UI's
``swagger-ui-bundle.js`` and ``swagger-ui.css`` and ReDoc's ``redoc.standalone.js``; only
its files are used, mounted with starlette's ``StaticFiles`` at :data:`ASSETS_PATH` (FastAPI's
"self-hosting JavaScript and CSS for docs" recipe). ReDoc's page loads no web fonts, and
Swagger UI's has no online validator (``validatorUrl: null``: it would send the document's
URL to swagger.io). Both pages are served with ``Content-Security-Policy: img-src 'self'
data:`` (:data:`IMAGES_FROM_HERE_ONLY`): ReDoc's sidebar shows its maker's logo from their
host, an image the browser now never asks for (ReDoc drops it when it does not load).

Who may call them: as FastAPI's own ``/docs``, ``/redoc`` and ``/openapi.json``, anyone
(they are framework routes outside the OpenAPI document, with no caller policy; what they
show is the OpenAPI document, which is open too; ``tests/unit/service/test_policy.py``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.staticfiles import StaticFiles
from starlette.types import Receive, Scope, Send

DOCS_PATH = "/docs"
REDOC_PATH = "/redoc"
OAUTH2_REDIRECT_PATH = "/docs/oauth2-redirect"
#: Where the pages' files are served (a ``StaticFiles`` mount).
ASSETS_PATH = "/docs/assets"
#: The files each page loads, under :data:`ASSETS_PATH`.
SWAGGER_JS, SWAGGER_CSS, REDOC_JS, FAVICON = "swagger-ui-bundle.js", "swagger-ui.css", "redoc.standalone.js", "favicon.png"
#: The pages' one policy: images from the service itself (or inline) only; scripts and
#: styles are not restricted further (they are the service's files, and ReDoc's inline styles).
IMAGES_FROM_HERE_ONLY = {"Content-Security-Policy": "img-src 'self' data:"}


def assets_dir() -> Path:
    """The directory of the packaged Swagger UI and ReDoc files (``fastapi_offline/static``),
    found without importing the package."""
    spec = importlib.util.find_spec("fastapi_offline")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the fastapi-offline distribution (Swagger UI and ReDoc files for /docs) is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "static"


class _Assets(StaticFiles):
    """``StaticFiles`` that puts itself in the scope as the endpoint, so that
    ``tunecache_http_requests_total`` labels its answers with :data:`ASSETS_PATH`'s template."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope["endpoint"] = self
        await super().__call__(scope, receive, send)


def _own_images_only(page: HTMLResponse) -> HTMLResponse:
    page.headers.update(IMAGES_FROM_HERE_ONLY)
    return page


def install(app: FastAPI) -> dict[int, str]:
    """Serve ``/docs``, ``/docs/oauth2-redirect``, ``/redoc`` and their files on ``app``, built
    with ``docs_url=None, redoc_url=None``. Returns the path template of each by the ``id`` of
    its endpoint (the ``route`` label of ``tunecache_http_requests_total``)."""
    assets = _Assets(directory=assets_dir())

    def local(request: Request, path: str) -> str:
        return request.scope.get("root_path", "").rstrip("/") + path

    async def swagger_ui(request: Request) -> HTMLResponse:
        return _own_images_only(get_swagger_ui_html(
            openapi_url=local(request, app.openapi_url), title=f"{app.title} - Swagger UI",
            oauth2_redirect_url=local(request, OAUTH2_REDIRECT_PATH),
            swagger_js_url=local(request, f"{ASSETS_PATH}/{SWAGGER_JS}"),
            swagger_css_url=local(request, f"{ASSETS_PATH}/{SWAGGER_CSS}"),
            swagger_favicon_url=local(request, f"{ASSETS_PATH}/{FAVICON}"),
            swagger_ui_parameters={"validatorUrl": None}))

    async def oauth2_redirect(request: Request) -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    async def redoc(request: Request) -> HTMLResponse:
        return _own_images_only(get_redoc_html(
            openapi_url=local(request, app.openapi_url), title=f"{app.title} - ReDoc",
            redoc_js_url=local(request, f"{ASSETS_PATH}/{REDOC_JS}"),
            redoc_favicon_url=local(request, f"{ASSETS_PATH}/{FAVICON}"), with_google_fonts=False))

    app.add_route(DOCS_PATH, swagger_ui, include_in_schema=False)
    app.add_route(OAUTH2_REDIRECT_PATH, oauth2_redirect, include_in_schema=False)
    app.add_route(REDOC_PATH, redoc, include_in_schema=False)
    app.mount(ASSETS_PATH, assets, name="api-docs-assets")
    return {id(swagger_ui): DOCS_PATH, id(oauth2_redirect): OAUTH2_REDIRECT_PATH, id(redoc): REDOC_PATH,
            id(assets): ASSETS_PATH + "/{path}"}
