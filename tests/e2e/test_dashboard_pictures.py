"""The dashboard's pictures and layout in a real browser (headless Chromium, Playwright;
``tests/e2e/test_dashboard.py`` has the browser and its reasons to skip).

One live ``tunecache serve`` seeded as a fleet sends it (runs through the API, reports as
pods' boots over the last day, a finished job, a pin, the audit log's writes), then every
page at 1280, 1440 and 1920 px: each chart's SVG carries the numbers it was given (hit
rate per bucket, boot seconds saved, wanted variants, tuning time and entries per run, a
job's stages), pin state shows on the run and history pages, a pushed run says it has no
stages, the audit log opens for an admin only, and no page is wider than the window (the
Wanted table's ``tune`` link in view, model names on at most three lines, a 450-character
environment field wrapped). ``TUNECACHE_DASHBOARD_SCREENSHOTS=docs`` keeps the pictures the
operator guide shows (``dashboard-<page>-<width>.png``).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import httpx
import pytest

from tests.e2e.test_dashboard import _no_browser, _send_report, _stages, _upload, browser  # noqa: F401  (the fixture)
from tests.support.builders import file_environment, h200_key, run_payload, stored_reports
from tests.support.paths import CUBLASLT_FILE, CUDNN_FILE
from tests.support.serve import admin_headers, admin_token, as_admin
from tunecache.contract import PodReportCreate, ReportOutcome, ReportSource, TuningJobCreate
from tunecache.service import db, jobs, reports

sqlite_only = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)

WIDTHS = (1280, 1440, 1920)
LONG_MODEL = "deepseek-ai/DeepSeek-R1-Distill-Llama-70B-Instruct-FP8-dynamic-2025"
QWEN = "Qwen/Qwen3-30B-A3B-Instruct-2507"
PUSHED = "org/pushed-only-model"
VARIANT = "ab" * 8
LONG_FIELD = "4.3.0+" + "cutlass-dsl-build-" * 25  # 456 characters in one environment field


def _record(server: str, path: Path, key, *, trigger: str, stages: dict | None = None, **summary) -> int:
    """A run recorded through the API with an admin token (forced current), as a tuner
    (``cli``, with ``summary.stages``) or a push (``upload``) records it."""
    _upload(server, path)
    payload = run_payload(path, key, trigger=trigger)
    payload["summary"].update(summary)
    if stages is not None:
        payload["summary"]["stages"] = stages
    answer = as_admin.post(f"{server}/v1/tunings?force=true", json=payload, timeout=30)
    assert answer.status_code == 201, answer.text
    return answer.json()["id"]


def _boot(key, run_id: int | None, outcome: ReportOutcome, boot: str, *, compiled: dict | None = None,
          seconds: float = 1.5, **fields) -> PodReportCreate:
    environment = file_environment(CUDNN_FILE)
    return PodReportCreate(key=key, environment_hash=environment.environment_hash(),
                           environment=environment if outcome is ReportOutcome.MISS else None, outcome=outcome,
                           run_id=run_id, install_seconds=seconds, pod=f"pod-{boot}", source=ReportSource.PLUGIN,
                           boot_id=boot.rjust(16, "0"), compiled=compiled, **fields)


FLOOR = {"flashinfer_jit_modules": 0, "triton_kernels": 0}


@pytest.fixture
def fleet(server, database_url, tmp_path):
    """The seeded service: what each chart must show, by name."""
    llama, qwen, pushed = h200_key(model=LONG_MODEL), h200_key(model=QWEN, tensor_parallel_size=2), h200_key(model=PUSHED)
    run_a = _record(server, CUDNN_FILE, llama, trigger="cli", stages=_stages(gemm=40.5, attention=7.25), tuning_seconds=50.0)
    run_b = _record(server, CUDNN_FILE, llama, trigger="cli", stages=_stages(gemm=38.0, attention=7.5, moe="dense"),
                    tuning_seconds=47.5)
    long_env = json.loads(CUBLASLT_FILE.read_text())
    long_env["_metadata"]["cutlass_dsl_version"] = LONG_FIELD
    long_path = tmp_path / "long-environment.json"
    long_path.write_text(json.dumps(long_env, indent=1))
    run_q = _record(server, long_path, qwen, trigger="cli", stages=_stages(gemm=20.0, deep_gemm=10.0), tuning_seconds=31.0)
    run_p = _record(server, CUBLASLT_FILE, pushed, trigger="upload")
    assert as_admin.put(f"{server}/v1/tunings/{run_a}/pin", timeout=30).status_code == 200

    now = dt.datetime.now(dt.timezone.utc)
    engine = db.create_db_engine(database_url)
    at = {hours: now - dt.timedelta(hours=hours) for hours in (20.5, 10.5, 0.5)}
    seeded = [  # (hours ago, report)
        (20.5, _boot(llama, run_a, ReportOutcome.INSTALLED, "a1", compiled=FLOOR)),
        (10.5, _boot(llama, run_b, ReportOutcome.INSTALLED, "b1", compiled=FLOOR)),
        (10.5, _boot(llama, None, ReportOutcome.ERROR, "b2", error_kind="ServerUnreachable")),
        (0.5, _boot(llama, run_b, ReportOutcome.INSTALLED, "c1", compiled=FLOOR)),
        (0.5, _boot(llama, run_b, ReportOutcome.INSTALLED, "c1", compiled=FLOOR, rank=1)),  # the same boot's 2nd rank
        (0.5, _boot(llama, run_b, ReportOutcome.INSTALLED, "c2", compiled={"triton_kernels": 3})),  # not warm
        (0.5, _boot(llama, run_b, ReportOutcome.INSTALLED, "c3", compiled=FLOOR, variant=VARIANT, variant_missing=True,
                    engine_args={"max_model_len": 8192})),
        (0.5, _boot(llama, run_b, ReportOutcome.INSTALLED, "c4", variant=VARIANT, variant_missing=True,
                    engine_args={"max_model_len": 8192})),
        (0.5, _boot(qwen, run_q, ReportOutcome.INSTALLED, "q1", compiled=FLOOR, seconds=2.0)),
        (0.5, _boot(qwen, run_q, ReportOutcome.INSTALLED, "q2", compiled=FLOOR, seconds=2.0)),
        (0.5, _boot(pushed, run_p, ReportOutcome.INSTALLED, "p1", compiled=FLOOR)),
    ]
    try:
        with db.session_factory(engine).begin() as session:
            for hours, report in seeded:
                reports.record_report(session, report, received_at=at[hours])
            job = jobs.enqueue(session, TuningJobCreate(key=llama), requested_by="admin")[0]
            assert jobs.claim(session, "gpu-node:1", "NVIDIA H200", "sm90", lease_s=600).id == job.id
            assert jobs.finish(session, job.id, "gpu-node:1", run_id=run_b)
    finally:
        engine.dispose()
    wanted = h200_key(model=LONG_MODEL, max_num_batched_tokens=16384)
    differences = [{"field": "max_num_batched_tokens", "stored": "8192", "yours": "16384"},
                   {"field": "cutlass_dsl_version", "stored": LONG_FIELD[:200], "yours": "4.3.1"}]
    for pod in ("pod-w1", "pod-w2"):
        _send_report(server, PodReportCreate(
            key=wanted, environment_hash=file_environment(CUDNN_FILE).environment_hash(),
            environment=file_environment(CUDNN_FILE), outcome=ReportOutcome.MISS, run_id=run_b, differences=differences,
            install_seconds=0.2, pod=pod, source=ReportSource.PLUGIN))
    stored_reports(database_url, len(seeded) + 2)
    return {"server": server, "llama": llama, "qwen": qwen, "pushed": pushed, "run_a": run_a, "run_b": run_b,
            "run_q": run_q, "run_p": run_p, "job": job.id}


def _data(page, selector: str, attribute: str) -> list[str]:
    return page.locator(selector).evaluate_all(f"els => els.map(e => e.getAttribute('{attribute}'))")


def _fits(page, path: str) -> None:
    """Nothing on the page is wider than the window (no horizontal scrolling)."""
    widths = page.evaluate("() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]")
    assert widths[0] <= widths[1], (path, widths)
    for table in page.locator("main table").all():
        box = table.bounding_box()
        assert box is None or box["x"] + box["width"] <= widths[1] + 0.5, (path, box)


def _keep(page, tmp_path: Path, name: str, keep: bool) -> None:
    path = tmp_path / f"dashboard-{name}.png"
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 10_000, path
    target = os.environ.get("TUNECACHE_DASHBOARD_SCREENSHOTS")
    if keep and target:
        shutil.copyfile(path, Path(target) / path.name)


@sqlite_only
def test_every_page_draws_its_data_and_fits_1280_1440_and_1920_px(browser, fleet, tmp_path):  # noqa: F811
    server, key_query = fleet["server"], httpx.QueryParams(fleet["llama"].model_dump())
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(15_000)
    dialogs = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    pages = {"fleet": "/", "history": f"/history?{key_query}", "reports": "/reports", "jobs": "/jobs",
             "job": f"/jobs/{fleet['job']}", "run": f"/runs/{fleet['run_q']}", "pinned-run": f"/runs/{fleet['run_a']}",
             "pushed-run": f"/runs/{fleet['run_p']}", "diff": f"/diff?a={fleet['run_a']}&b={fleet['run_b']}",
             "retune": f"/retune?{key_query}", "audit-form": "/audit/open"}
    others = {1280: "history", 1440: "run", 1920: "job"}  # one more page per width kept for the docs
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        for name, path in pages.items():
            assert page.goto(f"{server}{path}").status == 200, path
            assert page.locator("script").count() == 0
            _fits(page, f"{path} at {width} px")
            lines = page.locator("td.model .model-name").evaluate_all(
                "spans => spans.map(s => { const r = document.createRange(); r.selectNodeContents(s); "
                "return new Set([...r.getClientRects()].map(c => Math.round(c.top))).size; })")
            assert max(lines, default=0) <= 3, (path, width, lines)  # model names on at most three lines
            if name in ("fleet", others[width]):
                _keep(page, tmp_path, f"{name}-{width}", keep=True)

        # the fleet: the Wanted table's tune link in view, model names in both tables
        page.goto(f"{server}/")
        tune = page.locator("#wanted-list td.actions a", has_text="tune")
        assert tune.count() == 1 and tune.is_visible()
        box = tune.bounding_box()
        assert box["x"] + box["width"] <= width, (width, box)
        assert page.locator("#fleet-matrix td.model .model-name").count() == 4
        assert page.locator("#wanted-list td.model .model-name").count() == 1
        # a 456-character environment field wraps inside the window
        page.goto(f"{server}/runs/{fleet['run_q']}")
        cell = page.locator("#environment td", has_text="cutlass-dsl-build-").bounding_box()
        assert cell["x"] + cell["width"] <= width and cell["height"] > 30, (width, cell)
    assert dialogs == []
    context.close()


@sqlite_only
def test_each_chart_carries_the_data_it_was_given(browser, fleet, tmp_path):  # noqa: F811
    server = fleet["server"]
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    page = context.new_page()
    page.set_default_timeout(15_000)

    # hit rate over time: 24 hourly buckets; the fleet's boots 20.5 h ago (1 installed), 10.5 h
    # ago (1 installed, 1 error) and in the last hour (llama: 4 boots, qwen 2, pushed 1, all
    # installed; the wanted key's 2 misses)
    assert page.goto(f"{server}/").status == 200
    svg = page.locator("svg#hit-rate-chart")
    assert svg.get_attribute("data-chart") == "line"
    fleet_series = svg.locator("g.series[data-series=fleet] circle.point")
    assert [float(y) for y in _data(page, "svg#hit-rate-chart g.series[data-series=fleet] circle.point", "data-y")] \
        == pytest.approx([100.0, 50.0, 100 * 7 / 9])
    assert fleet_series.count() == 3
    hours = [float(x) for x in _data(page, "svg#hit-rate-chart g.series[data-series=fleet] circle.point", "data-x")]
    assert [round(h) for h in hours] == [4, 14, 24]  # bucket middles: 3.5, 13.5, 23.5 h into the window
    series = _data(page, "svg#hit-rate-chart g.series", "data-series")
    assert series[0] == "fleet" and any(s.startswith(LONG_MODEL) for s in series) and any(s.startswith(QWEN) for s in series)
    llama = svg.locator(f'g.series[data-series="{LONG_MODEL} (8192, 1/1/1)"] circle.point')
    assert [float(y) for y in llama.evaluate_all("cs => cs.map(c => c.dataset.y)")] == [100.0, 50.0, 100.0]
    assert int(svg.get_attribute("data-points")) == sum(
        int(n) for n in _data(page, "svg#hit-rate-chart g.series", "data-count"))

    # boot seconds saved: warm boots (at the floor) x (the run's stage seconds - install seconds)
    bars = dict(zip(_data(page, "svg#saved-chart g.bar", "data-label"),
                    (float(v) for v in _data(page, "svg#saved-chart g.bar", "data-value"))))
    llama_saved = 1 * (40.5 + 7.25 - 1.5) + 3 * (38.0 + 7.5 - 1.5)  # run a: 1 boot; run b: b1, c1 (2 ranks), c3
    qwen_saved = 2 * (20.0 + 10.0 - 2.0)
    assert sorted(bars.values(), reverse=True) == [llama_saved, qwen_saved]
    assert next(v for label, v in bars.items() if label.startswith(LONG_MODEL)) == llama_saved
    note = page.locator("#fleet-figures").inner_text()
    assert "Warm boots (installed, and their attestation counts nothing compiled): 7" in note
    assert "1 warm boot(s) installed pushed runs with no stage times" in note

    # wanted engine variants: the llama variant two boots found without warm state
    assert _data(page, "svg#variants-chart g.bar", "data-value") == ["2"]
    assert VARIANT[:8] in _data(page, "svg#variants-chart g.bar", "data-label")[0]

    # a key's history: tuning time and entries per run, oldest first; pin state
    page.goto(f"{server}/history?{httpx.QueryParams(fleet['llama'].model_dump())}")
    assert [float(y) for y in _data(page, "svg#tuning-time-chart circle.point", "data-y")] == [50.0, 47.5]
    entries = [int(float(y)) for y in _data(page, "svg#entries-chart circle.point", "data-y")]
    assert len(entries) == 2 and entries[0] == entries[1] > 0
    assert page.locator("svg#stage-chart circle.point").count() == 4
    assert page.locator(f"#history tr[data-run='{fleet['run_a']}'] .badge.pinned").inner_text() == "pinned"
    assert page.locator(f"#history tr[data-run='{fleet['run_b']}'] .badge.pinned").count() == 0

    # a pushed run's key: no stages to draw, said in words
    page.goto(f"{server}/history?{httpx.QueryParams(fleet['pushed'].model_dump())}")
    assert page.locator("svg#stage-chart").count() == 0
    assert "No stages: pushed run" in page.locator("#no-stages").inner_text()
    page.goto(f"{server}/runs/{fleet['run_p']}")
    assert "No stages: pushed run" in page.locator("#no-stages").inner_text()

    # pin state on the run page
    page.goto(f"{server}/runs/{fleet['run_a']}")
    assert page.locator("h1 #pinned").inner_text() == "pinned" and page.locator("#pin-state").inner_text().startswith("yes")
    page.goto(f"{server}/runs/{fleet['run_b']}")
    assert page.locator("h1 #pinned").count() == 0 and page.locator("#pin-state").inner_text().startswith("no")

    # a job's stages: its run's, one bar each stage that ran
    page.goto(f"{server}/jobs")
    page.locator(f"#jobs tr[data-job='{fleet['job']}'] a", has_text=str(fleet["job"])).click()
    page.wait_for_url(f"{server}/jobs/{fleet['job']}")
    stages = dict(zip(_data(page, "svg#job-stages-chart g.bar", "data-label"),
                      (float(v) for v in _data(page, "svg#job-stages-chart g.bar", "data-value"))))
    assert stages == {"gemm": 38.0, "attention": 7.5}
    assert page.locator("#job-stages tbody tr").count() == 3  # the skipped stage is listed, not drawn
    context.close()


@sqlite_only
def test_the_audit_log_page_opens_for_an_admin_only(browser, fleet, tmp_path):  # noqa: F811
    server = fleet["server"]
    read = as_admin.post(f"{server}/v1/tokens", json={"name": "viewer", "scope": "read"}).json()["token"]
    events = as_admin.get(f"{server}/v1/audit", timeout=30).json()["events"]
    assert len(events) >= 6  # four runs recorded, a pin and a token
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(15_000)

    answer = page.goto(f"{server}/audit")  # a browser sends no bearer header
    assert answer.status == 401 and page.locator("#audit-open").count() == 1
    page.locator("#audit-open").click()
    for token, status in (("", 401), (read, 403)):
        page.goto(f"{server}/audit/open")
        page.fill("#audit-form input[name=token]", token)
        page.evaluate("document.querySelector('#audit-form input[name=token]').required = false")
        with page.expect_response(lambda r: r.url.endswith("/audit") and r.request.method == "POST") as sent:
            page.click("#audit-button")
        assert sent.value.status == status, token
    page.goto(f"{server}/audit/open")
    page.fill("#audit-form input[name=token]", admin_token())
    with page.expect_response(lambda r: r.url.endswith("/audit") and r.request.method == "POST") as sent:
        page.click("#audit-button")
    assert sent.value.status == 200
    shown = page.locator("#audit tbody tr").evaluate_all("rows => rows.map(r => Number(r.dataset.event))")
    assert shown == [e["id"] for e in events]
    assert f"/v1/tunings/{fleet['run_a']}/pin" in page.locator("#audit").inner_text()
    _fits(page, "/audit")

    page.set_extra_http_headers(admin_headers())  # curl's way: a bearer header
    assert page.goto(f"{server}/audit").status == 200
    assert page.locator("#audit tbody tr").count() == len(events)
    after = as_admin.get(f"{server}/v1/audit", timeout=30).json()["events"]
    assert [e["id"] for e in after] == [e["id"] for e in events]  # reading the log wrote nothing
    context.close()


# ---------------------------------------------------------------- without a browser


def _seed_reports(engine, run_ids: dict, count: int, start: int) -> None:
    """``count`` boots' reports over the last day: installed at the floor, still compiling,
    errors, misses and an engine variant without warm state, spread over the keys."""
    environment = file_environment(CUDNN_FILE)
    now = dt.datetime.now(dt.timezone.utc)
    keys = list(run_ids)
    with db.session_factory(engine).begin() as session:
        for n in range(start, start + count):
            key, kind = keys[n % len(keys)], n % 5
            outcome = (ReportOutcome.ERROR, ReportOutcome.MISS)[kind - 3] if kind >= 3 else ReportOutcome.INSTALLED
            fields = {"error_kind": "OSError"} if outcome is ReportOutcome.ERROR else {}
            if outcome is ReportOutcome.INSTALLED:
                fields.update(run_id=run_ids[key], compiled={"triton_kernels": kind})
            if kind == 1:
                fields.update(variant=f"{n % 40:016x}", variant_missing=True)
            reports.record_report(session, PodReportCreate(
                key=key, environment_hash=environment.environment_hash(), outcome=outcome, install_seconds=1.0,
                environment=environment if outcome is ReportOutcome.MISS else None, pod=f"pod-{n}",
                source=ReportSource.PLUGIN, boot_id=f"{n:016x}", **fields), received_at=now - dt.timedelta(minutes=n % 1400))


def test_the_fleet_page_reads_as_many_statements_for_thousands_of_reports_as_for_a_hundred(engine, tmp_path):
    """The pictures' reads are grouped in the database and bounded by the window, its
    buckets and row limits: the fleet page's SQL statements do not grow with the reports or
    the keys (its time: bench/dashboard_fleet.py)."""
    from tests.e2e.test_dashboard import _client, _statements
    from tests.support.builders import make_token

    admin = {"Authorization": f"Bearer {make_token(engine, 'ops', 'admin')}"}
    counts, drawn = [], []
    with _client(engine, tmp_path) as client:
        data = CUDNN_FILE.read_bytes()
        assert client.put(f"/v1/artifacts/{hashlib.sha256(data).hexdigest()}", content=data, headers=admin).status_code == 201
        run_ids = {}
        for count, keys in ((100, 4), (2500, 40)):
            for i in range(len(run_ids), keys):
                key = h200_key(model=f"org/model-{i:03d}")
                payload = run_payload(CUDNN_FILE, key, trigger="cli")
                payload["summary"]["stages"] = _stages(gemm=30.0 + i)
                answer = client.post("/v1/tunings?force=true", json=payload, headers=admin)
                assert answer.status_code == 201, answer.text
                run_ids[key] = answer.json()["id"]
            _seed_reports(engine, run_ids, count, start=0 if count == 100 else 100)
            client.get("/")  # warm: nothing cached differs between the two counts
            counts.append(_statements(engine, client, "/"))
            text = client.get("/").text
            drawn.append([int(n) for n in re.findall(r'data-chart="\w+" data-points="(\d+)"', text)])
    assert counts[0] == counts[1], counts
    assert all(len(d) == 3 and all(d) for d in drawn), drawn  # hit rate, seconds saved, variants: each drawn
    assert drawn[1][2] > drawn[0][2]  # more wanted variants among more reports (at most MAX_BARS bars)
