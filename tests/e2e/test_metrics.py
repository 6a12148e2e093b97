"""``GET /metrics`` against real ``tunecache serve`` processes: lookups by outcome and source,
artifact bytes (a 304 adds none), requests by route template, job gauges read from the
database (SQLite and PostgreSQL), job and stage durations from the worker, two server
processes that report one sum whichever answers the scrape, and the Grafana dashboard's
expressions against what a live server exports. Expositions are read with
``prometheus_client.parser``."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from prometheus_client import REGISTRY
from prometheus_client.multiprocess import MultiProcessCollector
from sqlalchemy import text, update
from sqlalchemy.exc import OperationalError

from tests.support.cli import tunecache_executable
from tests.support.paths import CUDNN_FILE
from tests.support.serve import Scrape, as_admin, free_port, scrape
from tests.support.builders import file_environment, h200_key, run_payload
from tunecache.contract import ArtifactCreate, ArtifactKind, JobStatus, StageChanged, TuningJobCreate
from tunecache.service import db, jobs, metrics
from tunecache.service.models import TuningJob
from tunecache.service.tuner.process import TunerFailed, TunerResult
from tunecache.service.worker import GpuIdentity, JobWorker
from tests.support.paths import ROOT

DASHBOARD = ROOT / "deploy" / "grafana-dashboard.json"
H200 = GpuIdentity("NVIDIA H200", "sm90")
LOOKUP_ROUTE = {"method": "POST", "route": "/v1/tunings/lookup"}
ARTIFACT_ROUTE = {"method": "GET", "route": "/v1/artifacts/{sha256}"}


def _lookup_body(**key_fields) -> dict:
    return {"key": h200_key(**key_fields).model_dump(), "environment": run_payload(CUDNN_FILE)["environment"]}


def _push(server: str) -> str:
    """Upload the H200 file and record it as the current tuning (admin token); its sha256."""
    data = CUDNN_FILE.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    assert as_admin.put(f"{server}/v1/artifacts/{sha}", content=data, timeout=30).status_code in (200, 201)
    recorded = as_admin.post(f"{server}/v1/tunings", json=run_payload(CUDNN_FILE), timeout=30)
    assert recorded.status_code == 201, recorded.text
    return sha


def test_lookups_artifact_bytes_and_requests_are_counted(server):
    sha = _push(server)
    size = CUDNN_FILE.stat().st_size
    before = scrape(server)  # no token: reads are open, and so is /metrics

    hit, miss = _lookup_body(), _lookup_body(model="org/never-tuned")
    statuses = [httpx.post(f"{server}/v1/tunings/lookup", json=body, timeout=30).status_code
                for body in (hit, hit, miss, miss)]
    assert statuses == [200, 200, 404, 404]
    after_lookups = scrape(server)
    delta = {(outcome, source): after_lookups.value("tunecache_lookups_total", outcome=outcome, source=source)
             - before.value("tunecache_lookups_total", outcome=outcome, source=source)
             for outcome in ("hit", "miss", "error") for source in ("cache", "database")}
    # the first of each is computed from the database, the second answered from the process's cache
    assert delta == {("hit", "database"): 1, ("hit", "cache"): 1, ("miss", "database"): 1, ("miss", "cache"): 1,
                     ("error", "database"): 0, ("error", "cache"): 0}
    for status in ("200", "404"):
        counted = (after_lookups.value("tunecache_http_requests_total", **LOOKUP_ROUTE, status=status)
                   - before.value("tunecache_http_requests_total", **LOOKUP_ROUTE, status=status))
        assert counted == 2, status

    url = f"{server}/v1/artifacts/{sha}"
    bytes_served = lambda s: s.value("tunecache_artifact_bytes_served_total")  # noqa: E731
    first = httpx.get(url, timeout=30)  # mirrored from the database, sent from its file
    second = httpx.get(url, timeout=30)  # from memory
    assert first.content == second.content == CUDNN_FILE.read_bytes()
    after_gets = scrape(server)
    assert bytes_served(after_gets) - bytes_served(after_lookups) == 2 * size

    not_modified = httpx.get(url, headers={"If-None-Match": f'"{sha}"'}, timeout=30)
    assert not_modified.status_code == 304
    after_304 = scrape(server)
    assert bytes_served(after_304) == bytes_served(after_gets)  # a 304 sends no bytes
    assert (after_304.value("tunecache_http_requests_total", **ARTIFACT_ROUTE, status="304")
            - after_gets.value("tunecache_http_requests_total", **ARTIFACT_ROUTE, status="304")) == 1

    ranged = httpx.get(url, headers={"Range": "bytes=100-1099"}, timeout=30)
    assert ranged.status_code == 206 and len(ranged.content) == 1000
    unknown = httpx.get(f"{server}/v1/artifacts/{'0' * 64}", timeout=30)
    assert unknown.status_code == 404
    after_range = scrape(server)
    assert bytes_served(after_range) - bytes_served(after_304) == 1000
    assert (after_range.value("tunecache_http_requests_total", **ARTIFACT_ROUTE, status="404")
            - after_304.value("tunecache_http_requests_total", **ARTIFACT_ROUTE, status="404")) == 1

    # only counts: no artifact digest, model, path or token name in any label
    for secret in (sha, "org/never-tuned", h200_key().model, "test-admin", "admin.token"):
        assert secret not in after_range.text
    routes = {dict(labels)["route"] for name, labels in after_range.samples if name == "tunecache_http_requests_total"}
    assert routes <= {"/v1/tunings/lookup", "/v1/tunings", "/v1/artifacts/{sha256}", "/v1/health", "/metrics",
                      metrics.UNROUTED}, routes


def test_unrouted_answers_are_counted_without_their_path(server):
    before = scrape(server)
    assert httpx.get(f"{server}/no/such/path/model-x", timeout=30).status_code == 404
    after = scrape(server)
    labels = {"method": "GET", "route": metrics.UNROUTED, "status": "404"}
    assert after.value("tunecache_http_requests_total", **labels) - before.value("tunecache_http_requests_total", **labels) == 1
    assert "model-x" not in after.text


def _set_status(database_url: str, job_id: int, status: JobStatus) -> None:
    engine = db.create_db_engine(database_url)
    try:
        with engine.begin() as connection:
            connection.execute(update(TuningJob).where(TuningJob.id == job_id).values(status=status.value))
    finally:
        engine.dispose()


def test_job_gauges_are_read_from_the_database(server, database_url):
    ids = []
    for tokens in (1024, 2048, 4096):
        answer = as_admin.post(f"{server}/v1/tuning-jobs", json={"key": h200_key(max_num_batched_tokens=tokens).model_dump()},
                               timeout=30)
        assert answer.status_code == 202, answer.text
        ids.append(answer.json()["id"])
    queued = scrape(server)
    assert queued.value("tunecache_database_up") == 1
    assert queued.value("tunecache_jobs", state="queued") == 3
    assert queued.value("tunecache_job_queue_depth") == 3
    assert 0 <= queued.value("tunecache_job_oldest_queued_seconds") < 600

    # written by something else than this process (another replica, a worker): the scrape sees it
    _set_status(database_url, ids[0], JobStatus.RUNNING)
    _set_status(database_url, ids[1], JobStatus.FAILED)
    moved = scrape(server)
    by_state = {state.value: moved.value("tunecache_jobs", state=state.value) for state in JobStatus}
    assert by_state == {**{state.value: 0 for state in JobStatus}, "queued": 1, "running": 1, "failed": 1}
    assert moved.value("tunecache_job_queue_depth") == 1
    _set_status(database_url, ids[2], JobStatus.SUCCEEDED)
    emptied = scrape(server)
    assert emptied.value("tunecache_job_queue_depth") == 0 and emptied.value("tunecache_job_oldest_queued_seconds") == 0
    assert emptied.value("tunecache_jobs", state="succeeded") == 1


def test_the_job_queries_are_served_by_the_status_index(engine):
    """The scrape's two queries read the ``(status, created_at)`` index, not the table."""
    with engine.begin() as connection:
        for statement in (metrics.JOBS_BY_STATE, metrics.OLDEST_QUEUED):
            sql = str(statement.compile(dialect=engine.dialect, compile_kwargs={"literal_binds": True}))
            if engine.dialect.name == "sqlite":
                plan = " ".join(str(row[-1]) for row in connection.execute(text(f"EXPLAIN QUERY PLAN {sql}")))
                assert "COVERING INDEX ix_tuning_jobs_status_created" in plan, plan
            else:  # an empty table is read sequentially; with that ruled out, the index answers alone
                connection.execute(text("SET LOCAL enable_seqscan = off"))
                plan = " ".join(row[0] for row in connection.execute(text(f"EXPLAIN {sql}")))
                assert "Index Only Scan using ix_tuning_jobs_status_created" in plan, plan


