"""Who may call what: every route declares a policy, the 401/403 matrix over every route
and scope (SQLite and PostgreSQL), tokens' life, the server deciding ``trigger`` and
``verified`` from the token, the audit log, and reads behind a token."""

from __future__ import annotations

import hashlib
import json

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from tests.support.builders import make_token
from tests.support.paths import FIXTURES
from tunecache.contract import Scope
from tunecache.service import dashboard
from tunecache.service.app import MOUNTED_ROUTERS, create_app
from tunecache.service.dashboard.security import (AUDIT_FORM_ADMIN, CSRF_COOKIE, FORM_ADMIN, PAGE_READ, PROMOTE_FORM_ADMIN,
                                                  SESSION_COOKIE, form_csrf)
from tunecache.service.policy import PUBLIC, READ, CallerPolicy, requires
from tunecache.service.settings import Settings

AUTOTUNE_FILE = FIXTURES / "flashinfer-0.7.4-h200" / "mm_bf16-cudnn.json"

#: What each route needs: the table an operator reads in docs/http-api.md. A new route fails
#: test_every_route_declares_its_policy until it is added here with its policy.
EXPECTED = {
    ("GET", "/v1/health"): PUBLIC,
    ("POST", "/v1/tunings/lookup"): READ,
    ("GET", "/v1/tunings"): READ,
    ("GET", "/v1/tunings/{run_id}"): READ,
    ("GET", "/v1/tunings/{run_a}/diff/{run_b}"): READ,
    ("GET", "/v1/artifacts/{sha256}"): READ,
    ("HEAD", "/v1/artifacts/{sha256}"): READ,
    ("GET", "/v1/tuning-jobs"): READ,
    ("GET", "/v1/tuning-jobs/{job_id}"): READ,
    ("GET", "/v1/workers"): READ,
    # a pod's install report decides nothing (no path, tuning or token; rate-limited per
    # address): pods with a read token, or none, send it (routes/reports.py says why)
    ("POST", "/v1/reports"): READ,
    ("GET", "/v1/fleet"): READ,
    ("PUT", "/v1/artifacts/{sha256}"): requires(Scope.PUSH),
    ("POST", "/v1/tunings"): requires(Scope.PUSH),
    ("POST", "/v1/tunings/{run_id}/promote"): requires(Scope.ADMIN),
    ("PUT", "/v1/tunings/{run_id}/pin"): requires(Scope.ADMIN),
    ("DELETE", "/v1/tunings/{run_id}/pin"): requires(Scope.ADMIN),
    ("POST", "/v1/tunings/{run_id}/retire"): requires(Scope.ADMIN),
    ("PUT", "/v1/tunings/{run_id}/verification"): requires(Scope.TUNE),
    ("POST", "/v1/tuning-jobs"): requires(Scope.ADMIN),
    ("DELETE", "/v1/tuning-jobs/{job_id}"): requires(Scope.ADMIN),
    ("POST", "/v1/tokens"): requires(Scope.ADMIN),
    ("GET", "/v1/tokens"): requires(Scope.ADMIN),
    ("DELETE", "/v1/tokens/{name}"): requires(Scope.ADMIN),
    # proves the service holds a token without it travelling (a local client asks before it
    # sends the local admin token: tunecache.store.http.local_token)
    ("GET", "/v1/token-proof"): PUBLIC,
    # who the caller's own token is (tunecache status)
    ("GET", "/v1/whoami"): PUBLIC,
    ("GET", "/v1/audit"): requires(Scope.ADMIN),
    ("GET", "/metrics"): READ,
}
#: Starlette routes outside the OpenAPI document, open to all: the document FastAPI serves,
#: and its viewers with their files (tunecache.service.api_docs, as FastAPI's own /docs was).
FRAMEWORK_ROUTES = {"/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc", "/docs/assets"}
HTTP_METHODS = {"get", "put", "post", "delete", "patch", "head", "options", "trace"}


def _policies(dependant) -> list[CallerPolicy]:
    found = [dependant.call] if isinstance(dependant.call, CallerPolicy) else []
    for sub in dependant.dependencies:
        found += _policies(sub)
    return found


def _route_path(route: APIRoute) -> str:
    return route.path.replace(":int}", "}")


