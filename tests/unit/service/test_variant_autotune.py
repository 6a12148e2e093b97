"""Opt-in auto-queue of an engine variant's vLLM warmup (tunecache.service.variant_autotune),
on SQLite and the real PostgreSQL: real report rows, real tokens, the real job queue.

Only reports sent with a token count, once per distinct token; the job's engine arguments
are those the most tokens reported; a budget bounds the jobs; every refusal is counted."""

from __future__ import annotations

import datetime as dt
import itertools

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import insert

from tests.support.builders import h200_key, make_token
from tunecache.contract import PodReportCreate, ReportOutcome, ReportSource, Scope
from tunecache.service import auto_tune_refusals, db, jobs, reports, tokens
from tunecache.service.models import PodReport, utcnow
from tunecache.service.variant_autotune import AutoTunePolicy, queue_wanted_variants

VARIANT = "ab" * 8
ARGS = {"max_model_len": 8192}
FORGED = {"max_model_len": 4096, "enforce_eager": True}
_boots = itertools.count()


@pytest.fixture
def sessions(engine):
    return db.session_factory(engine)


def missing_rows(count: int, token: str | None, variant: str = VARIANT, args=ARGS, model: str | None = None,
                 received_at: dt.datetime | None = None) -> list[dict]:
    """``count`` boots that found no warm state for ``variant``, sent with token ``token``
    (its name; ``None``: anonymous)."""
    rows = []
    key = h200_key(**({"model": model} if model else {}))
    for _ in range(count):
        n = next(_boots)
        report = PodReportCreate(key=key, environment_hash="e" * 64, outcome=ReportOutcome.INSTALLED, run_id=1,
                                 install_seconds=0.5, pod=f"pod-{n}", source=ReportSource.PLUGIN, boot_id=f"boot-{n:08d}",
                                 variant=variant, variant_missing=True, engine_args=args)
        sender = f"token:{token}" if token else "10.0.0.1"
        rows.append(reports.report_row(report, received_at or utcnow(), sender, token_name=token))
    return rows


def policy(**changes) -> AutoTunePolicy:
    return AutoTunePolicy(**{"min_tokens": 3, "hours": 1.0, "jobs_per_key_hour": 10, "jobs_per_hour": 100,
                             "jobs_queued": 100, **changes})


def store_and_queue(sessions, rows, now=None, **changes):
    with sessions.begin() as session:
        session.execute(insert(PodReport), rows)
        return queue_wanted_variants(session, rows, policy(**changes), now=now)


def tokens_named(engine, *names, scope="read"):
    for name in names:
        make_token(engine, name, scope)
    return names


def refused(reason: str) -> float:
    return REGISTRY.get_sample_value("tunecache_auto_tune_refused_total", {"reason": reason}) or 0.0


def job_args(sessions, job_id):
    with sessions() as session:
        return jobs.job_spec_inputs(session, job_id)[2]["engine_args"]


def test_a_variant_is_queued_once_three_distinct_tokens_reported_it_missing(sessions, engine):
    a, b, c = tokens_named(engine, "pods-a", "pods-b", "pods-c")
    before = refused("tokens")
    assert store_and_queue(sessions, missing_rows(2, a) + missing_rows(2, b)) == []  # 2 tokens of 3
    assert refused("tokens") - before == 1
    [job_id] = store_and_queue(sessions, missing_rows(1, c))  # the third token
    with sessions() as session:
        job = jobs.get_job(session, job_id)
        inputs = jobs.job_spec_inputs(session, job_id)
    assert job.status == "queued" and job.key == h200_key()
    assert inputs[1] is None and inputs[2]["warmup"] == "vllm" and inputs[2]["engine_args"] == ARGS
    assert store_and_queue(sessions, missing_rows(5, a)) == []  # joined: the job is there


def test_anonymous_reports_queue_nothing_however_many(sessions):
    before = refused("anonymous")
    assert store_and_queue(sessions, missing_rows(20, None), min_tokens=1) == []
    assert refused("anonymous") - before == 20


def test_one_token_counts_once_however_many_boots_it_reports(sessions, engine):
    [a] = tokens_named(engine, "one-fleet")
    assert store_and_queue(sessions, missing_rows(50, a), min_tokens=2) == []


def test_revoked_tokens_and_tokens_below_the_scope_do_not_count(sessions, engine):
    read, revoked = tokens_named(engine, "dashboard", "stolen")
    push_a, push_b = tokens_named(engine, "pods-a", "pods-b", scope="push")
    with sessions.begin() as session:
        tokens.revoke_token(session, revoked)
    rows = missing_rows(1, read) + missing_rows(1, revoked) + missing_rows(1, push_a)
    assert store_and_queue(sessions, rows, min_tokens=2, token_scope=Scope.PUSH) == []
    assert len(store_and_queue(sessions, missing_rows(1, push_b), min_tokens=2, token_scope=Scope.PUSH)) == 1


def test_a_forged_report_after_honest_ones_does_not_choose_the_args(sessions, engine):
    a, b, forger = tokens_named(engine, "pods-a", "pods-b", "forger")
    assert store_and_queue(sessions, missing_rows(1, a) + missing_rows(1, b)) == []
    [job_id] = store_and_queue(sessions, missing_rows(3, forger, args=FORGED))  # last, and more reports
    assert job_args(sessions, job_id) == ARGS


