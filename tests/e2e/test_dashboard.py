"""The web dashboard (``tunecache.service.dashboard``).

In headless Chromium (Debian's ``chromium``, driven by Playwright; one browser for the
module) against a live ``tunecache serve`` with data seeded through the API as pods and
nodes send it: the fleet matrix and the wanted list, the stage-time chart with one point per
recorded stage, the diff page marking a changed tactic as a regression, the re-tune button
queuing a job with an admin token and refused without one (and from another site's page),
model and pod names holding markup shown as text, and signing in when reads need a token.
Screenshots go to the test's tmp dir; ``TUNECACHE_DASHBOARD_SCREENSHOT=PATH``
also copies the fleet page's there.

Without a browser (always run): pages of 1,000 keys and every report once over their
cursor pages, the same number of SQL statements for 3 keys as for 12 (no query per row),
the reports query answered from an index, the CSRF and origin checks, audit, the chart's
geometry, and the templates in the server wheel. The browser tests skip, naming the reason,
where no Chromium is installed (``apt-get install -y chromium``; ``.ci/run`` installs it;
``TUNECACHE_CHROMIUM`` names another executable).
"""

from __future__ import annotations

import copy
import datetime as dt
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.parse
import zipfile
from pathlib import Path

import httpx
import pytest
from sqlalchemy import event, text

from tests.support.builders import make_token
from tests.support.paths import CUBLASLT_FILE, CUDNN_FILE
from tests.support.serve import admin_headers, admin_token, as_admin
from tests.support.builders import file_environment, h200_key, plan_of, run_payload, stored_reports
from tunecache.contract import (
    EnvironmentMetadata,
    PodReportCreate,
    ReportOutcome,
    ReportSource,
    TuningKey,
    TuningRunRead,
)
from tunecache.formats.file_key import parse_file_key
from tunecache.service import db, reports
from tunecache.service.dashboard import chart
from tunecache.service.dashboard.queries import reports_page_query
from tunecache.service.dashboard.security import CSRF_COOKIE, form_csrf
from tests.support.paths import ROOT

# What this module tests is the browser's view: its server runs on SQLite only (tests/conftest.py); the fleet
# view's queries run on both databases in tests/unit/service/test_fleet_view.py.
SERVER_DATABASE_INCIDENTAL = True

DASHBOARD_DIR = ROOT / "service" / "tunecache" / "service" / "dashboard"
CHROMIUM = os.environ.get("TUNECACHE_CHROMIUM", "/usr/bin/chromium")
MODEL = "meta-llama/Llama-3.1-8B"
QWEN = "Qwen/Qwen3-30B-A3B"
NOW = dt.datetime.now(dt.timezone.utc)
sqlite_only = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


# ------------------------------------------------------------------------ browser


def _no_browser() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install -e '.[test]')"
    if not os.access(CHROMIUM, os.X_OK):
        return f"no Chromium at {CHROMIUM}: install Debian's (apt-get install -y chromium; .ci/run does)"
    return None


@pytest.fixture(scope="module")
def browser():
    """One headless Chromium for the module (Debian's build: Playwright downloads none)."""
    reason = _no_browser()
    if reason is not None:
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM)
        yield launched
        launched.close()


@pytest.fixture
def page(browser):
    """A fresh browser context (no cookies) and page; every JavaScript dialog is recorded
    (``page.dialogs``) and dismissed: the dashboard has no script, so any is injected."""
    context = browser.new_context(viewport={"width": 1500, "height": 1000})
    tab = context.new_page()
    tab.set_default_timeout(15_000)
    tab.dialogs = []
    tab.on("dialog", lambda dialog: (tab.dialogs.append(dialog.message), dialog.dismiss()))
    yield tab
    context.close()


def _screenshot(tab, tmp_path: Path, name: str) -> Path:
    path = tmp_path / "screenshots" / f"{name}.png"
    size = tab.viewport_size
    tab.set_viewport_size({"width": size["width"], "height": 300})  # the whole page, no blank below it
    tab.screenshot(path=str(path), full_page=True)
    tab.set_viewport_size(size)
    assert path.stat().st_size > 10_000, path  # a picture of a page, not a blank one
    return path


# ------------------------------------------------------------------------ seeding