def test_every_route_declares_its_policy():
    seen = {}
    for prefix, router in MOUNTED_ROUTERS:
        for route in router.routes:
            assert isinstance(route, APIRoute), route
            policies = _policies(route.dependant)
            assert len(policies) == 1, f"{sorted(route.methods)} {route.path} declares {len(policies)} caller policies"
            for method in route.methods:
                seen[(method, prefix + _route_path(route))] = policies[0]
    assert seen == EXPECTED
    # ... and those routers are all the app serves: every operation of its OpenAPI document,
    # and no route outside the document but FastAPI's own.
    app = create_app(Settings(worker="off"))
    documented = {(method.upper(), path) for path, item in app.openapi()["paths"].items() for method in item
                  if method in HTTP_METHODS}
    assert documented == set(EXPECTED)
    undocumented = {r.path for r in app.routes if getattr(r, "path", None) and not getattr(r, "include_in_schema", True)}
    assert undocumented <= FRAMEWORK_ROUTES
    # ... and every route of the app itself that is no API route (no caller policy) is one of
    # those, a mount too (the routers' routes are checked above)
    framework = {r.path for r in app.routes if not isinstance(r, APIRoute) and hasattr(r, "path")}
    assert framework == FRAMEWORK_ROUTES


SCOPES = [None, "invalid", "revoked", *Scope]


def _request(client: TestClient, method: str, path: str, token: str | None):
    concrete = (path.replace("{sha256}", "0" * 64).replace("{run_id}", "1").replace("{job_id}", "1")
                .replace("{name}", "nobody").replace("{run_a}", "1").replace("{run_b}", "2"))
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    body = b"{}" if method in ("POST", "PUT") else None
    return client.request(method, concrete, content=body, headers={**headers, "Content-Type": "application/json"})


def _expected_status(policy: CallerPolicy, presented: str | Scope | None, reads_need_token: bool) -> int | None:
    """401/403 where the policy refuses, ``None`` where it lets the request through."""
    if policy is PUBLIC:
        return None
    if presented in ("invalid", "revoked", None):
        # an open read is open to a token the service does not know too: it is read as no token
        return 401 if policy is not READ or reads_need_token else None
    return None if presented.includes(policy.scope) else 403


@pytest.mark.parametrize("reads_need_token", [False, True], ids=["reads-open", "reads-need-token"])
def test_the_401_403_matrix_over_every_route_and_scope(engine, tmp_path, reads_need_token):
    tokens = {scope: make_token(engine, f"t-{scope}", scope) for scope in Scope}
    tokens["invalid"] = "tc_0123456789abcdef_" + "x" * 43
    tokens["revoked"] = make_token(engine, "t-revoked", "admin")
    settings = Settings(database_url=str(engine.url), worker="off", data_dir=tmp_path / "data",
                        read_token_required=reads_need_token)
    with TestClient(create_app(settings, engine=engine)) as client:
        admin = {"Authorization": f"Bearer {tokens[Scope.ADMIN]}"}
        assert client.delete("/v1/tokens/t-revoked", headers=admin).status_code == 200
        failures = []
        for (method, path), policy in EXPECTED.items():
            for presented in SCOPES:
                token = tokens.get(presented) if presented is not None else None
                answer = _request(client, method, path, token)
                expected = _expected_status(policy, presented, reads_need_token)
                got = answer.status_code
                if (expected is None and got in (401, 403)) or (expected is not None and got != expected):
                    failures.append(f"{method} {path} with {presented}: {got}, expected {expected or 'not 401/403'}")
                if got in (401, 403) and method != "HEAD":  # a HEAD answer has no body
                    detail = answer.json()["detail"]
                    assert isinstance(detail, str) and detail, (method, path, presented)
                    assert f"scope {policy.scope}" in detail or f"needs {policy.scope}" in detail, detail
                    if got == 401:
                        assert answer.headers["WWW-Authenticate"] == "Bearer"
        assert not failures, "\n".join(failures)


#: The web dashboard's routes (HTML at the root, outside the OpenAPI document): pages follow
#: the read policy (a browser presents a read token through the sign-in cookie), the re-tune
#: button needs an admin token pasted into its form, the sign-in forms and the stylesheet are
#: open. A new dashboard route fails test_every_dashboard_route_declares_its_policy until added.
DASHBOARD_EXPECTED = {
    ("GET", "/"): PAGE_READ,
    ("GET", "/history"): PAGE_READ,
    ("GET", "/reports"): PAGE_READ,
    ("GET", "/jobs"): PAGE_READ,
    ("GET", "/runs/{run_id}"): PAGE_READ,
    ("GET", "/diff"): PAGE_READ,
    ("GET", "/retune"): PAGE_READ,
    ("POST", "/retune"): FORM_ADMIN,
    ("POST", "/runs/{run_id}/promote"): PROMOTE_FORM_ADMIN,
    ("GET", "/sign-in"): PUBLIC,
    ("POST", "/sign-in"): PUBLIC,
    ("POST", "/sign-out"): PUBLIC,
    ("GET", "/static/{name}"): PUBLIC,
    ("GET", "/jobs/{job_id}"): PAGE_READ,
    ("GET", "/audit"): requires(Scope.ADMIN),
    ("GET", "/audit/open"): PAGE_READ,
    ("POST", "/audit"): AUDIT_FORM_ADMIN,
}
_KEY_QUERY = {"gpu_name": "NVIDIA H200", "arch": "sm90", "model": "m/dashboard", "max_num_batched_tokens": "8192"}