def test_a_tie_between_arguments_goes_to_the_earliest_reported(sessions, engine):
    a, b, c = tokens_named(engine, "pods-a", "pods-b", "pods-c")
    rows = missing_rows(1, b, args={"max_model_len": 2048}) + missing_rows(1, a, args=ARGS)
    assert store_and_queue(sessions, rows) == []
    [job_id] = store_and_queue(sessions, missing_rows(1, c, args=FORGED))
    assert job_args(sessions, job_id) == {"max_model_len": 2048}


def test_arguments_in_another_order_are_the_same_arguments(sessions, engine):
    a, b, c, d = tokens_named(engine, "pods-a", "pods-b", "pods-c", "pods-d")
    both = {"max_model_len": 8192, "enforce_eager": False}
    rows = (missing_rows(1, d, args=FORGED) + missing_rows(1, a, args=both)
            + missing_rows(1, b, args=dict(reversed(both.items()))))
    [job_id] = store_and_queue(sessions, rows + missing_rows(1, c, args={"max_model_len": 1024}))
    assert job_args(sessions, job_id) == both


def test_a_variant_that_failed_lately_is_not_queued_again(sessions, engine):
    a, b, c = tokens_named(engine, "pods-a", "pods-b", "pods-c")
    [job_id] = store_and_queue(sessions, missing_rows(1, a) + missing_rows(1, b) + missing_rows(1, c))
    with sessions.begin() as session:
        claimed = jobs.claim(session, "w", "NVIDIA H200", "sm90", lease_s=60, max_attempts=3)
        assert claimed.id == job_id
        jobs.finish(session, job_id, "w", error="vLLM exited with status 1")
    before = refused("repeat")
    assert store_and_queue(sessions, missing_rows(4, a)) == []  # failed within the window: not again
    assert refused("repeat") - before == 1
    later = utcnow() + dt.timedelta(hours=2)  # past the window of the failed job
    rows = missing_rows(1, a, received_at=later) + missing_rows(1, b, received_at=later) + missing_rows(1, c, received_at=later)
    assert len(store_and_queue(sessions, rows, now=later)) == 1


def _fail_all_jobs(sessions):
    with sessions.begin() as session:
        while (job := jobs.claim(session, "w", "NVIDIA H200", "sm90", lease_s=60, max_attempts=3)) is not None:
            jobs.finish(session, job.id, "w", error="vLLM exited with status 1")


def test_the_budget_per_key_and_hour_refuses_and_counts(sessions, engine):
    a, b, c = tokens_named(engine, "pods-a", "pods-b", "pods-c")
    three = lambda **kw: missing_rows(1, a, **kw) + missing_rows(1, b, **kw) + missing_rows(1, c, **kw)  # noqa: E731
    assert len(store_and_queue(sessions, three(), jobs_per_key_hour=1)) == 1
    _fail_all_jobs(sessions)  # the key is free again; its hour's budget is spent
    before = refused("budget_key")
    assert store_and_queue(sessions, three(variant="cd" * 8, args=FORGED), jobs_per_key_hour=1) == []
    assert refused("budget_key") - before == 1
    assert len(store_and_queue(sessions, three(variant="cd" * 8, args=FORGED), jobs_per_key_hour=2)) == 1


def test_the_budget_per_hour_fleet_wide_refuses_and_counts(sessions, engine):
    a, b, c = tokens_named(engine, "pods-a", "pods-b", "pods-c")
    three = lambda **kw: missing_rows(1, a, **kw) + missing_rows(1, b, **kw) + missing_rows(1, c, **kw)  # noqa: E731
    assert len(store_and_queue(sessions, three(model="org/one"), jobs_per_hour=2)) == 1
    _fail_all_jobs(sessions)
    assert len(store_and_queue(sessions, three(model="org/two"), jobs_per_hour=2)) == 1
    before = refused("budget_hour")
    assert store_and_queue(sessions, three(model="org/three"), jobs_per_hour=2) == []  # two this hour, done or not
    assert refused("budget_hour") - before == 1


def test_the_budget_of_jobs_queued_at_once_refuses_and_counts(sessions, engine):
    a, b, c = tokens_named(engine, "pods-a", "pods-b", "pods-c")
    three = lambda **kw: missing_rows(1, a, **kw) + missing_rows(1, b, **kw) + missing_rows(1, c, **kw)  # noqa: E731
    assert len(store_and_queue(sessions, three(model="org/one"), jobs_queued=1)) == 1
    before = refused("budget_queued")
    assert store_and_queue(sessions, three(model="org/two"), jobs_queued=1) == []
    assert refused("budget_queued") - before == 1
    _fail_all_jobs(sessions)  # nothing queued any more
    assert len(store_and_queue(sessions, three(model="org/two"), jobs_queued=1)) == 1


def test_refusals_are_kept_per_variant_and_reason_for_the_fleet_view(sessions, engine):
    a, b = tokens_named(engine, "pods-a", "pods-b")
    for _ in range(3):
        store_and_queue(sessions, missing_rows(1, a) + missing_rows(1, b))
    store_and_queue(sessions, missing_rows(5, None))  # anonymous: never a refusal of the variant, never stored as one
    with sessions() as session:
        found = auto_tune_refusals.refusals_since(session.connection(), utcnow() - dt.timedelta(hours=1))
        old = auto_tune_refusals.refusals_since(session.connection(), utcnow() + dt.timedelta(hours=1))
    assert found == {(h200_key().key_hash(), VARIANT): {"tokens": 3}}
    assert old == {}


def test_off_queues_nothing(sessions, engine):
    a, b, c = tokens_named(engine, "pods-a", "pods-b", "pods-c")
    rows = missing_rows(1, a) + missing_rows(1, b) + missing_rows(1, c)
    assert store_and_queue(sessions, rows, min_tokens=0) == []