def _upload(server: str, path: Path) -> None:
    data = path.read_bytes()
    answer = as_admin.put(f"{server}/v1/artifacts/{hashlib.sha256(data).hexdigest()}", content=data, timeout=30)
    assert answer.status_code in (200, 201), answer.text


def _record(server: str, path: Path, key: TuningKey, stages: dict | None = None) -> int:
    """Record a run of ``path`` through the API as a node does, forced current past the
    promotion policy (admin token; the retuned fixture is a regression by design), with
    ``stages`` as the tuner's ``summary.stages``; returns its id."""
    _upload(server, path)
    payload = run_payload(path, key)
    if stages is not None:
        payload["summary"]["stages"] = stages
    answer = as_admin.post(f"{server}/v1/tunings?force=true", json=payload, timeout=30)
    assert answer.status_code == 201, answer.text
    return answer.json()["id"]


def _report(key: TuningKey, outcome: ReportOutcome, pod: str, environment: EnvironmentMetadata | None = None,
            **fields) -> PodReportCreate:
    environment = environment or file_environment(CUDNN_FILE)
    return PodReportCreate(key=key, environment_hash=environment.environment_hash(),
                           environment=environment if outcome is ReportOutcome.MISS else None, outcome=outcome,
                           install_seconds=fields.pop("seconds", 0.8), pod=pod, source=ReportSource.PLUGIN, **fields)


def _send_report(server: str, report: PodReportCreate) -> None:
    answer = httpx.post(f"{server}/v1/reports", content=report.model_dump_json(), timeout=30,
                        headers={"Content-Type": "application/json"})
    assert answer.status_code == 202, answer.text


def _stages(**seconds: float | str) -> dict:
    """``summary.stages`` as the tuner's child writes it: a number is a stage that ran, a
    string a skipped stage's reason."""
    return {name: {"status": "done", "seconds": value} if isinstance(value, float) else {"status": "skipped", "reason": value}
            for name, value in seconds.items()}


class Retuned:
    """The cuDNN fixture re-tuned in one entry: another tactic, slower than the original by
    1.5 x its recorded margin (a regression by the diff's rule)."""

    def __init__(self, tmp_path: Path):
        doc = json.loads(CUDNN_FILE.read_text())
        entries = {k: v for k, v in doc.items() if not k.startswith("_")}
        self.file_key = max(entries, key=lambda k: entries[k][3]["margin"])
        runner, self.tactic_a, policy, selection = entries[self.file_key]
        self.tactic_b = next(v[1] for v in entries.values() if v[1] != self.tactic_a)
        slower = round(selection["time_ms"] * (1 + 1.5 * selection["margin"]), 6)
        retuned = copy.deepcopy(doc)
        retuned[self.file_key] = [runner, self.tactic_b, policy,
                                  {**selection, "time_ms": slower, "runner_up_ms": round(slower * 1.001, 6), "margin": 0.001}]
        self.path = tmp_path / "retuned.json"
        self.path.write_text(json.dumps(retuned, indent=2))
        self.bucket = parse_file_key(self.file_key).bucket


# ------------------------------------------------------------ fleet, history, diff


