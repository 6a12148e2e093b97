"""``/docs`` and ``/redoc`` from files installed with the server (``tunecache.service.api_docs``):
the pages name only the service's own URLs, each of those answers 200 with its content type,
and they stay open to anyone (as ``/openapi.json``) when reads need a token. In Chromium with
every request to another host aborted: tests/e2e/test_dashboard.py."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from tunecache.service.app import create_app
from tunecache.service.settings import Settings

#: What each file a page loads must be served as.
CONTENT_TYPES = {".js": ("text/javascript", "application/javascript"), ".css": ("text/css",), ".png": ("image/png",)}
#: src= and href= attributes, and the JavaScript strings of Swagger UI's set-up (url: '/openapi.json').
_URL = re.compile(r"""(?:src|href|spec-url)\s*=\s*["']([^"']*)["']|\burl\s*:\s*["']([^"']*)["']""")


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    # the pages touch no database: the app's lifespan (and its engine) is not started
    settings = Settings(worker="off", read_token_required=True, data_dir=tmp_path_factory.mktemp("data"))
    return TestClient(create_app(settings))


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_the_page_loads_only_files_the_service_serves(client, page):
    answer = client.get(page)  # no token, though reads need one here: open as /openapi.json is
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/html")
    html = answer.text
    assert not re.search(r"(?i)(https?:)?//[a-z0-9.-]", html), "the page names another host"
    urls = {a or b for a, b in _URL.findall(html)}
    assert "/openapi.json" in urls
    files = {url for url in urls if url != "/openapi.json"}
    assert len(files) >= 2, urls  # the page's script and its icon at least (Swagger UI: its stylesheet too)
    for url in sorted(files):
        assert url.startswith("/docs/assets/"), url
        served = client.get(url)
        assert served.status_code == 200, url
        suffix = url[url.rindex("."):]
        assert served.headers["content-type"].split(";")[0] in CONTENT_TYPES[suffix], (url, served.headers["content-type"])
        assert len(served.content) > 1000, url
    assert client.get("/openapi.json").status_code == 200
    # images only from here: ReDoc's sidebar logo from its maker's host is never asked for
    assert answer.headers["content-security-policy"] == "img-src 'self' data:"


def test_swagger_ui_has_no_online_validator(client):
    assert '"validatorUrl": null' in client.get("/docs").text


def test_the_swagger_ui_files_are_swagger_ui_and_redoc_s_is_redoc(client):
    assert "SwaggerUIBundle" in client.get("/docs/assets/swagger-ui-bundle.js").text
    assert ".swagger-ui" in client.get("/docs/assets/swagger-ui.css").text
    assert "Redoc" in client.get("/docs/assets/redoc.standalone.js").text
    assert client.get("/docs/oauth2-redirect").status_code == 200


@pytest.mark.parametrize("path", ["/docs/assets/no-such-file.js", "/docs/assets/../api_docs.py",
                                  "/docs/assets/%2e%2e/%2e%2e/app.py"])
def test_nothing_else_is_served_from_the_assets(client, path):
    assert client.get(path).status_code == 404


def test_the_pages_and_their_files_are_counted_by_route_template(client):
    from prometheus_client import REGISTRY

    def count(route: str) -> float:
        return REGISTRY.get_sample_value("tunecache_http_requests_total",
                                         {"method": "GET", "route": route, "status": "200"}) or 0.0

    before = {route: count(route) for route in ("/docs", "/redoc", "/docs/assets/{path}")}
    for path in ("/docs", "/redoc", "/docs/assets/swagger-ui.css", "/docs/assets/favicon.png"):
        assert client.get(path).status_code == 200
    assert {route: count(route) - seen for route, seen in before.items()} == {
        "/docs": 1, "/redoc": 1, "/docs/assets/{path}": 2}
