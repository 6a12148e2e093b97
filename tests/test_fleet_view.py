"""``reports.fleet_view`` on SQLite and PostgreSQL, in the cases the HTTP tests do not reach:
a key named only by error reports, the summary's ``entries`` as the matrix reads it, and the
current tunings kept between views until the tuning generation moves (a run that becomes
current shows in the next view, with its own time; one that does not, never)."""

from __future__ import annotations

import datetime as dt

from conftest import CUBLASLT_FILE, CUDNN_FILE
from helpers import file_environment, h200_key, run_payload, store_file
from tunecache.contract import EnvironmentMetadata, PodReportCreate, ReportOutcome, ReportSource, TuningRunCreate
from tunecache.service import db, reports, repository

NOW = dt.datetime.now(dt.timezone.utc)


def _record(engine, key, path=CUDNN_FILE, **overrides) -> int:
    """Record a run of ``path`` for ``key`` (current when it succeeded); returns its id."""
    with db.session_factory(engine).begin() as session:
        store_file(session, path)
        return repository.record_run(session, TuningRunCreate.model_validate(run_payload(path, key, **overrides))).id


def _view(engine, hours: float = 24):
    with db.session_factory(engine).begin() as session:
        return reports.fleet_view(session, hours)


def test_a_key_only_pods_name_with_error_reports_is_in_the_matrix(engine):
    key = h200_key(model="never/tuned")
    env = file_environment(CUDNN_FILE)
    with db.session_factory(engine).begin() as session:
        for pod in ("pod-a", "pod-b"):
            reports.record_report(session, PodReportCreate(
                key=key, environment_hash=env.environment_hash(), outcome=ReportOutcome.ERROR, error_kind="OSError",
                install_seconds=0.1, pod=pod, source=ReportSource.CLI), received_at=NOW - dt.timedelta(hours=1))
    [row] = _view(engine).keys
    assert (row.key, row.current, row.reports, row.errors, row.installed, row.hit_rate) == (key, [], 2, 2, 0, 0.0)
    assert _view(engine).wanted == []  # errors are not misses


def test_entries_are_the_summarys_integer_or_nothing(engine):
    summaries = {"entries 42": {"entries": 42}, "a float": {"entries": 42.0}, "a string": {"entries": "42"},
                 "none": {}, "negative": {"entries": -3}}
    runs = {name: _record(engine, h200_key(model=name), summary=summary) for name, summary in summaries.items()}
    entries = {row.key.model: row.current[0].entries for row in _view(engine).keys}
    assert entries == {"entries 42": 42, "a float": None, "a string": None, "none": None, "negative": -3}
    assert {row.key.model: row.current[0].run_id for row in _view(engine).keys} == runs


def test_current_tunings_are_read_again_when_the_generation_moves(engine):
    key = h200_key()
    first = _record(engine, key)
    before = _view(engine)
    assert [r.run_id for r in before.keys[0].current] == [first]
    with db.session_factory(engine).begin() as session:
        kept = reports.current_tunings(session)
        assert reports.current_tunings(session) is kept  # same generation: not read again

    other_env = EnvironmentMetadata(**(file_environment(CUDNN_FILE).model_dump() | {"cudnn_version": "91700"}))
    second = _record(engine, key, environment=other_env.model_dump())
    failed = _record(engine, key, CUBLASLT_FILE, status="failed", error="boom", artifacts=[])
    after = _view(engine)
    [row] = after.keys
    assert [r.run_id for r in row.current] == [second, first]  # newest first; the failed run is not current
    assert failed not in [r.run_id for r in row.current]
    assert row.current[1].age_s >= before.keys[0].current[0].age_s  # its age is of this view, not of the kept read
    with db.session_factory(engine).begin() as session:
        assert reports.current_tunings(session) is not kept