def test_fleet_matrix_wanted_list_chart_and_diff_in_a_browser(server, database_url, page, tmp_path):
    retuned = Retuned(tmp_path)
    llama, qwen = h200_key(model=MODEL), h200_key(model=QWEN, tensor_parallel_size=2)
    wanted = h200_key(model=MODEL, max_num_batched_tokens=16384)
    run_a = _record(server, CUDNN_FILE, llama, _stages(gemm=40.5, attention=7.25, moe="dense model"))
    run_b = _record(server, retuned.path, llama, _stages(gemm=38.0, attention=7.5, moe="dense model"))
    run_c = _record(server, retuned.path, llama, _stages(deep_gemm=12.0, gemm=41.0, attention=6.75))
    _record(server, CUBLASLT_FILE, qwen)
    for pod in ("pod-a", "pod-b"):
        _send_report(server, _report(llama, ReportOutcome.INSTALLED, pod, run_id=run_c))
    _send_report(server, _report(llama, ReportOutcome.ERROR, "pod-c", error_kind="ServerUnreachable"))
    differences = [{"field": "max_num_batched_tokens", "stored": "8192", "yours": "16384"}]
    for pod in ("pod-d", "pod-e"):
        _send_report(server, _report(wanted, ReportOutcome.MISS, pod, run_id=run_c, differences=differences))
    stored_reports(database_url, 5)  # the service stores reports in batches

    # the matrix: both tuned keys and the key pods asked for; the llama key's current run and hit rate
    assert page.goto(f"{server}/").status == 200
    rows = page.locator("#fleet-matrix tbody tr")
    assert rows.count() == 3
    assert sorted(rows.evaluate_all("rows => rows.map(r => r.dataset.model)")) == sorted([MODEL, MODEL, QWEN])
    llama_row = rows.filter(has_text=f"run {run_c}")
    assert llama_row.count() == 1
    assert "66.7 %" in llama_row.inner_text() and "2/0/1" in llama_row.inner_text()  # 2 installed, 1 error of 3
    assert "no current tuning" in rows.filter(has_text="16384").inner_text()
    wanted_rows = page.locator("#wanted-list tbody tr")
    assert wanted_rows.count() == 1
    assert "max_num_batched_tokens: stored 8192, pods 16384" in wanted_rows.inner_text()
    assert f"run {run_c}" in wanted_rows.inner_text()
    fleet_png = _screenshot(page, tmp_path, "fleet")
    if os.environ.get("TUNECACHE_DASHBOARD_SCREENSHOT"):
        shutil.copyfile(fleet_png, os.environ["TUNECACHE_DASHBOARD_SCREENSHOT"])

    # the key's history: its three runs, and one chart point per stage that ran (skipped ones are none)
    llama_row.get_by_role("link", name="history").click()
    page.wait_for_url(re.compile(r"/history\?"))
    assert page.locator("#history tbody tr").count() == 3
    svg = page.locator("svg#stage-chart")
    assert svg.get_attribute("data-points") == "7"
    assert svg.locator("circle.point").count() == 7
    stages = svg.locator("g.series").evaluate_all("groups => groups.map(g => [g.dataset.stage, g.querySelectorAll('circle').length])")
    assert stages == [["attention", 3], ["deep_gemm", 1], ["gemm", 3]]
    gemm = {int(c["run"]): float(c["y"]) for c in svg.locator("g.series[data-stage=gemm] circle").evaluate_all(
        "cs => cs.map(c => ({run: c.dataset.run, y: c.getAttribute('cy')}))")}
    assert gemm[run_c] < gemm[run_a] < gemm[run_b]  # 41.0 s drawn highest, 38.0 s lowest
    assert svg.bounding_box()["width"] > 300  # drawn, not collapsed
    _screenshot(page, tmp_path, "history")

    # run b against the run before it: the one re-tuned entry, marked as a regression
    page.goto(f"{server}/runs/{run_b}")
    page.locator("#diff-previous").click()
    page.wait_for_url(re.compile(rf"/diff\?a={run_a}&b={run_b}"))
    changed = page.locator("#diff-entries tbody tr")
    assert changed.count() == 1
    cells = changed.locator("td").all_inner_texts()
    assert cells[0] == "changed" and cells[3].startswith(retuned.bucket)
    assert cells[4] == f"{json.dumps(retuned.tactic_a, separators=(',', ':'))} → {json.dumps(retuned.tactic_b, separators=(',', ':'))}"
    assert "REGRESSION" in cells[-1]
    summary = page.locator("#diff-summary").inner_text()
    assert "1 changed tactic" in summary and "41 unchanged" in summary and "1 regression" in summary
    _screenshot(page, tmp_path, "diff")

    # pod reports, newest first
    page.goto(f"{server}/reports")
    assert page.locator("#reports tbody tr").count() == 5
    assert set(page.locator("#reports td.pod").all_inner_texts()) == {"(hidden)"}  # pods' names: an admin's to see
    page.set_extra_http_headers(admin_headers())
    page.goto(f"{server}/reports")
    assert page.locator("#reports tbody tr").first.locator("td.pod").inner_text() == "pod-e"
    page.goto(f"{server}/reports?outcome=miss")
    assert page.locator("#reports tbody tr").count() == 2
    _screenshot(page, tmp_path, "reports")
    assert page.dialogs == []


# -------------------------------------------------------------------------- re-tune


def _jobs(server: str) -> list[dict]:
    return httpx.get(f"{server}/v1/tuning-jobs", timeout=30).json()["items"]