def test_every_dashboard_route_declares_its_policy():
    seen = {}
    for route in dashboard.router.routes:
        assert isinstance(route, APIRoute) and not route.include_in_schema, route
        policies = _policies(route.dependant)
        assert len(policies) == 1, f"{sorted(route.methods)} {route.path} declares {len(policies)} caller policies"
        for method in route.methods:
            seen[(method, _route_path(route))] = policies[0]
    assert seen == DASHBOARD_EXPECTED
    assert (PAGE_READ.scope, FORM_ADMIN.scope) == (Scope.READ, Scope.ADMIN)
    # none of them is in the OpenAPI document (test_every_route_declares_its_policy: it lists EXPECTED only)
    paths = create_app(Settings(worker="off")).openapi()["paths"]
    assert not {path for _, path in DASHBOARD_EXPECTED} & set(paths)


def _dashboard_request(client: TestClient, method: str, path: str, token: str | None, transport: str):
    """A browser's request: a page with the sign-in cookie (or a bearer header, as curl
    sends it), a form with this browser's CSRF field and the token in its ``token`` field."""
    client.cookies.clear()
    secret = "s" * 43
    client.cookies.set(CSRF_COOKIE, secret)
    concrete = path.replace("{run_id}", "1").replace("{job_id}", "1").replace("{name}", "dashboard.css")
    if method == "GET":
        params = {"/diff": {"a": 1, "b": 2}, "/retune": _KEY_QUERY}.get(path, {})
        headers = {}
        if token and transport == "cookie":
            client.cookies.set(SESSION_COOKIE, token)
        elif token:
            headers["Authorization"] = f"Bearer {token}"
        return client.get(concrete, params=params, headers=headers, follow_redirects=False)
    form = {"/retune": "retune", "/sign-in": "sign-in", "/sign-out": "sign-out", "/runs/{run_id}/promote": "promote",
            "/audit": "audit"}[path]
    fields = {**(_KEY_QUERY if path == "/retune" else {}), "csrf": form_csrf(secret, form), "token": token or ""}
    return client.post(concrete, data=fields, follow_redirects=False)


def _dashboard_expected(policy: CallerPolicy, method: str, path: str, presented: str | Scope | None,
                        reads_need_token: bool, transport: str) -> int | None:
    """401/403 where the dashboard refuses, ``None`` where it lets the request through."""
    if (method, path) == ("POST", "/sign-in"):  # open, but it signs in with a valid read token only
        if presented in (None, "invalid", "revoked"):
            return 401
        return None if presented is Scope.READ else 403
    if policy is PUBLIC:
        return None
    if policy in (FORM_ADMIN, PROMOTE_FORM_ADMIN, AUDIT_FORM_ADMIN):
        if presented in (None, "invalid", "revoked"):
            return 401
        return None if presented is Scope.ADMIN else 403
    if policy is requires(Scope.ADMIN):  # the audit log: a bearer header only (a cookie never holds an admin token)
        if transport == "cookie" or presented in (None, "invalid", "revoked"):
            return 401
        return None if presented is Scope.ADMIN else 403
    if transport == "cookie" and not reads_need_token:
        return None  # open reads never look at the cookie
    if presented in ("invalid", "revoked", None) and reads_need_token:  # open reads: read as no token
        return 401
    return None


