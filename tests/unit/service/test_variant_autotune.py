"""Opt-in auto-queue of an engine variant's vLLM warmup (tunecache.service.variant_autotune),
on SQLite and the real PostgreSQL: real report rows, the real job queue."""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import insert

from tests.support.builders import h200_key
from tunecache.contract import PodReportCreate, ReportOutcome, ReportSource
from tunecache.service import db, jobs, reports
from tunecache.service.models import PodReport, utcnow
from tunecache.service.variant_autotune import queue_wanted_variants

VARIANT = "ab" * 8
ARGS = {"max_model_len": 8192}


@pytest.fixture
def sessions(engine):
    return db.session_factory(engine)


def missing_rows(count: int, variant: str = VARIANT, args=ARGS) -> list[dict]:
    rows = []
    for n in range(count):
        report = PodReportCreate(key=h200_key(), environment_hash="e" * 64, outcome=ReportOutcome.INSTALLED, run_id=1,
                                 install_seconds=0.5, pod=f"pod-{n}", source=ReportSource.PLUGIN, boot_id=f"boot-{n:04d}",
                                 variant=variant, variant_missing=True, engine_args=args)
        rows.append(reports.report_row(report, utcnow()))
    return rows


def store_and_queue(sessions, rows, min_boots=3, hours=1.0):
    with sessions.begin() as session:
        session.execute(insert(PodReport), rows)
        return queue_wanted_variants(session, rows, min_boots, hours)


def test_a_variant_is_queued_once_enough_boots_found_no_warm_state(sessions):
    assert store_and_queue(sessions, missing_rows(2)) == []  # 2 boots of 3
    [job_id] = store_and_queue(sessions, missing_rows(3)[2:])  # the third boot
    with sessions() as session:
        job = jobs.get_job(session, job_id)
        inputs = jobs.job_spec_inputs(session, job_id)
    assert job.status == "queued" and job.key == h200_key()
    assert inputs[1] is None and inputs[2]["warmup"] == "vllm" and inputs[2]["engine_args"] == ARGS
    assert store_and_queue(sessions, missing_rows(5)) == []  # joined: the job is there


def test_a_variant_that_failed_lately_is_not_queued_again(sessions):
    [job_id] = store_and_queue(sessions, missing_rows(3))
    with sessions.begin() as session:
        claimed = jobs.claim(session, "w", "NVIDIA H200", "sm90", lease_s=60, max_attempts=3)
        assert claimed.id == job_id
        jobs.finish(session, job_id, "w", error="vLLM exited with status 1")
    assert store_and_queue(sessions, missing_rows(4)) == []  # failed within the window: not again
    later = utcnow() + dt.timedelta(hours=2)  # past the window of the failed job
    rows = missing_rows(1)
    rows[0]["received_at"] = later
    with sessions.begin() as session:
        session.execute(insert(PodReport), rows)
        assert len(queue_wanted_variants(session, rows, 1, 1.0, now=later)) == 1


def test_off_queues_nothing(sessions):
    assert store_and_queue(sessions, missing_rows(10), min_boots=0) == []