@sqlite_only
def test_the_retune_button_queues_a_job_with_an_admin_token_only(server, page, tmp_path):
    llama = h200_key(model=MODEL)
    _record(server, CUDNN_FILE, llama)
    read = as_admin.post(f"{server}/v1/tokens", json={"name": "viewer", "scope": "read"}).json()["token"]

    page.goto(f"{server}/")
    page.locator("#fleet-matrix tbody tr").get_by_role("link", name="re-tune").click()
    page.wait_for_url(re.compile(r"/retune\?"))
    command = page.locator("#retune-command").inner_text()
    assert command == (f"tunecache retune --server {server} --model {MODEL} --max-num-batched-tokens 8192 "
                       f"--gpu-name 'NVIDIA H200' --arch sm90 --node-config")
    assert page.locator("#no-worker").count() == 1  # no GPU worker serves this test's server
    retune_url = page.url
    _screenshot(page, tmp_path, "retune")

    refusals = {"": (401, "needs a token with scope admin"), "tc_0123456789abcdef_" + "x" * 43: (401, "scope admin"),
                read: (403, "needs admin")}
    for token, (status, said) in refusals.items():
        page.goto(retune_url)
        page.fill("input[name=token]", token)
        page.evaluate("document.querySelector('input[name=token]').required = false")  # send it empty too
        with page.expect_response(lambda r: r.url.endswith("/retune") and r.request.method == "POST") as answer:
            page.click("#retune-button")
        assert answer.value.status == status, token
        assert said in page.locator("#error-detail").inner_text()
    assert _jobs(server) == []

    # a page of another site posting the same form, with the real admin token even: no
    # SameSite=Strict cookie comes with it, and its Origin is not the service's
    page.goto(retune_url)
    fields = dict(page.locator("#retune-form input[type=hidden]").evaluate_all("inputs => inputs.map(i => [i.name, i.value])"))
    forged = "".join(f'<input type="hidden" name="{k}" value="{v}">' for k, v in {**fields, "token": admin_token()}.items())
    page.goto("about:blank")
    page.set_content(f'<form id="f" method="post" action="{server}/retune">{forged}</form>')
    with page.expect_response(lambda r: r.url.endswith("/retune")) as answer:
        page.evaluate("document.getElementById('f').submit()")
    assert answer.value.status == 403
    assert _jobs(server) == []

    page.goto(retune_url)
    page.fill("input[name=token]", admin_token())
    with page.expect_response(lambda r: r.url.endswith("/retune") and r.request.method == "POST") as answer:
        page.click("#retune-button")
    assert answer.value.status == 202
    job_id = int(page.locator("#job-id").inner_text())
    assert page.locator("#job-status").inner_text() == "queued"
    (job,) = _jobs(server)
    assert (job["id"], job["status"], TuningKey.model_validate(job["key"])) == (job_id, "queued", llama)
    audited = as_admin.get(f"{server}/v1/audit").json()["events"]
    assert [(e["method"], e["path"], e["token_name"]) for e in audited if e["path"] == "/retune"] == [("POST", "/retune", "admin")]
    assert audited[0]["detail"] == f"job {job_id} for {MODEL} (queued) from the dashboard"
    _screenshot(page, tmp_path, "retune-done")
    assert page.dialogs == []


# ------------------------------------------------------------------------- escaping

EVIL_MODEL = '<script>alert("model")</script><img src=x onerror=alert(1)>'
EVIL_POD = "<img src=x onerror=alert('pod')>"


@sqlite_only
def test_markup_from_pods_is_shown_as_text(server, database_url, page, tmp_path):
    evil = h200_key(model=EVIL_MODEL)
    run = _record(server, CUDNN_FILE, evil, _stages(**{"<b onmouseover=alert(3)>gemm</b>": 12.5}))
    _send_report(server, _report(evil, ReportOutcome.INSTALLED, EVIL_POD, run_id=run))
    wanted = h200_key(model=EVIL_MODEL, max_num_batched_tokens=4096)
    _send_report(server, _report(wanted, ReportOutcome.MISS, EVIL_POD, run_id=run, differences=[
        {"field": "max_num_batched_tokens", "stored": "8192", "yours": "<script>alert(4)</script>"}]))
    stored_reports(database_url, 2)
    key_query = httpx.QueryParams(evil.model_dump())
    page.set_extra_http_headers(admin_headers())  # an admin is shown the pods' names (as text)
    for path in ("/", f"/history?{key_query}", "/reports", f"/runs/{run}", f"/retune?{key_query}", f"/diff?a={run}&b={run}"):
        assert page.goto(f"{server}{path}").status == 200, path
        assert page.locator("script").count() == 0 and page.locator("main img").count() == 0, path
        assert page.locator("svg b").count() == 0, path
        if path != "/reports" and not path.startswith("/diff"):
            assert page.get_by_text(EVIL_MODEL, exact=False).count() >= 1, path
    page.goto(f"{server}/reports")
    assert page.locator("#reports td.pod").first.inner_text() == EVIL_POD
    page.goto(f"{server}/")
    assert "<script>alert(4)</script>" in page.locator("#wanted-list").inner_text()
    page.goto(f"{server}/history?{key_query}")
    assert page.locator("#stage-chart g.series").get_attribute("data-stage") == "<b onmouseover=alert(3)>gemm</b>"
    _screenshot(page, tmp_path, "escaped")
    assert page.dialogs == []


