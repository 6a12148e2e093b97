"""Pod reports against a live ``tunecache serve`` (SQLite and PostgreSQL): ``tunecache pull``
and the Python API report installed / miss with the right fields; ``TUNECACHE_REPORT=0``
sends nothing; a pod whose server refuses or hangs on ``POST /v1/reports`` (a proxy in
front of the real server) still installs, in about the time it takes without reports;
the plugin reports from a vLLM worker through that proxy too; retention deletes old
reports only; the Prometheus metrics; bad reports, big reports and too many reports are
refused with a JSON body naming the problem."""

from __future__ import annotations

import datetime as dt
import http.server
import json
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event, func, select, text

from tests.support.paths import CUDNN_FILE
from tests.support.builders import file_environment, h200_key, stored_reports
from tests.support.cli import MODEL, pull, push
from tests.support.serve import scrape
from tunecache.client import report as reporting
from tunecache.store.http import InstallDeadlineExceeded, ServerError, ServerUnreachable, TunecacheClient
from tunecache.client.install import pull_autotune_file
from tunecache.contract import (
    MAX_REPORT_BYTES,
    EnvironmentMetadata,
    PodReportCreate,
    ReportOutcome,
    ReportSource,
)
from tunecache.service import db, report_retention, reports
from tunecache.service.app import create_app
from tunecache.service.models import PodReport
from tunecache.service.report_intake import BATCH_ROWS, ReportIntake
from tunecache.service.settings import Settings
from tunecache.signing import UntrustedRun, generate_signing_key, load_trusted_keys

POD = socket.gethostname()


def test_pull_reports_installed_and_miss_with_their_fields(server, database_url, tmp_path):
    assert push(server).returncode == 0
    run_id = httpx.get(f"{server}/v1/tunings").json()["items"][0]["id"]
    assert pull(server, tmp_path / "dest").returncode == 0
    other = tmp_path / "other-env.json"
    metadata = json.loads(CUDNN_FILE.read_text())["_metadata"] | {"cudnn_version": "91700"}
    other.write_text(json.dumps(metadata))
    assert pull(server, tmp_path / "dest", other).returncode == 3

    installed, miss = stored_reports(database_url, 2)
    env, other_env = file_environment(CUDNN_FILE), EnvironmentMetadata.from_flashinfer_metadata(metadata)
    key = h200_key(model=MODEL)
    for row in (installed, miss):
        assert (row.model, row.gpu_name, row.max_num_batched_tokens, row.key_hash) == (MODEL, "NVIDIA H200", 8192,
                                                                                    key.key_hash())
        assert (row.source, row.pod, row.rank, row.looked_up) == ("cli", POD, None, True)
        assert 0 < row.install_seconds < 30
    assert (installed.outcome, installed.run_id, installed.environment_hash) == ("installed", run_id, env.environment_hash())
    assert installed.environment is None and installed.differences is None and installed.error_kind is None
    assert (installed.jit_modules, installed.jit_skipped) == (0, 0)
    assert (miss.outcome, miss.run_id, miss.environment_hash) == ("miss", run_id, other_env.environment_hash())
    assert miss.environment == other_env.model_dump()  # a miss says what was wanted
    assert miss.differences == [{"field": "cudnn_version", "stored": "91900", "yours": "91700"}]

    # the Python API reports as "api"; a failed install as an error of its kind
    with TunecacheClient(server) as client:
        pull_autotune_file(client, key, env, tmp_path / "api")
        assert reporting.wait_for_reports(10)
        assert stored_reports(database_url, 3)[-1].source == "api"
        trusted = load_trusted_keys(str(generate_signing_key(tmp_path / "pod-trusts").public_path))
        with pytest.raises(UntrustedRun):  # the stored run is unsigned: nothing installs
            pull_autotune_file(client, key, env, tmp_path / "untrusting", trusted_keys=trusted)
    assert reporting.wait_for_reports(10)
    error = stored_reports(database_url, 4)[-1]
    assert (error.outcome, error.error_kind, error.run_id, error.source) == ("error", "UntrustedRun", None, "api")
    assert not (tmp_path / "untrusting").exists()

    # a server that failed the install (unreachable, too slow, an error status) is not sent a report
    with TunecacheClient(server) as client:
        for failure in (ServerUnreachable("down"), InstallDeadlineExceeded("slow"), ServerError(503, "busy")):
            with pytest.raises(type(failure)), reporting.installing(client, key, env, ReportSource.API):
                raise failure
        with pytest.raises(OSError), reporting.installing(client, key, env, ReportSource.API):
            raise OSError(28, "No space left on device")
    assert reporting.wait_for_reports(10)
    assert [(r.outcome, r.error_kind) for r in stored_reports(database_url, 5)[4:]] == [("error", "OSError")]