@pytest.mark.parametrize("reads_need_token", [False, True], ids=["reads-open", "reads-need-token"])
def test_the_dashboard_401_403_matrix(engine, tmp_path, reads_need_token):
    tokens = {scope: make_token(engine, f"t-{scope}", scope) for scope in Scope}
    tokens["invalid"] = "tc_0123456789abcdef_" + "x" * 43
    tokens["revoked"] = make_token(engine, "t-revoked", "read")
    settings = Settings(database_url=str(engine.url), worker="off", data_dir=tmp_path / "data",
                        read_token_required=reads_need_token)
    with TestClient(create_app(settings, engine=engine)) as client:
        assert client.delete("/v1/tokens/t-revoked", headers={"Authorization": f"Bearer {tokens[Scope.ADMIN]}"}).status_code == 200
        failures = []
        for (method, path), policy in DASHBOARD_EXPECTED.items():
            for transport in ("cookie", "bearer") if method == "GET" else ("form",):
                for presented in SCOPES:
                    token = tokens.get(presented) if presented is not None else None
                    answer = _dashboard_request(client, method, path, token, transport)
                    expected = _dashboard_expected(policy, method, path, presented, reads_need_token, transport)
                    got = answer.status_code
                    if (expected is None and got in (401, 403)) or (expected is not None and got != expected):
                        failures.append(f"{method} {path} ({transport}) with {presented}: {got}, expected "
                                        f"{expected or 'not 401/403'}")
                    if got in (401, 403):  # a page that names the scope needed
                        assert answer.headers["content-type"].startswith("text/html"), (method, path)
                        assert f"scope {policy.scope or Scope.READ}" in answer.text or f"needs {policy.scope}" in answer.text, \
                            answer.text
                        if got == 401:
                            assert answer.headers["WWW-Authenticate"] == "Bearer"
        assert not failures, "\n".join(failures)
        # the admin's form request queued the key's job (the matrix reached the route itself)
        jobs = client.get("/v1/tuning-jobs", headers={"Authorization": f"Bearer {tokens[Scope.READ]}"}).json()["items"]
        assert [job["key"]["model"] for job in jobs] == ["m/dashboard"]


def _upload(client: TestClient, data: bytes, token: str | None = None) -> str:
    sha = hashlib.sha256(data).hexdigest()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    assert client.put(f"/v1/artifacts/{sha}", content=data, headers=headers).status_code in (200, 201)
    return sha


def _run_body(sha: str, trigger: str = "upload") -> dict:
    metadata = json.loads(AUTOTUNE_FILE.read_text())["_metadata"]
    return {
        "key": {"gpu_name": "NVIDIA H200", "arch": "sm90", "model": "m/attack", "max_num_batched_tokens": 8192},
        "environment": {k: str(v) for k, v in metadata.items()},
        "trigger": trigger,
        "node": "anywhere",
        "artifacts": [{"kind": "flashinfer_autotune_v1", "name": "mm.json", "sha256": sha}],
    }


def test_the_token_decides_trigger_and_verified_never_the_body(app_client, engine):
    push = make_token(engine, "pod-fleet", "push")
    tune = make_token(engine, "gpu-node-1", "tune")
    sha = _upload(app_client, AUTOTUNE_FILE.read_bytes(), push)

    pushed = app_client.post("/v1/tunings", json=_run_body(sha, trigger="upload"), headers={"Authorization": f"Bearer {push}"})
    assert pushed.status_code == 201
    run = pushed.json()
    assert (run["trigger"], run["verified"], run["is_current"], run["recorded_by"]) == ("pod", False, False, "pod-fleet")
    body = {k: _run_body(sha)[k] for k in ("key", "environment")}
    assert app_client.post("/v1/tunings/lookup", json=body).status_code == 404  # nothing became current

    tuned = app_client.post("/v1/tunings", json=_run_body(sha, trigger="cli"), headers={"Authorization": f"Bearer {tune}"})
    run = tuned.json()
    assert (run["trigger"], run["verified"], run["is_current"], run["recorded_by"]) == ("cli", True, True, "gpu-node-1")
    assert app_client.post("/v1/tunings/lookup", json=body).json()["id"] == run["id"]


def test_token_life_create_list_use_revoke(app_client):
    created = app_client.post("/v1/tokens", json={"name": "gpu-node-2", "scope": "tune"})
    assert created.status_code == 201
    secret = created.json()["token"]
    assert secret.startswith("tc_") and created.json()["scope"] == "tune"
    assert app_client.post("/v1/tokens", json={"name": "gpu-node-2", "scope": "read"}).status_code == 409
    assert app_client.post("/v1/tokens", json={"name": "../etc", "scope": "read"}).status_code == 422
    assert app_client.post("/v1/tokens", json={"name": "x", "scope": "root"}).status_code == 422

    node = {"Authorization": f"Bearer {secret}"}
    assert _upload(app_client, b"tuned bytes", secret)
    listed = {t["name"]: t for t in app_client.get("/v1/tokens").json()}
    assert "token" not in listed["gpu-node-2"] and secret not in json.dumps(listed)
    assert listed["gpu-node-2"]["last_used_at"] is not None and listed["gpu-node-2"]["created_by"] == "test-admin"

    assert app_client.delete("/v1/tokens/gpu-node-2").status_code == 200
    refused = app_client.put(f"/v1/artifacts/{hashlib.sha256(b'more').hexdigest()}", content=b"more", headers=node)
    assert refused.status_code == 401  # at once: writes check the database every time
    assert app_client.delete("/v1/tokens/nobody").status_code == 404
    assert app_client.get("/v1/tokens").json()[-1]["revoked_at"] is not None