def test_the_scrape_is_served_when_the_database_is_not():
    """Lookup errors matter most when the database is down: the counters are still served,
    with ``tunecache_database_up 0`` and no job gauges."""

    class Unreachable:
        def begin(self):
            raise OperationalError("SELECT status, count(*) ...", {}, ConnectionRefusedError("connection refused"))

    exposition = Scrape(metrics.exposition(Unreachable()).decode())
    assert exposition.value("tunecache_database_up") == 0
    assert "tunecache_jobs" not in exposition.names() and "tunecache_lookups_total" in exposition.names()


def _stand_in_tuner(stages: dict[str, float]):
    """Reports each stage done after the given seconds, then returns the real H200 file."""

    def tune(spec, work_dir, timeout_s, on_event, **_):
        for stage, seconds in stages.items():
            on_event(StageChanged(stage=stage, status="running"))
            on_event(StageChanged(stage=stage, status="done", seconds=seconds))
        on_event(StageChanged(stage="moe", status="skipped", reason="no experts"))
        path = work_dir / "autotune.json"
        path.write_bytes(CUDNN_FILE.read_bytes())
        artifact = ArtifactCreate(kind=ArtifactKind.FLASHINFER_AUTOTUNE, name="autotune.json",
                                  media_type="application/json", sha256=hashlib.sha256(path.read_bytes()).hexdigest())
        return TunerResult(gpu_name=H200.gpu_name, arch=H200.arch, environment=file_environment(CUDNN_FILE),
                           summary={"entries": 42, "tuning_seconds": sum(stages.values()), "stages": {}},
                           artifacts=[(artifact, path)])

    return tune


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_worker_records_job_and_stage_durations(engine):
    sessions = db.session_factory(engine)

    def enqueue(tokens: int) -> None:
        with sessions.begin() as session:
            jobs.enqueue(session, TuningJobCreate(key=h200_key(max_num_batched_tokens=tokens), hf_config={"model_type": "llama", "hidden_size": 1}))

    def failing(spec, work_dir, timeout_s, on_event, **_):
        on_event(StageChanged(stage="gemm", status="running"))
        raise TunerFailed("tuner process died with signal SIGSEGV", "Segmentation fault")

    names = ("tunecache_job_duration_seconds_count", "tunecache_job_stage_duration_seconds_sum",
             "tunecache_job_stage_duration_seconds_count")
    before = {(name, label): _sample(name, **{key: label})
              for name in names for key, label in [("outcome", "succeeded"), ("outcome", "failed"), ("stage", "gemm"),
                                                   ("stage", "attention"), ("stage", "moe")]}
    enqueue(1024)
    assert JobWorker(sessions, H200, "w", tuner=_stand_in_tuner({"gemm": 2.5, "attention": 1.25})).run_once()
    enqueue(2048)
    assert JobWorker(sessions, H200, "w", tuner=failing).run_once()

    def delta(name: str, **labels: str) -> float:
        ((key, label),) = labels.items()
        return _sample(name, **labels) - before[(name, label)]

    assert delta("tunecache_job_duration_seconds_count", outcome="succeeded") == 1
    assert delta("tunecache_job_duration_seconds_count", outcome="failed") == 1
    assert delta("tunecache_job_stage_duration_seconds_sum", stage="gemm") == pytest.approx(2.5)
    assert delta("tunecache_job_stage_duration_seconds_sum", stage="attention") == pytest.approx(1.25)
    assert delta("tunecache_job_stage_duration_seconds_count", stage="moe") == 0  # skipped: not a duration
    assert _sample("tunecache_job_stage_duration_seconds_bucket", stage="gemm", le="1.0") < \
        _sample("tunecache_job_stage_duration_seconds_bucket", stage="gemm", le="5.0")


