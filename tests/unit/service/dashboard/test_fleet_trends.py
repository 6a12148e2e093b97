"""What the fleet's pictures read (tunecache.service.fleet_trends), on SQLite and PostgreSQL:
boots per bucket of the window, and the boot seconds warm boots saved."""

from __future__ import annotations

import datetime as dt
import hashlib
import io

import pytest

from tests.support.builders import file_environment, h200_key, run_payload
from tests.support.paths import CUDNN_FILE
from tunecache.contract import PodReportCreate, ReportOutcome, ReportSource, TuningRunCreate
from tunecache.service import db, fleet_trends, publishing, reports
from tunecache.service.blobs import store_blob

NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.timezone.utc)
SINCE = NOW - dt.timedelta(hours=24)
ENVIRONMENT = file_environment(CUDNN_FILE)
FLOOR = {"triton_kernels": 0}


def _report(key, outcome, boot, run_id=None, compiled=None, seconds=2.0, **fields) -> PodReportCreate:
    if outcome is ReportOutcome.ERROR:
        fields["error_kind"] = "OSError"
    return PodReportCreate(key=key, environment_hash=ENVIRONMENT.environment_hash(), outcome=outcome, run_id=run_id,
                           install_seconds=seconds, pod=f"pod-{boot}", source=ReportSource.PLUGIN,
                           boot_id=boot.rjust(16, "0") if boot else None, compiled=compiled, **fields)


def _seed(engine, rows) -> None:
    with db.session_factory(engine).begin() as session:
        for hours_ago, report in rows:
            reports.record_report(session, report, received_at=NOW - dt.timedelta(hours=hours_ago))


def test_boots_per_bucket_for_the_fleet_and_each_key(engine):
    a, b = h200_key(model="org/a"), h200_key(model="org/b")
    _seed(engine, [
        (23.5, _report(a, ReportOutcome.INSTALLED, "1", run_id=1)),
        (23.5, _report(a, ReportOutcome.INSTALLED, "1", run_id=1, rank=1)),  # the same boot: counted once
        (12.0, _report(a, ReportOutcome.ERROR, "2")),  # on a bucket's edge: the later bucket
        (12.0, _report(b, ReportOutcome.MISS, "")),  # no boot id: a boot of its own
        (12.0, _report(b, ReportOutcome.MISS, "")),
        (0.1, _report(b, ReportOutcome.INSTALLED, "3", run_id=2)),
        (25.0, _report(a, ReportOutcome.INSTALLED, "4", run_id=1)),  # before the window
    ])
    with db.session_factory(engine).begin() as session:
        trend = fleet_trends.hit_rate_over_time(session, SINCE, NOW, [b.key_hash(), a.key_hash()])
    assert len(trend.fleet) == fleet_trends.BUCKETS
    assert {i: bucket.boots for i, bucket in enumerate(trend.fleet) if bucket.boots} == {
        0: {"installed": 1}, 12: {"error": 1, "miss": 2}, 23: {"installed": 1}}
    assert [trend.fleet[i].hit_rate for i in (0, 12, 23)] == [1.0, 0.0, 1.0] and trend.fleet[5].hit_rate is None
    assert list(trend.keys) == [b.key_hash(), a.key_hash()]
    assert {i: x.boots for i, x in enumerate(trend.keys[a.key_hash()]) if x.boots} == {0: {"installed": 1}, 12: {"error": 1}}
    assert trend.fleet[12].start == SINCE + dt.timedelta(hours=12)


def test_warm_boots_save_their_runs_cold_tuning_less_their_install(engine):
    a, b, pushed = h200_key(model="org/a"), h200_key(model="org/b"), h200_key(model="org/pushed")
    runs = {}
    data = CUDNN_FILE.read_bytes()
    with db.session_factory(engine).begin() as session:
        store_blob(session, io.BytesIO(data), hashlib.sha256(data).hexdigest())
        for key, stages in ((a, {"gemm": 30.0, "attention": 10.0}), (b, {"gemm": 1.0}), (pushed, None)):
            body = run_payload(CUDNN_FILE, key, trigger="cli" if stages else "upload")
            if stages:
                body["summary"]["stages"] = {name: {"status": "done", "seconds": s} for name, s in stages.items()}
                body["summary"]["stages"]["moe"] = {"status": "skipped", "reason": "dense"}
            runs[key.model] = publishing.record_run(session, TuningRunCreate.model_validate(body), force=True).id
    _seed(engine, [
        (1, _report(a, ReportOutcome.INSTALLED, "1", runs["org/a"], FLOOR, seconds=2.0)),
        (1, _report(a, ReportOutcome.INSTALLED, "1", runs["org/a"], FLOOR, seconds=2.0, rank=1)),  # one boot
        (2, _report(a, ReportOutcome.INSTALLED, "2", runs["org/a"], FLOOR, seconds=4.0)),
        (2, _report(a, ReportOutcome.INSTALLED, "3", runs["org/a"], {"triton_kernels": 2})),  # still compiled: not warm
        (2, _report(a, ReportOutcome.INSTALLED, "4", runs["org/a"])),  # no attestation: not counted
        (30, _report(a, ReportOutcome.INSTALLED, "5", runs["org/a"], FLOOR)),  # before the window
        (3, _report(b, ReportOutcome.INSTALLED, "6", runs["org/b"], FLOOR, seconds=5.0)),  # installing took longer: 0
        (3, _report(pushed, ReportOutcome.INSTALLED, "7", runs["org/pushed"], FLOOR)),  # no stage times
    ])
    with db.session_factory(engine).begin() as session:
        saved = fleet_trends.boot_seconds_saved(session, SINCE)
    found = {s.key_hash: (s.warm_boots, s.seconds_saved, s.without_cold_time) for s in saved}
    # org/a: 2 boots, installing in 8/3 s on average over their 3 reports (2, 2 and 4 s), against 40 s
    assert found == {a.key_hash(): (2, pytest.approx(2 * (40.0 - 8 / 3)), 0), b.key_hash(): (1, 0.0, 0), pushed.key_hash(): (1, 0.0, 1)}
    assert saved[0].key_hash == a.key_hash()
    assert fleet_trends.cold_seconds({"stages": {"x": {"seconds": True}, "y": {"seconds": float("inf")}}}) is None