# -------------------------------------------------------------------------- sign-in


@pytest.fixture
def locked_server(request, monkeypatch, database_url):
    """``tunecache serve`` (on ``database_url``) with ``TUNECACHE_READ_TOKEN_REQUIRED``."""
    monkeypatch.setenv("TUNECACHE_READ_TOKEN_REQUIRED", "1")
    return request.getfixturevalue("server")


@sqlite_only
def test_when_reads_need_a_token_a_browser_signs_in_with_a_read_token(locked_server, page, tmp_path):
    server = locked_server
    read = as_admin.post(f"{server}/v1/tokens", json={"name": "viewer", "scope": "read"}).json()["token"]
    first = page.goto(f"{server}/history")
    assert first.status == 401 and page.locator("#sign-in-form").count() == 1
    _screenshot(page, tmp_path, "sign-in")

    page.fill("#sign-in-form input[name=token]", admin_token())  # a token that can write never goes into a cookie
    page.click("#sign-in-form button")
    assert "signing in needs a token of scope read" in page.locator("#error-detail").inner_text()
    assert not [c for c in page.context.cookies() if c["name"] == "tunecache_session"]

    page.goto(f"{server}/history")
    page.fill("#sign-in-form input[name=token]", read)
    page.click("#sign-in-form button")
    page.wait_for_url(f"{server}/history")
    assert page.locator("h1").inner_text() == "Run history"
    (session,) = [c for c in page.context.cookies() if c["name"] == "tunecache_session"]
    assert (session["httpOnly"], session["sameSite"], session["value"]) == (True, "Strict", read)
    assert page.evaluate("document.cookie") == ""  # no cookie of the dashboard is readable by a script

    page.get_by_role("button", name="Sign out").click()
    page.wait_for_url(f"{server}/sign-in")
    assert page.goto(f"{server}/").status == 401


@sqlite_only
def test_the_api_docs_render_with_every_other_host_cut_off(locked_server, page, tmp_path):
    """/docs (Swagger UI) and /redoc (ReDoc) render from the files the server ships, with every
    request for another host aborted (the network off), and without a token though reads need
    one here. ``TUNECACHE_API_DOCS_SCREENSHOT=docs/api-docs-offline.png`` copies /docs' picture."""
    server = locked_server
    elsewhere = []

    def only_this_machine(route):
        if urllib.parse.urlsplit(route.request.url).hostname in ("127.0.0.1", "localhost", "::1"):
            route.continue_()
        else:
            elsewhere.append(route.request.url)
            route.abort("internetdisconnected")

    page.context.route("**/*", only_this_machine)
    failed = []
    page.on("requestfailed", lambda request: failed.append((request.url, request.failure)))
    assert page.goto(f"{server}/docs").status == 200
    page.locator(".swagger-ui .info").wait_for(state="visible")
    assert page.locator(".swagger-ui .info .title").inner_text().startswith("tunecache")
    page.locator(".opblock-summary-path", has_text="/v1/tunings/lookup").first.wait_for(state="visible")
    _screenshot(page, tmp_path, "api-docs")
    if os.environ.get("TUNECACHE_API_DOCS_SCREENSHOT"):  # the first screen of it, for the operator guide
        page.screenshot(path=os.environ["TUNECACHE_API_DOCS_SCREENSHOT"])

    assert page.goto(f"{server}/redoc").status == 200
    page.locator(".api-info h1").wait_for(state="visible")
    assert page.locator(".api-info h1").inner_text().startswith("tunecache")
    assert elsewhere == []  # no request left for another host
    # the one request that failed, if any: ReDoc's logo from its maker's host, stopped by the
    # page's img-src policy inside the browser (ReDoc drops the image)
    assert all(failure == "csp" and url.endswith(".svg") for url, failure in failed), failed