def test_the_last_live_admin_token_cannot_be_revoked(app_client, engine):
    last = app_client.delete("/v1/tokens/test-admin")
    assert last.status_code == 409 and "last live admin token" in last.json()["detail"]
    second = make_token(engine, "second-admin", "admin")
    assert app_client.delete("/v1/tokens/test-admin").status_code == 200  # another admin remains
    assert app_client.delete("/v1/tokens/second-admin", headers={"Authorization": f"Bearer {second}"}).status_code == 409


def test_a_node_token_cannot_make_tokens(app_client, engine):
    tune = make_token(engine, "gpu-node-3", "tune")
    answer = app_client.post("/v1/tokens", json={"name": "mine", "scope": "admin"}, headers={"Authorization": f"Bearer {tune}"})
    assert answer.status_code == 403
    assert "'gpu-node-3' has scope tune" in answer.json()["detail"] and "needs admin" in answer.json()["detail"]


def test_every_write_is_audited_with_its_token_and_nothing_else_is(app_client, engine):
    push = make_token(engine, "pod-7", "push")
    sha = _upload(app_client, AUTOTUNE_FILE.read_bytes(), push)
    run = app_client.post("/v1/tunings", json=_run_body(sha), headers={"Authorization": f"Bearer {push}"}).json()
    bad = app_client.post("/v1/tunings", json=_run_body("f" * 64), headers={"Authorization": f"Bearer {push}"})
    assert bad.status_code == 422  # refused writes leave no event (the transaction rolled back)
    app_client.get("/v1/tunings")
    app_client.post("/v1/tokens", json={"name": "later", "scope": "read"})

    events = app_client.get("/v1/audit").json()["events"]
    assert [(e["token_name"], e["scope"], e["method"], e["path"]) for e in events] == [
        ("test-admin", "admin", "POST", "/v1/tokens"),
        ("pod-7", "push", "POST", "/v1/tunings"),
        ("pod-7", "push", "PUT", f"/v1/artifacts/{sha}"),
    ]
    assert events[1]["detail"].startswith(f"run {run['id']} (pod, unverified)")
    assert events[0]["detail"] == "created token 'later' (read)"
    page = app_client.get("/v1/audit", params={"limit": 2}).json()
    assert len(page["events"]) == 2 and page["next_before"] == page["events"][-1]["id"]
    rest = app_client.get("/v1/audit", params={"limit": 2, "before": page["next_before"]}).json()
    assert [e["path"] for e in rest["events"]] == [f"/v1/artifacts/{sha}"] and rest["next_before"] is None


def test_health_says_only_up_without_a_token(app_client):
    anonymous = app_client.get("/v1/health", headers={"Authorization": ""})
    assert anonymous.json() == {"status": "ok"}
    assert app_client.get("/v1/health", headers={"Authorization": "Bearer tc_0123456789abcdef_" + "y" * 43}).json() == {
        "status": "ok"}
    detailed = app_client.get("/v1/health").json()
    assert detailed["database"] in ("sqlite", "postgresql") and "worker" in detailed


def test_reads_behind_a_token_and_the_read_cache(engine, tmp_path):
    read = make_token(engine, "dashboard", "read")
    admin = make_token(engine, "ops", "admin")
    settings = Settings(database_url=str(engine.url), worker="off", data_dir=tmp_path / "data", read_token_required=True,
                        token_cache_seconds=3600)
    with TestClient(create_app(settings, engine=engine)) as client:
        assert client.get("/v1/tunings").status_code == 401
        assert client.get("/v1/tunings", headers={"Authorization": f"Bearer {read}"}).status_code == 200
        client.delete("/v1/tokens/dashboard", headers={"Authorization": f"Bearer {admin}"})
        # Reads trust a checked token for TUNECACHE_TOKEN_CACHE_SECONDS (here an hour) ...
        assert client.get("/v1/tunings", headers={"Authorization": f"Bearer {read}"}).status_code == 200
    with TestClient(create_app(settings, engine=engine)) as client:
        # ... a process that has not seen it checks the database.
        assert client.get("/v1/tunings", headers={"Authorization": f"Bearer {read}"}).status_code == 401
