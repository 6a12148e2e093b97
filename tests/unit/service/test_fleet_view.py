"""``reports.fleet_view`` on SQLite and PostgreSQL, in the cases the HTTP tests do not reach:
a key named only by error reports, the summary's ``entries`` as the matrix reads it, the
current tunings kept between views until the tuning generation moves (a run that becomes
current shows in the next view, with its own time; one that does not, never), and pages:
every page of a window in the documented order, each row once, ties included, totals, the
``contains`` filter of the dashboard, and limits out of range."""

from __future__ import annotations

import datetime as dt

import pytest

from tests.support.paths import CUBLASLT_FILE, CUDNN_FILE
from tests.support.builders import file_environment, h200_key, run_payload, store_file
from tunecache.contract import EnvironmentMetadata, PodReportCreate, ReportOutcome, ReportSource, TuningRunCreate
from tunecache.service import db, publishing, reports

NOW = dt.datetime.now(dt.timezone.utc)


def _record(engine, key, path=CUDNN_FILE, **overrides) -> int:
    """Record a run of ``path`` for ``key`` (current when it succeeded); returns its id."""
    with db.session_factory(engine).begin() as session:
        store_file(session, path)
        return publishing.record_run(session, TuningRunCreate.model_validate(run_payload(path, key, **overrides))).id


def _view(engine, hours: float = 24, **page):
    with db.session_factory(engine).begin() as session:
        return reports.fleet_view(session, hours, **page)


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


def test_pages_cover_the_window_in_order_each_row_once(engine):
    """12 reported keys on two GPUs (report counts 1-3: ties broken by model, GPU, tokens,
    hash), two tuned ones without reports, and miss groups in two environments with tied
    pods, reports and times: pages of 5 from every offset are the whole view's rows, in the
    documented orders, with the same totals; past the end, empty."""
    env = file_environment(CUDNN_FILE)
    other = EnvironmentMetadata(**(env.model_dump() | {"cudnn_version": "91700"}))
    tuned = [h200_key(model=f"org/tuned-{i}") for i in range(2)]
    for key in tuned:
        _record(engine, key)
    at = NOW - dt.timedelta(hours=2)  # one instant for every report: ties in ``last_asked_at`` too
    with db.session_factory(engine).begin() as session:
        for i in range(12):
            key = h200_key(model=f"org/m-{i % 6:02d}", gpu_name="NVIDIA H100" if i >= 6 else "NVIDIA H200")
            for r in range(1 + i % 3):
                environment = env if r % 2 == 0 else other
                reports.record_report(session, PodReportCreate(
                    key=key, environment_hash=environment.environment_hash(), environment=environment,
                    outcome=ReportOutcome.MISS, install_seconds=0.1, pod=f"pod-{i}-{r}", source=ReportSource.CLI),
                    received_at=at)
    now = NOW + dt.timedelta(minutes=1)  # one clock for every page: the same ``age_s``
    whole = _view(engine, now=now, limit=1000, wanted_limit=1000)
    assert (whole.total_keys, len(whole.keys), whole.total_wanted, len(whole.wanted)) == (14, 14, 20, 20)
    assert [(-k.reports, k.key.model, k.key.gpu_name, k.key.max_num_batched_tokens, k.key.key_hash())
            for k in whole.keys] == sorted((-k.reports, k.key.model, k.key.gpu_name, k.key.max_num_batched_tokens,
                                            k.key.key_hash()) for k in whole.keys)
    assert [k.key.model for k in whole.keys[-2:]] == ["org/tuned-0", "org/tuned-1"]  # no reports: last
    wanted_order = [(-w.pods, -w.reports, -w.last_asked_at.timestamp(), w.key.key_hash(), w.environment_hash)
                    for w in whole.wanted]
    assert wanted_order == sorted(wanted_order)

    for offset in range(0, 16):
        page = _view(engine, now=now, limit=5, offset=offset, wanted_limit=5, wanted_offset=offset)
        assert (page.total_keys, page.total_wanted, page.limit, page.offset) == (14, 20, 5, offset)
        assert page.keys == whole.keys[offset:offset + 5], offset
        assert page.wanted == whole.wanted[offset:offset + 5], offset
    walked = [k for offset in range(0, 14, 5) for k in _view(engine, now=now, limit=5, offset=offset).keys]
    assert walked == whole.keys
    assert _view(engine, now=now, offset=14, wanted_offset=20).model_dump(include={"keys", "wanted"}) == {
        "keys": [], "wanted": []}


def test_contains_keeps_the_rows_of_a_model_or_gpu_and_counts_only_those(engine):
    env = file_environment(CUDNN_FILE)
    with db.session_factory(engine).begin() as session:
        for gpu_name in ("NVIDIA H100", "NVIDIA H200"):
            for model in ("org/alpha", "org/beta"):
                reports.record_report(session, PodReportCreate(
                    key=h200_key(model=model, gpu_name=gpu_name), environment_hash=env.environment_hash(),
                    environment=env, outcome=ReportOutcome.MISS, install_seconds=0.1, pod=f"{gpu_name}-{model}",
                    source=ReportSource.CLI), received_at=NOW - dt.timedelta(hours=1))
    assert (_view(engine).total_keys, _view(engine).total_wanted) == (4, 4)
    by_gpu = _view(engine, contains=" h100 ")
    assert {k.key.gpu_name for k in by_gpu.keys} == {w.key.gpu_name for w in by_gpu.wanted} == {"NVIDIA H100"}
    assert (by_gpu.total_keys, by_gpu.total_wanted) == (2, 2)
    by_model = _view(engine, contains="ALPHA", limit=1)
    assert (by_model.total_keys, len(by_model.keys), by_model.total_wanted) == (2, 1, 2)
    assert _view(engine, contains="gamma").model_dump(include={"total_keys", "total_wanted"}) == {
        "total_keys": 0, "total_wanted": 0}