# ---------------------------------------------------------------- without a browser


def _seed_keys(sessions, count: int, reports_per_key: int = 2, start: int = 0) -> list[TuningKey]:
    """``count`` keys named only by pods' reports (one transaction): what the fleet lists."""
    keys = [h200_key(model=f"org/model-{start + i:04d}") for i in range(count)]
    environment = file_environment(CUDNN_FILE)
    with sessions.begin() as session:
        for i, key in enumerate(keys):
            for r in range(reports_per_key):
                outcome = ReportOutcome.MISS if r % 2 else ReportOutcome.ERROR
                fields = {"error_kind": "ServerUnreachable"} if outcome is ReportOutcome.ERROR else {}
                reports.record_report(session, _report(key, outcome, f"pod-{start + i}-{r}", environment, **fields),
                                      received_at=NOW - dt.timedelta(seconds=i * 7 + r))
    return keys


def _client(engine, tmp_path, **settings):
    from fastapi.testclient import TestClient

    from tunecache.service.app import create_app
    from tunecache.service.settings import Settings

    return TestClient(create_app(Settings(database_url=str(engine.url), worker="off", data_dir=tmp_path / "data",
                                          **settings), engine=engine))


def test_a_thousand_keys_and_every_report_page_by_page(engine, tmp_path):
    sessions = db.session_factory(engine)
    _seed_keys(sessions, 1000, reports_per_key=1)
    _seed_keys(sessions, 60, reports_per_key=2, start=1000)  # 1,120 reports; some received at the same instant
    with _client(engine, tmp_path, reads_show_identities=True) as client:  # the pods' names, to follow the pages
        first = client.get("/")
        assert first.status_code == 200 and "page 1 of 11" in first.text
        assert first.text.count('<tr data-model="') == 100
        last = client.get("/", params={"page": 11})
        assert last.text.count('<tr data-model="') == 60
        assert "No keys on page 12: 1060 in all." in client.get("/", params={"page": 12}).text
        assert "Wanted <span class=\"count\">60</span>" in first.text and "wanted page" not in first.text
        assert "No wanted tunings on page 2: 60 in all." in client.get("/", params={"wanted_page": 2}).text
        one = client.get("/", params={"q": "MODEL-0999"})  # case-insensitive, model or GPU
        assert one.text.count('<tr data-model="') == 1 and "org/model-0999" in one.text

        seen, cursor, pages = [], None, 0
        while True:
            answer = client.get("/reports", params={"cursor": cursor} if cursor else {})
            assert answer.status_code == 200
            seen += re.findall(r'<td class="pod">(pod-\d+-\d+)</td>', answer.text)
            pages += 1
            found = re.search(r'href="/reports\?cursor=([A-Za-z0-9_-]+)" rel="next"', answer.text)
            if not found:
                break
            cursor = found[1]
        assert pages == 23 and len(seen) == 1120 and len(set(seen)) == 1120
        with sessions.begin() as session:
            newest_first = [row[0] for row in session.execute(text(
                "SELECT pod FROM pod_reports ORDER BY received_at DESC, id DESC"))]
        assert seen == newest_first


def _statements(engine, client, path: str) -> int:
    count = 0

    def counted(*_):
        nonlocal count
        count += 1

    event.listen(engine, "before_cursor_execute", counted)
    try:
        assert client.get(path).status_code == 200, path
    finally:
        event.remove(engine, "before_cursor_execute", counted)
    return count


