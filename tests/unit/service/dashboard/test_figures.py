"""What a key's history and a job draw (tunecache.service.dashboard.figures), from runs."""

from __future__ import annotations

import datetime as dt
import re

from tests.support.builders import h200_key, run_payload
from tests.support.paths import CUDNN_FILE
from tunecache.contract import TuningRunRead
from tunecache.service.dashboard.figures import history_figures, job_figure

NOW = dt.datetime(2026, 12, 1, tzinfo=dt.timezone.utc)


def _run(run_id: int, minutes: int, trigger: str, summary: dict, entries: int | None = 42) -> TuningRunRead:
    payload = run_payload(CUDNN_FILE, h200_key(), trigger=trigger)
    return TuningRunRead.model_validate({
        **payload, "id": run_id, "environment_hash": "0" * 64, "status": "succeeded", "node": None, "started_at": None,
        "finished_at": None, "duration_s": None, "error": None, "summary": {**summary, "entries": entries},
        "verified": True, "is_current": False, "created_at": NOW + dt.timedelta(minutes=minutes), "artifacts": [],
        "entries": entries})


def _ys(markup) -> list[float]:
    return [float(y) for y in re.findall(r'data-y="([^"]+)"', str(markup))]


def test_tuning_time_and_entries_per_run_oldest_first():
    stages = {"stages": {"gemm": {"status": "done", "seconds": 30.0}, "moe": {"status": "skipped", "reason": "dense"}}}
    runs = [_run(3, 20, "cli", {**stages, "tuning_seconds": 33.5}, entries=40),
            _run(1, 0, "cli", stages, entries=42),  # no tuning_seconds: its stages' sum
            _run(2, 10, "upload", {}, entries=41)]  # pushed: no time, its entries
    drawn = history_figures(runs)
    assert _ys(drawn["tuning_chart"]) == [30.0, 33.5]
    assert re.findall(r'data-x="([^"]+)"', str(drawn["tuning_chart"])) == ["0", "2"]  # runs 1 and 3 of 1, 2, 3
    assert _ys(drawn["entries_chart"]) == [42.0, 41.0, 40.0]
    assert (drawn["pushed_runs"], drawn["all_pushed"]) == (1, False)
    only_pushed = history_figures([_run(5, 0, "upload", {}, entries=None)])
    assert only_pushed == {"tuning_chart": None, "entries_chart": None, "pushed_runs": 1, "all_pushed": True}


def test_a_jobs_stages_as_bars():
    run = _run(7, 0, "http", {"stages": {"gemm": {"status": "done", "seconds": 12.0},
                                         "attention": {"status": "done", "seconds": 3.0},
                                         "moe": {"status": "skipped", "reason": "dense"}}})
    bars = re.findall(r'data-label="([^"]+)" data-value="([^"]+)"', str(job_figure(run)))
    assert bars == [("gemm", "12"), ("attention", "3")]
    assert job_figure(None) is None and job_figure(_run(8, 0, "upload", {})) is None