def _start_two_processes(database_url: str, tmp_path: Path) -> tuple[subprocess.Popen, str, Path]:
    """``tunecache serve --workers 2``, its temporary directory under ``tmp_path/tmp``."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    port = free_port()
    log = open(tmp_path / "serve.log", "w")
    env = {k: v for k, v in os.environ.items() if k != metrics.MULTIPROC_DIR_VARIABLE}
    process = subprocess.Popen(
        [tunecache_executable(), "serve", "--port", str(port), "--database", database_url, "--workers", "2"],
        stdout=log, stderr=log, env={**env, "TUNECACHE_WORKER": "off", "TMPDIR": str(temp)},
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{url}/v1/health", timeout=1).status_code == 200:
                return process, url, temp
        except httpx.TransportError:
            pass
        assert process.poll() is None, (tmp_path / "serve.log").read_text()
        time.sleep(0.1)
    process.terminate()
    pytest.fail((tmp_path / "serve.log").read_text())


def _lookups_per_process(directory: Path) -> Counter:
    """Lookups each process counted, read from its own file in the multiprocess directory."""
    counts: Counter = Counter()
    for path in directory.glob("counter_*.db"):
        for family in MultiProcessCollector.merge([str(path)], accumulate=False):
            for sample in family.samples:
                if sample.name == "tunecache_lookups_total":
                    counts[path.stem] += sample.value
    return counts


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_two_processes_report_every_lookup_whichever_answers_the_scrape(database_url, tmp_path):
    process, server, temp = _start_two_processes(database_url, tmp_path)
    try:
        (directory,) = temp.glob("tunecache-metrics-*")  # made by serve for its processes
        _push(server)
        body = _lookup_body()
        sent = 0
        with httpx.Client(limits=httpx.Limits(max_keepalive_connections=0)) as client, ThreadPoolExecutor(16) as pool:
            # until both processes have answered lookups (the kernel hands each connection to one)
            while len([c for c in _lookups_per_process(directory).values() if c]) < 2:
                assert sent < 4000, _lookups_per_process(directory)
                statuses = list(pool.map(lambda _: client.post(f"{server}/v1/tunings/lookup", json=body,
                                                               timeout=30).status_code, range(100)))
                assert statuses == [200] * 100
                sent += 100
        per_process = _lookups_per_process(directory)
        assert sum(per_process.values()) == sent and len([c for c in per_process.values() if c]) == 2, per_process
        for _ in range(8):  # a new connection each: either process may answer
            seen = scrape(server)
            assert seen.total("tunecache_lookups_total") == sent
            assert seen.total("tunecache_lookups_total", outcome="hit") == sent
            assert seen.value("tunecache_http_requests_total", **LOOKUP_ROUTE, status="200") == sent
            assert seen.value("tunecache_job_worker_enabled") == 0
            assert seen.value("tunecache_database_up") == 1
    finally:
        process.terminate()
        process.wait(timeout=60)
    assert not directory.exists(), "serve leaves its multiprocess directory behind"


#: PromQL words that are not metric names.
_PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "offset", "bool"}


def promql_metric_names(expression: str) -> set[str]:
    """Metric names an expression selects: identifiers outside label matchers, ranges,
    groupings and strings that are not function calls or PromQL keywords."""
    bare = re.sub(r'"(?:[^"\\]|\\.)*"', "", expression)
    bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", bare)
    bare = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", bare)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", bare):
        if re.match(r"\s*\(", bare[match.end():]) or match.group() in _PROMQL_WORDS:
            continue  # a function or an aggregation
        names.add(match.group())
    return names


def test_promql_metric_names_finds_the_selected_metrics():
    assert promql_metric_names('histogram_quantile(0.95, sum by (le) (increase(a_bucket{job=~"$job",x="y z"}[6h])))') == {
        "a_bucket"}
    assert promql_metric_names("sum(rate(a_total[5m])) by (route) / on (route) b_total") == {"a_total", "b_total"}


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_grafana_dashboard_uses_only_metrics_the_service_exports(server):
    dashboard = json.loads(DASHBOARD.read_text())
    exported = scrape(server).names()

    def panels(items):
        for panel in items:
            yield panel
            yield from panels(panel.get("panels", []))  # rows

    expressions = [target["expr"] for panel in panels(dashboard["panels"]) for target in panel.get("targets", [])]
    assert expressions
    used = set()
    for expression in expressions:
        names = promql_metric_names(expression)
        assert names, f"names no metric: {expression}"
        assert names <= exported, f"{expression}: {sorted(names - exported)} not exported"
        used |= names
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            metric = re.fullmatch(r"label_values\((\w+),\s*\w+\)", variable["definition"]).group(1)
            assert metric in exported, variable
    # what the dashboard is for: lookups, artifacts, HTTP errors, jobs, queue, durations
    assert {"tunecache_lookups_total", "tunecache_artifact_bytes_served_total", "tunecache_http_requests_total",
            "tunecache_jobs", "tunecache_job_queue_depth", "tunecache_job_duration_seconds_bucket"} <= used
    ids = [panel["id"] for panel in panels(dashboard["panels"])]
    assert len(ids) == len(set(ids))