def test_no_reports_with_TUNECACHE_REPORT_0(server, database_url, tmp_path, monkeypatch):
    assert push(server).returncode == 0
    monkeypatch.setenv("TUNECACHE_REPORT", "0")
    assert pull(server, tmp_path / "dest").returncode == 0
    with TunecacheClient(server) as client:  # a client made without ClientSettings reads it too
        assert client.reports is False
        pull_autotune_file(client, h200_key(model=MODEL), file_environment(CUDNN_FILE), tmp_path / "api")
    monkeypatch.setenv("TUNECACHE_REPORT", "1")
    assert pull(server, tmp_path / "dest").returncode == 0
    assert [r.source for r in stored_reports(database_url, 1)] == ["cli"]


class ReportsDown:
    """A proxy in front of the real server that forwards everything but ``POST /v1/reports``,
    which it ``hang``s on (reads the report, never answers) or ``drop``s (closes the
    connection without an answer). ``reports_seen`` counts the reports it swallowed."""

    def __init__(self, upstream: str, mode: str):
        self.upstream, self.mode = upstream, mode
        self.reports_seen = 0
        self.release = threading.Event()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _forward(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.command == "POST" and self.path.startswith("/v1/reports"):
                    proxy.reports_seen += 1
                    if proxy.mode == "hang":
                        proxy.release.wait(60)
                    self.close_connection = True
                    return
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length", "connection")}
                answer = httpx.request(self.command, proxy.upstream + self.path, content=body, headers=headers, timeout=30)
                self.send_response(answer.status_code)
                for name, value in answer.headers.items():
                    if name.lower() not in ("content-length", "content-encoding", "transfer-encoding", "connection"):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

            do_GET = do_POST = do_PUT = do_HEAD = do_DELETE = _forward

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


#: What a report may add to an install, at most: its timeout (set for these tests) and slack
#: for a loaded machine.
REPORT_TIMEOUT_S = 1.0
SLACK_S = 1.5


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("mode", ["hang", "drop"])
def test_a_pull_installs_in_about_the_same_time_when_reports_hang_or_fail(server, database_url, tmp_path, monkeypatch,
                                                                          mode):
    assert push(server).returncode == 0
    proxy = ReportsDown(server, mode)
    monkeypatch.setenv("TUNECACHE_REPORT_TIMEOUT", str(REPORT_TIMEOUT_S))
    try:
        times = {}
        for setting in ("0", "1", "0", "1"):  # twice each, the faster counts: the machine is shared
            monkeypatch.setenv("TUNECACHE_REPORT", setting)
            started = time.monotonic()
            pulled = pull(proxy.url, tmp_path / f"dest-{setting}")
            took = time.monotonic() - started
            assert pulled.returncode == 0, pulled.stderr
            assert Path(pulled.stdout.strip()).read_bytes() == CUDNN_FILE.read_bytes()
            times[setting] = min(times.get(setting, took), took)
        assert proxy.reports_seen == 2  # each reporting pull tried, and the proxy swallowed it
        assert times["1"] - times["0"] < REPORT_TIMEOUT_S + SLACK_S, times
    finally:
        proxy.close()
    assert stored_reports(database_url, 0, timeout=0) == []


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_vllm_worker_boots_in_about_the_same_time_when_reports_hang(server, database_url, tmp_path):
    from tests.support.vllm_stand_in import rank_file, run_worker

    assert push(server).returncode == 0
    proxy = ReportsDown(server, "hang")
    try:
        times = {}
        for setting in ("0", "1", "0", "1"):
            started = time.monotonic()
            seen, log = run_worker(tmp_path, TUNECACHE_URL=proxy.url, TUNECACHE_REPORT=setting,
                                   TUNECACHE_REPORT_TIMEOUT=str(REPORT_TIMEOUT_S))
            took = time.monotonic() - started
            assert seen["flashinfer_autotune"] == {"file_present_at_warmup": True, "loadable": True}, log
            assert "tunecache: installed run 1" in log
            times[setting] = min(times.get(setting, took), took)
        assert rank_file(tmp_path, 0).read_bytes() == CUDNN_FILE.read_bytes()
        assert proxy.reports_seen == 2
        assert times["1"] - times["0"] < REPORT_TIMEOUT_S + SLACK_S, times
    finally:
        proxy.close()


def _report(outcome=ReportOutcome.INSTALLED, **fields) -> PodReportCreate:
    env = file_environment(CUDNN_FILE)
    values = dict(key=h200_key(), environment_hash=env.environment_hash(), outcome=outcome, install_seconds=1.5,
                  pod="pod-1", source=ReportSource.PLUGIN, rank=0)
    if outcome is ReportOutcome.INSTALLED:
        values["run_id"] = 1
    return PodReportCreate(**(values | fields))


def test_retention_deletes_old_reports_only(engine):
    sessions = db.session_factory(engine)
    now = dt.datetime.now(dt.timezone.utc)
    ages = {"15 days": dt.timedelta(days=15), "14 days and a minute": dt.timedelta(days=14, minutes=1),
            "13 days": dt.timedelta(days=13), "an hour": dt.timedelta(hours=1), "now": dt.timedelta(0)}
    with sessions.begin() as session:
        ids = {name: reports.record_report(session, _report(pod=name.replace(" ", "-")), received_at=now - age)
               for name, age in ages.items()}
    with sessions.begin() as session:
        deleted = report_retention.prune_reports(session, now - dt.timedelta(days=14))
    with sessions.begin() as session:
        left = set(session.scalars(select(PodReport.id)))
    assert deleted == 2 and left == {ids["13 days"], ids["an hour"], ids["now"]}

    pruner = report_retention.Pruner(interval_s=60)
    assert pruner.due() and not pruner.due()  # at once, then not again within the minute


def test_the_server_deletes_old_reports_after_a_report(server, database_url):
    """Through the live server: the first report a process takes deletes the reports older
    than TUNECACHE_REPORT_RETENTION_DAYS (14), after answering; newer ones stay."""
    engine = db.create_db_engine(database_url)
    sessions = db.session_factory(engine)
    now = dt.datetime.now(dt.timezone.utc)
    try:
        with sessions.begin() as session:
            old = reports.record_report(session, _report(pod="old"), received_at=now - dt.timedelta(days=20))
            kept = reports.record_report(session, _report(pod="kept"), received_at=now - dt.timedelta(days=13))
        answer = httpx.post(f"{server}/v1/reports", content=_report(ReportOutcome.MISS, pod="new").model_dump_json(),
                            headers={"Content-Type": "application/json"}, timeout=30)
        assert answer.status_code == 202 and answer.content == b""
        give_up = time.monotonic() + 15
        while True:
            with sessions.begin() as session:
                pods = dict(session.execute(select(PodReport.id, PodReport.pod)).all())
            if (old not in pods and "new" in pods.values()) or time.monotonic() > give_up:  # stored in a batch
                break
            time.sleep(0.1)
        assert old not in pods and pods[kept] == "kept" and sorted(pods.values()) == ["kept", "new"]
    finally:
        engine.dispose()


def test_reports_feed_the_prometheus_metrics(server):
    before = scrape(server)
    sent = [(ReportOutcome.INSTALLED, 0.3), (ReportOutcome.INSTALLED, 4.0), (ReportOutcome.MISS, 0.2),
            (ReportOutcome.ERROR, 31.0)]
    for outcome, seconds in sent:
        extra = {"error_kind": "ArtifactCorrupt"} if outcome is ReportOutcome.ERROR else {}
        if outcome is ReportOutcome.MISS:
            extra["environment"] = file_environment(CUDNN_FILE)
        body = _report(outcome, install_seconds=seconds, **extra).model_dump_json(exclude_none=True)
        answer = httpx.post(f"{server}/v1/reports", content=body, headers={"Content-Type": "application/json"})
        assert answer.status_code == 202, answer.text
    after = scrape(server)
    for outcome in ReportOutcome:
        mine = [s for o, s in sent if o is outcome]
        delta = lambda name, **labels: after.value(name, outcome=outcome.value, **labels) - before.value(  # noqa: E731
            name, outcome=outcome.value, **labels)
        assert delta("tunecache_pod_reports_total") == len(mine)
        assert delta("tunecache_pod_install_seconds_count") == len(mine)
        assert delta("tunecache_pod_install_seconds_sum") == pytest.approx(sum(mine))
        assert delta("tunecache_pod_install_seconds_bucket", le="1.0") == sum(s <= 1.0 for s in mine)


def _app(engine, tmp_path, **settings) -> TestClient:
    return TestClient(create_app(Settings(database_url=str(engine.url), worker="off", data_dir=tmp_path / "data", **settings),
                                 engine=engine))


def test_bad_and_big_reports_are_refused_naming_why(engine, tmp_path):
    """(Too many reports from one source are no longer refused with 429, they are dropped:
    test_past_its_bound_a_source_is_answered_202_and_not_stored_and_other_sources_are.)"""
    good = json.loads(_report(ReportOutcome.MISS).model_dump_json())
    with _app(engine, tmp_path) as client:
        def refused(body, status=422) -> str:
            answer = client.post("/v1/reports", json=body)
            assert answer.status_code == status, answer.text
            detail = answer.json()["detail"]
            return detail if isinstance(detail, str) else " ".join(f"{e['loc']} {e['msg']}" for e in detail)

        assert "run_id" in refused({**good, "outcome": "installed", "run_id": None})  # installed: which run?
        assert "error_kind" in refused({**good, "outcome": "error", "run_id": None})
        assert "boot_id" in refused({**good, "boot_id": "not a boot"})
        assert "environment_hash" in refused({**good, "environment_hash": "0" * 64,
                                              "environment": file_environment(CUDNN_FILE).model_dump()})
        assert "'install_seconds'" in refused({**good, "install_seconds": -1})
        assert "'outcome'" in refused({**good, "outcome": "maybe"})
        assert "'field'" in refused({**good, "outcome": "miss", "run_id": None,
                                     "differences": [{"field": "../etc", "stored": "a", "yours": "b"}]})
        assert "'token'" in refused({**good, "token": "x"})  # unknown fields are refused
        assert str(MAX_REPORT_BYTES) in refused({**good, "pod": "p" * MAX_REPORT_BYTES}, status=413)
        for _ in range(5):
            assert client.post("/v1/reports", json=good).status_code == 202
    with db.session_factory(engine)() as session:
        assert session.scalar(select(func.count()).select_from(PodReport)) == 5  # nothing refused was stored


def test_reports_need_a_token_only_where_reads_do(engine, tmp_path):
    body = json.loads(_report().model_dump_json())
    with _app(engine, tmp_path, read_token_required=True) as client:
        assert client.post("/v1/reports", json=body).status_code == 401
        from tests.support.builders import make_token

        token = make_token(engine, "pod-fleet", "read")
        assert client.post("/v1/reports", json=body, headers={"Authorization": f"Bearer {token}"}).status_code == 202
        admin = make_token(engine, "ops", "admin")
        audit = client.get("/v1/audit", headers={"Authorization": f"Bearer {admin}"}).json()["events"]
        assert audit == []  # a report is not a write to tunings: not audited


def test_reports_are_stored_in_batches_and_kept_while_the_database_refuses(engine):
    """The intake on the real database: 1,200 reports are stored in three inserts of at most
    BATCH_ROWS; a batch the database refuses (its table renamed away) stays in the intake,
    in order, and is stored once the database takes it again; nothing is stored twice."""
    inserts = []

    @event.listens_for(engine, "before_cursor_execute")
    def count_inserts(conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith("INSERT INTO POD_REPORTS"):
            inserts.append(len(parameters) if executemany else 1)

    intake = ReportIntake(db.session_factory(engine), flush_interval_s=60)
    now = dt.datetime.now(dt.timezone.utc)
    for i in range(1200):
        assert intake.offer(_report(ReportOutcome.MISS, pod=f"pod-{i}"), now)
    while intake.pending():
        assert intake.store_batch()
    assert sum(inserts) == 1200 and len(inserts) == 3 and max(inserts) == BATCH_ROWS

    with engine.begin() as connection:
        connection.execute(text("ALTER TABLE pod_reports RENAME TO pod_reports_away"))
    for i in range(3):
        intake.offer(_report(ReportOutcome.MISS, pod=f"late-{i}"), now)
    assert not intake.store_batch() and intake.pending() == 3
    with engine.begin() as connection:
        connection.execute(text("ALTER TABLE pod_reports_away RENAME TO pod_reports"))
    assert intake.store_batch() and intake.pending() == 0
    with db.session_factory(engine)() as session:
        pods = list(session.scalars(select(PodReport.pod).order_by(PodReport.id)))
    assert len(pods) == 1203 and pods[-3:] == ["late-0", "late-1", "late-2"]
    event.remove(engine, "before_cursor_execute", count_inserts)


def test_a_full_intake_answers_503_and_a_stop_stores_what_it_took(engine, tmp_path):
    """Past TUNECACHE_REPORT_INTAKE_MAX reports not yet stored, POST /v1/reports answers 503
    with Retry-After and takes nothing; what was taken is stored when the process stops."""
    body = json.loads(_report(ReportOutcome.MISS).model_dump_json())
    with _app(engine, tmp_path, report_intake_max=2, report_flush_seconds=60) as client:
        assert [client.post("/v1/reports", json=body).status_code for _ in range(2)] == [202, 202]
        full = client.post("/v1/reports", json=body)
        assert full.status_code == 503 and int(full.headers["Retry-After"]) >= 1
        assert "waiting to be stored" in full.json()["detail"]
        with db.session_factory(engine)() as session:
            assert session.scalar(select(func.count()).select_from(PodReport)) == 0  # not stored yet (60 s)
    with db.session_factory(engine)() as session:
        assert session.scalar(select(func.count()).select_from(PodReport)) == 2


# --- hostile clients: reports cannot rewrite the fleet view ------------------------------------


def _tuned(engine, key=None) -> int:
    """Record a current run of CUDNN_FILE for ``key`` (h200_key()); returns its id."""
    from tests.support.builders import run_payload, store_file
    from tunecache.contract import TuningRunCreate
    from tunecache.service import publishing

    with db.session_factory(engine).begin() as session:
        store_file(session, CUDNN_FILE)
        return publishing.record_run(session, TuningRunCreate.model_validate(run_payload(CUDNN_FILE, key or h200_key()))).id


def _fleet(engine, **page):
    with db.session_factory(engine).begin() as session:
        return reports.fleet_view(session, 24, **page)


def _send(client, report: PodReportCreate, token: str | None = None):
    answer = client.post("/v1/reports", content=report.model_dump_json(exclude_none=True),
                         headers={"Content-Type": "application/json",
                                  **({"Authorization": f"Bearer {token}"} if token else {})})
    assert answer.status_code == 202, answer.text
    return answer


def _miss(key, pod: str, **fields) -> PodReportCreate:
    env = file_environment(CUDNN_FILE)
    return _report(ReportOutcome.MISS, key=key, environment=env, pod=pod, **fields)


def _dropped(reason: str) -> float:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value("tunecache_pod_reports_dropped_total", {"reason": reason}) or 0.0


def test_a_pod_boot_counts_once_however_often_and_from_however_many_ranks_it_reports(engine, tmp_path):
    """Boot A reports its install from 4 ranks and repeats one; boot B twice; boot C misses
    three times: the matrix counts 3 boots (2 installed, 1 missed). Two reports of an old
    client (no boot_id) count one each, as before."""
    run_id = _tuned(engine)
    key = h200_key()
    with _app(engine, tmp_path) as client:
        for rank in (0, 1, 2, 3, 0):
            _send(client, _report(run_id=run_id, pod="pod-a", rank=rank, boot_id="boot-aaaaaaaa"))
        for _ in range(2):
            _send(client, _report(run_id=run_id, pod="pod-b", boot_id="boot-bbbbbbbb"))
        for _ in range(3):
            _send(client, _miss(key, "pod-c", boot_id="boot-cccccccc"))
    [row] = _fleet(engine).keys
    assert (row.reports, row.installed, row.missed, row.hit_rate) == (3, 2, 1, pytest.approx(2 / 3))
    with db.session_factory(engine)() as session:
        assert session.scalar(select(func.count()).select_from(PodReport)) == 4 + 1 + 1  # exact repeats not stored

    with _app(engine, tmp_path) as client:
        for _ in range(2):
            _send(client, _report(run_id=run_id, pod="old-client"))
    [row] = _fleet(engine).keys
    assert (row.reports, row.installed, row.missed) == (5, 4, 1)


def test_made_up_installed_reports_do_not_move_a_keys_hit_rate(engine, tmp_path):
    """A key never tuned has a hit rate of 0: installed reports naming a run that does not
    exist, or another key's run, are answered 202 and not counted (a metric says so); a real
    install of the tuned key is counted."""
    run_id = _tuned(engine)
    never = h200_key(model="never/tuned")
    before = _dropped("unknown_run")
    with _app(engine, tmp_path) as client:
        _send(client, _miss(never, "real-pod", boot_id="boot-real0000"))
        for i in range(30):
            _send(client, _report(key=never, run_id=run_id, pod=f"fake-{i}", boot_id=f"boot-fake{i:04d}"))
            _send(client, _report(key=never, run_id=run_id + 1000, pod=f"fake-{i}", boot_id=f"boot-fake{i:04d}"))
        _send(client, _report(run_id=run_id, pod="real-pod", boot_id="boot-real0000"))
    rows = {row.key.model: row for row in _fleet(engine).keys}
    assert (rows["never/tuned"].installed, rows["never/tuned"].hit_rate) == (0, 0.0)
    assert (rows[h200_key().model].installed, rows[h200_key().model].hit_rate) == (1, 1.0)
    assert _dropped("unknown_run") - before == 60


def test_one_source_cannot_make_a_key_look_wanted_by_a_fleet(engine, tmp_path):
    """One token sends misses of one key from 40 made-up pods: at most
    TUNECACHE_REPORT_BOOTS_PER_KEY (5) of them count; two other sources' pods count too; the
    wanted list says 3 sources asked."""
    from tests.support.builders import make_token

    key = h200_key(model="made/up")
    flooder, a, b = (make_token(engine, name, "read") for name in ("flooder", "team-a", "team-b"))
    with _app(engine, tmp_path, report_boots_per_key=5) as client:
        for i in range(40):
            _send(client, _miss(key, f"fake-{i}", boot_id=f"boot-fake{i:04d}"), flooder)
        _send(client, _miss(key, "pod-a", boot_id="boot-a0000000"), a)
        _send(client, _miss(key, "pod-b", boot_id="boot-b0000000"), b)
    [wanted] = _fleet(engine).wanted
    assert (wanted.pods, wanted.sources) == (7, 3)
    [row] = _fleet(engine).keys
    assert row.missed == 7


def test_a_flood_of_made_up_keys_leaves_the_fleet_view_bounded(engine, tmp_path):
    """One address reports misses of 300 made-up keys: at most TUNECACHE_REPORT_NEW_KEYS (10)
    keys without a tuning reach the fleet view from it; a tuned key's reports and another
    source's new key still do."""
    from tests.support.builders import make_token

    _tuned(engine)
    other = make_token(engine, "other-cluster", "read")
    before = _dropped("new_key")
    with _app(engine, tmp_path, report_new_keys=10) as client:
        for i in range(300):
            _send(client, _miss(h200_key(model=f"fake/model-{i}"), f"pod-{i}", boot_id=f"boot-{i:08d}"))
        _send(client, _miss(h200_key(), "pod-tuned", boot_id="boot-tuned000"))
        _send(client, _miss(h200_key(model="real/new"), "pod-real", boot_id="boot-realnew0"), other)
    view = _fleet(engine, limit=1000, wanted_limit=1000)
    assert view.total_keys == 10 + 1 + 1 and view.total_wanted == 10 + 1  # the tuned key is not wanted
    assert "real/new" in {k.key.model for k in view.keys}
    assert _dropped("new_key") - before == 290


def test_past_its_bound_a_source_is_answered_202_and_not_stored_and_other_sources_are(engine, tmp_path):
    """TUNECACHE_REPORT_SOURCE_MAX (5) reports per source and window are stored; the rest
    are answered 202 (never 429: a pod behind the same address is not refused) and counted
    in tunecache_pod_reports_dropped_total{reason="source"}. A pod with its own token behind
    the same address, and another address, are sources of their own."""
    from tests.support.builders import make_token

    key = h200_key(model="some/model")
    token = make_token(engine, "real-pods", "read")
    before = _dropped("source")
    with _app(engine, tmp_path, report_source_max=5) as client:
        for i in range(20):
            _send(client, _miss(key, f"flood-{i}"))
        _send(client, _miss(key, "real-pod"), token)
    with TestClient(create_app(Settings(database_url=str(engine.url), worker="off", data_dir=tmp_path / "data",
                                        report_source_max=5), engine=engine), client=("10.1.2.3", 40000)) as client:
        _send(client, _miss(key, "elsewhere"))
    with db.session_factory(engine)() as session:
        pods = set(session.scalars(select(PodReport.pod)))
    assert len(pods) == 7 and {"real-pod", "elsewhere"} <= pods
    assert _dropped("source") - before == 15


def _post_reports(server: str, reports: list[PodReportCreate], source: str = "127.0.0.1", token: str | None = None,
                  forwarded_for: str | None = None) -> None:
    """Send ``reports`` from local address ``source``, each with ``X-Forwarded-For:
    <forwarded_for>.<n>`` when given (n = its position)."""
    with httpx.Client(transport=httpx.HTTPTransport(local_address=source), timeout=5) as client:
        for n, report in enumerate(reports):
            headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {}),
                       **({"X-Forwarded-For": f"{forwarded_for}.{n}"} if forwarded_for else {})}
            answer = client.post(f"{server}/v1/reports", content=report.model_dump_json(exclude_none=True),
                                 headers=headers)
            assert answer.status_code == 202, answer.text