def test_pages_make_as_many_queries_for_12_keys_as_for_3(engine, tmp_path):
    """No query per row: each page's statements do not grow with its rows."""
    sessions = db.session_factory(engine)
    admin = make_token(engine, "ops", "admin")
    paths = ["/", "/history", f"/history?model={MODEL}", "/reports", "/reports?outcome=miss", "/jobs"]
    counts = []
    with _client(engine, tmp_path) as client:
        data = CUDNN_FILE.read_bytes()
        bearer = {"Authorization": f"Bearer {admin}"}
        assert client.put(f"/v1/artifacts/{hashlib.sha256(data).hexdigest()}", content=data, headers=bearer).status_code == 201
        for batch in (range(3), range(3, 12)):
            for i in batch:
                key = h200_key(model=MODEL, max_num_batched_tokens=1024 * (i + 1))
                payload = run_payload(CUDNN_FILE, key)
                payload["summary"]["stages"] = _stages(gemm=10.0 + i)
                assert client.post("/v1/tunings", json=payload, headers=bearer).status_code == 201
                assert client.post("/v1/tuning-jobs", json={"key": key.model_dump()}, headers=bearer).status_code == 202
            _seed_keys(sessions, len(batch), start=batch[0])
            client.get("/")  # warm: nothing cached differs between the two counts
            counts.append({path: _statements(engine, client, path) for path in paths})
    assert counts[0] == counts[1]


def test_the_reports_page_query_reads_an_index(engine):
    """The dashboard's own query (the others are the API's, checked in test_history.py)
    reaches ``pod_reports`` through an index, never by reading it whole."""
    after = (NOW - dt.timedelta(hours=1), 1234)
    queries = {
        "newest": reports_page_query(None, 51),
        "after a cursor": reports_page_query(after, 51),
        "one outcome after a cursor": reports_page_query(after, 51, outcome="miss"),
        "one key": reports_page_query(None, 51, key_hash="a" * 64),
    }
    with engine.begin() as connection:
        for name, query in queries.items():
            plan = plan_of(connection, query)
            assert any("ix_pod_reports" in step for step in plan), (name, plan)
            assert not any(step.startswith("Seq Scan") or step == "SCAN pod_reports" for step in plan), (name, plan)


def test_forms_refuse_other_sites_and_other_forms_and_audit_only_what_they_did(engine, tmp_path):
    admin = make_token(engine, "ops", "admin")
    key = {"gpu_name": "NVIDIA H200", "arch": "sm90", "model": MODEL, "max_num_batched_tokens": "8192"}
    secret = "c" * 43

    def post(form: str = "retune", headers: dict | None = None, cookie: bool = True, **extra):
        client.cookies.clear()
        if cookie:
            client.cookies.set(CSRF_COOKIE, secret)
        fields = {**key, "token": admin, "csrf": form_csrf(secret, form), **extra}
        return client.post("/retune", data=fields, headers=headers or {})

    with _client(engine, tmp_path) as client:
        assert post(headers={"Origin": "http://evil.example"}).status_code == 403
        assert post(headers={"Sec-Fetch-Site": "cross-site"}).status_code == 403
        assert post(form="sign-in").status_code == 403  # a CSRF field made for another form
        assert post(cookie=False).status_code == 403
        assert post(csrf="").status_code == 403
        assert client.post("/retune", json=key).status_code == 415
        assert post(max_num_batched_tokens="lots").status_code == 422
        assert post(hf_config="{not json").status_code == 422
        assert client.get("/v1/tuning-jobs").json()["total"] == 0

        queued = post(headers={"Origin": str(client.base_url)})
        assert queued.status_code == 202
        assert post().status_code == 202  # the same options: the same job (single-flight)
        conflict = post(hf_config=json.dumps({"model_type": "llama"}))
        assert conflict.status_code == 409 and "with other options" in conflict.text
        assert client.get("/v1/tuning-jobs").json()["total"] == 1
        events = client.get("/v1/audit", headers={"Authorization": f"Bearer {admin}"}).json()["events"]
        assert [e["detail"] for e in events] == ["job 1 for meta-llama/Llama-3.1-8B (already queued) from the dashboard",
                                                 "job 1 for meta-llama/Llama-3.1-8B (queued) from the dashboard"]

        client.cookies.clear()
        page = client.get("/retune", params=key)
        for header, value in (("content-security-policy", "default-src 'none'"), ("x-frame-options", "DENY"),
                              ("cache-control", "no-store")):
            assert value in page.headers[header]
        csrf_cookie = page.headers["set-cookie"]
        assert "HttpOnly" in csrf_cookie and "SameSite=strict" in csrf_cookie