@pytest.mark.parametrize("page", [{"limit": 0}, {"wanted_limit": 0}, {"offset": -1}, {"wanted_offset": -1}])
def test_a_limit_under_1_or_a_negative_offset_is_refused(engine, page):
    with pytest.raises(ValueError, match="must be at least"):
        _view(engine, **page)


def test_attested_boots_are_counted_per_key_with_what_the_rest_still_compiled(engine):
    key, other = h200_key(), h200_key(model="other/model")
    env = file_environment(CUDNN_FILE)
    attestations = [(key, {"inductor_graphs": 0, "triton_kernels": 0}), (key, {"inductor_graphs": 0, "triton_kernels": 0}),
                    (key, {"inductor_graphs": 2, "triton_kernels": 14}), (key, {"triton_kernels": 1}), (key, None),
                    (other, None)]
    with db.session_factory(engine).begin() as session:
        for n, (k, compiled) in enumerate(attestations):
            reports.record_report(session, PodReportCreate(
                key=k, environment_hash=env.environment_hash(), outcome=ReportOutcome.INSTALLED, run_id=1,
                install_seconds=0.1, pod=f"pod-{n}", source=ReportSource.PLUGIN, compiled=compiled),
                received_at=NOW - dt.timedelta(hours=1))
        reports.record_report(session, PodReportCreate(  # outside the window
            key=key, environment_hash=env.environment_hash(), outcome=ReportOutcome.INSTALLED, run_id=1,
            install_seconds=0.1, pod="old", source=ReportSource.PLUGIN, compiled={"aot_compiles": 1}),
            received_at=NOW - dt.timedelta(hours=30))
    rows = {row.key.model: row for row in _view(engine).keys}
    mine = rows[key.model]
    assert (mine.reports, mine.attested, mine.at_floor) == (5, 4, 2)
    assert {k.value: v for k, v in mine.still_compiled.items()} == {"inductor_graphs": 2, "triton_kernels": 15}
    assert (rows[other.model].attested, rows[other.model].at_floor, rows[other.model].still_compiled) == (0, 0, {})


def test_an_attestation_out_of_bounds_or_of_an_unknown_kind_is_refused():
    env = file_environment(CUDNN_FILE)
    fields = dict(key=h200_key(), environment_hash=env.environment_hash(), outcome=ReportOutcome.INSTALLED, run_id=1,
                  install_seconds=0.1, pod="p", source=ReportSource.PLUGIN)
    for compiled in ({"triton_kernels": -1}, {"triton_kernels": 1_000_001}, {"espresso": 1}):
        with pytest.raises(ValueError):
            PodReportCreate(**fields, compiled=compiled)


def test_each_current_run_names_the_image_its_warm_state_is_for(engine):
    """Per key, which images have a warm state: FlashInfer's version (the environment), vLLM's
    (the compile cache's factors) and torch's (the packages the run was built with)."""
    _record(engine, h200_key(model="warm"), summary={"entries": 1, "vllm_compile": {"vllm_version": "0.25.0"},
                                                      "dependencies": {"torch": "2.11.0", "triton": "3.6.0"}})
    _record(engine, h200_key(model="tactics-only"), summary={"entries": 1})
    runs = {row.key.model: row.current[0] for row in _view(engine).keys}
    assert (runs["warm"].flashinfer_version, runs["warm"].vllm_version, runs["warm"].torch_version) == (
        "0.7.4", "0.25.0", "2.11.0")
    assert (runs["tactics-only"].vllm_version, runs["tactics-only"].torch_version) == (None, None)


def test_boots_that_left_out_kinds_built_on_another_image_are_counted_per_key_and_kind(engine):
    """A pod of an image with no run of the key installs it without what drifts and says which
    kinds (``missing_kinds``); the matrix counts its boots once however many ranks report."""
    key = h200_key()
    run = _record(engine, key)
    env = file_environment(CUDNN_FILE)
    with db.session_factory(engine).begin() as session:
        for boot, rank, missing in (("boot-0001", 0, ["triton_cache", "vllm_compile_cache"]),
                                    ("boot-0001", 1, ["triton_cache", "vllm_compile_cache"]),
                                    ("boot-0002", 0, ["vllm_compile_cache"]), ("boot-0003", 0, [])):
            reports.record_report(session, PodReportCreate(
                key=key, environment_hash=env.environment_hash(), outcome=ReportOutcome.INSTALLED, run_id=run,
                install_seconds=0.1, pod=boot, rank=rank, source=ReportSource.PLUGIN, boot_id=boot,
                missing_kinds=missing), received_at=NOW - dt.timedelta(hours=1))
    [row] = _view(engine).keys
    assert (row.installed, row.missing) == (3, 2)
    assert row.missing_kinds == {"triton_cache": 1, "vllm_compile_cache": 2}


def test_missing_kinds_belong_to_installed_reports_each_once():
    env = file_environment(CUDNN_FILE)
    base = dict(key=h200_key(), environment_hash=env.environment_hash(), install_seconds=0.1, pod="p",
                source=ReportSource.PLUGIN)
    with pytest.raises(ValueError, match="missing_kinds belong to installed reports"):
        PodReportCreate(**base, outcome=ReportOutcome.MISS, missing_kinds=["triton_cache"])
    with pytest.raises(ValueError, match="names a kind twice"):
        PodReportCreate(**base, outcome=ReportOutcome.INSTALLED, run_id=1, missing_kinds=["triton_cache"] * 2)
    with pytest.raises(ValueError):
        PodReportCreate(**base, outcome=ReportOutcome.INSTALLED, run_id=1, missing_kinds=["not_a_kind"])