def _misses(prefix: str, count: int, **fields) -> list[PodReportCreate]:
    return [_miss(h200_key(model="org/forwarded"), f"{prefix}-{n}", boot_id=f"boot-{prefix}-{n:04d}", **fields)
            for n in range(count)]


def test_x_forwarded_for_is_believed_only_from_a_named_proxy(engine, database_url, tmp_path):
    """A process on the service's machine writes a new ``X-Forwarded-For`` into each report:
    without ``TUNECACHE_TRUSTED_PROXIES`` (the default) every report's source is 127.0.0.1;
    with the proxy 127.0.0.2 named, what it forwards is believed, and the same header sent
    around it from 127.0.0.1 still is not."""
    from tests.support.serve import start_server, stop_server

    process, server = start_server(database_url, tmp_path, "direct", TUNECACHE_REPORT_FLUSH_SECONDS="0.1")
    try:
        _post_reports(server, _misses("direct", 3), forwarded_for="10.9.0")
        assert [row.sender for row in stored_reports(database_url, 3)] == ["127.0.0.1"] * 3
    finally:
        stop_server(process)
    process, server = start_server(database_url, tmp_path, "proxied", TUNECACHE_REPORT_FLUSH_SECONDS="0.1",
                                   TUNECACHE_TRUSTED_PROXIES="127.0.0.2")
    try:
        _post_reports(server, _misses("proxied", 3), source="127.0.0.2", forwarded_for="10.9.1")
        _post_reports(server, _misses("around", 2), forwarded_for="10.9.2")
        senders = [row.sender for row in stored_reports(database_url, 8)[3:]]
    finally:
        stop_server(process)
    assert senders == ["10.9.1.0", "10.9.1.1", "10.9.1.2", "127.0.0.1", "127.0.0.1"]