def _requests_counted(client, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    exposition = client.get("/metrics").text
    return sum(sample.value for family in text_string_to_metric_families(exposition) for sample in family.samples
               if sample.name == "tunecache_http_requests_total" and labels.items() <= sample.labels.items())


def test_pages_are_counted_by_their_route_template(engine, tmp_path):
    with _client(engine, tmp_path) as client:
        before = _requests_counted(client, route="/runs/{run_id}", status="404")
        fleet_before = _requests_counted(client, route="/", status="200")
        assert client.get("/runs/424242").status_code == 404
        assert client.get("/").status_code == 200
        assert _requests_counted(client, route="/runs/{run_id}", status="404") - before == 1
        assert _requests_counted(client, route="/", status="200") - fleet_before == 1
        assert "424242" not in client.get("/metrics").text


def _run(run_id: int, minutes: int, summary: dict) -> TuningRunRead:
    payload = run_payload(CUDNN_FILE, h200_key())
    return TuningRunRead.model_validate({
        **payload, "id": run_id, "environment_hash": "0" * 64, "status": "succeeded", "node": None,
        "started_at": None, "finished_at": None, "duration_s": None, "error": None, "summary": summary,
        "verified": True, "is_current": False, "created_at": NOW + dt.timedelta(minutes=minutes), "artifacts": []})


def test_the_chart_draws_each_stage_time_in_place():
    runs = [_run(3, 20, {"stages": _stages(gemm=30.0, attention=5.0)}),
            _run(1, 0, {"stages": _stages(gemm=10.0, moe="dense")}),
            _run(2, 10, {"stages": {"gemm": {"seconds": float("nan")}, "attention": {"seconds": True},
                                    "moe": {"seconds": 20.0}}}),
            _run(4, 30, {"entries": 42})]  # no stages: not drawn
    drawn = chart.stage_chart(runs)
    assert drawn.runs == 3 and drawn.points == 4
    by_stage = {s.stage: [(p.run_id, round(p.x, 1), round(p.y, 1)) for p in s.points] for s in drawn.series}
    plot_w, bottom = chart.WIDTH - chart.LEFT - chart.RIGHT, chart.HEIGHT - chart.BOTTOM
    y = {s: round(bottom - (bottom - chart.TOP) * s / 50.0, 1) for s in (5.0, 10.0, 20.0, 30.0)}  # axis top: 50 s
    assert by_stage == {
        "attention": [(3, chart.LEFT + plot_w, y[5.0])],
        "gemm": [(1, chart.LEFT, y[10.0]), (3, chart.LEFT + plot_w, y[30.0])],
        "moe": [(2, chart.LEFT + plot_w / 2, y[20.0])],
    }
    assert drawn.y_ticks[-1] == (chart.TOP, "50 s")
    assert chart.stage_chart([runs[-1]]) is None


def test_templates_and_static_files_are_in_the_server_wheel(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path),
                    str(ROOT)], check=True, capture_output=True, timeout=600)
    (wheel,) = tmp_path.glob("tunecache_server-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {f"tunecache/service/dashboard/{p.relative_to(DASHBOARD_DIR).as_posix()}"
               for folder in ("templates", "static") for p in (DASHBOARD_DIR / folder).rglob("*") if p.is_file()}
    assert len(shipped) >= 10 and shipped <= names, sorted(shipped - names)


def test_the_fleet_page_shows_the_automatic_tunings_refused(engine, tmp_path):
    """Refusals of auto-tune (tunecache.service.auto_tune_refusals) in the window: their
    totals by reason, and each wanted variant's, on the fleet page."""
    from tunecache.service import auto_tune_refusals

    sessions = db.session_factory(engine)
    key, variant = h200_key(model="org/refused"), "ef" * 8
    with sessions.begin() as session:
        report = _report(key, ReportOutcome.MISS, "pod-1", file_environment(CUDNN_FILE))
        reports.record_report(session, report.model_copy(update={"variant": variant, "variant_missing": True,
                                                                 "engine_args": {"max_model_len": 8192}}))
        for reason in ("tokens", "tokens", "budget_hour"):
            auto_tune_refusals.record(session, key.key_hash(), variant, reason)
    with _client(engine, tmp_path) as client:
        page_text = client.get("/").text
    assert 'Automatic tunings refused <span class="count">3</span>' in page_text
    [row] = re.findall(r'<table class="matrix" id="auto-tune-refused">.*?</table>', page_text, re.S)
    assert "org/refused" in row and variant in row
    assert "<code>budget_hour</code> 1" in row and "<code>tokens</code> 2" in row
