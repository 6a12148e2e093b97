"""``job wait``'s progress line (:class:`tunecache.transfer_progress.JobProgress`): a job's state,
stage and step of total on a terminal once it has waited a second; nothing on a pipe or quiet."""

from __future__ import annotations

import datetime as dt
import io

from rich.console import Console

from tests.support.builders import h200_key
from tunecache.contract import TuningJobRead
from tunecache.transfer_progress import JobProgress


def job(status: str, stage: str | None, step: int | None, total: int | None) -> TuningJobRead:
    return TuningJobRead(id=7, key=h200_key(), status=status, stage=stage, step=step, total=total, log_tail=None,
                         worker="(hidden)", attempts=1, error=None, run_id=None, created_at=dt.datetime.now(dt.timezone.utc),
                         started_at=None, finished_at=None, lease_expires_at=None, duration_s=None)


def test_the_line_says_state_stage_and_steps_on_a_terminal():
    console = Console(file=io.StringIO(), force_terminal=True, width=120)
    with JobProgress(console=console, show_after_s=0) as progress:
        progress.job(job("queued", None, None, None))
        progress.job(job("running", "gemm", 3, 8))
    shown = console.file.getvalue()
    assert progress.shown and "job 7: running, stage gemm" in shown and "3/8" in shown


def test_nothing_on_a_pipe_when_quiet_or_within_the_first_second():
    for console, options in ((Console(file=io.StringIO()), {"show_after_s": 0}),
                             (Console(file=io.StringIO(), force_terminal=True), {"quiet": True, "show_after_s": 0}),
                             (Console(file=io.StringIO(), force_terminal=True), {"show_after_s": 60})):
        with JobProgress(console=console, **options) as progress:
            progress.job(job("running", "gemm", 1, 2))
        assert not progress.shown and console.file.getvalue() == ""