def _wait_for(condition, timeout: float = 15.0):
    give_up = time.monotonic() + timeout
    while not (found := condition()):
        assert time.monotonic() < give_up, "timed out"
        time.sleep(0.1)
    return found


def test_auto_tune_is_driven_by_distinct_tokens_only(engine, database_url, tmp_path):
    """A live service with ``TUNECACHE_AUTO_TUNE_VARIANTS=3``: 20 anonymous reports of a
    variant missing, each with another forged ``X-Forwarded-For``, queue nothing (each
    counted as refused, ``anonymous``); two tokens' reports queue nothing (refused,
    ``tokens``, on the fleet view); a third token's, with other engine arguments sent last,
    queues one vLLM warmup with the arguments the first two agree on."""
    from tests.support.builders import make_token
    from tests.support.serve import start_server, stop_server
    from tunecache.service import jobs

    variant, honest, forged = "cd" * 8, {"max_model_len": 8192}, {"max_model_len": 4096, "enforce_eager": True}
    missing = {"variant": variant, "variant_missing": True}
    a, b, c = (make_token(engine, name, "read") for name in ("pods-a", "pods-b", "pods-c"))

    def queued():
        with db.session_factory(engine)() as session:
            return jobs.list_jobs(session).items

    process, server = start_server(database_url, tmp_path, "auto", TUNECACHE_REPORT_FLUSH_SECONDS="0.1",
                                   TUNECACHE_AUTO_TUNE_VARIANTS="3")
    try:
        _post_reports(server, _misses("anon", 20, engine_args=forged, **missing), forwarded_for="10.8.0")
        _wait_for(lambda: scrape(server).value("tunecache_auto_tune_refused_total", reason="anonymous") == 20)
        _post_reports(server, _misses("a", 2, engine_args=honest, **missing), token=a)
        _post_reports(server, _misses("b", 1, engine_args=honest, **missing), token=b)
        view = _wait_for(lambda: (v := httpx.get(f"{server}/v1/fleet").json())["auto_tune_refused"].get("tokens") and v)
        [entry] = view["wanted_variants"]
        assert entry["variant"] == variant and entry["auto_tune_refused"]["tokens"] >= 1
        assert queued() == []
        _post_reports(server, _misses("c", 3, engine_args=forged, **missing), token=c)
        [job] = _wait_for(queued)
    finally:
        stop_server(process)
    assert job.warmup == "vllm" and job.engine_args == honest and job.status == "queued"
