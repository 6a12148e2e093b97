"""The tuning history (``GET /v1/tunings``) and the fleet view (``GET /v1/fleet``) against a
live ``tunecache serve`` on SQLite and PostgreSQL: every filter narrows to exactly the runs
it names, cursor pages cover every run once while runs are recorded meanwhile, the CSV
export (header, rows, streamed in chunks), 4xx bodies naming the bad parameter, the CLI's
``history`` and ``fleet``, and EXPLAIN showing that the history's and the fleet's queries
are answered from indexes."""

from __future__ import annotations

import csv
import datetime as dt
import hashlib
import io
import json
import time

import httpx
import pytest
from sqlalchemy import text, update

from tests.support.cli import tunecache
from tests.support.paths import CUBLASLT_FILE, CUDNN_FILE
from tests.support.serve import as_admin
from tests.support.builders import file_environment, h200_key, plan_of, run_payload
from tunecache.store.http import TunecacheClient
from tunecache.contract import (
    KEY_FIELDS,
    RUN_CSV_COLUMNS,
    EnvironmentMetadata,
    PodReportCreate,
    ReportOutcome,
    ReportSource,
    TuningRunQuery,
)
from tunecache.service import db, reports, repository
from tunecache.service.models import TuningRun

NOW = dt.datetime.now(dt.timezone.utc)


def _upload(server: str, path=CUDNN_FILE) -> None:
    data = path.read_bytes()
    answer = as_admin.put(f"{server}/v1/artifacts/{hashlib.sha256(data).hexdigest()}", content=data, timeout=30)
    assert answer.status_code in (200, 201), answer.text


def _record(server: str, key=None, environment: dict | None = None, **overrides) -> dict:
    """Record a run of the H200 file, as if tuned on the key's GPU (admin token), and return it as
    the server answered."""
    payload = run_payload(CUDNN_FILE, key or h200_key(), **overrides)
    if environment is not None:
        payload["environment"] = environment
    payload["environment"] = {**payload["environment"], "gpu": payload["key"]["gpu_name"]}
    if payload.get("status") == "failed":
        payload["artifacts"] = []
    answer = as_admin.post(f"{server}/v1/tunings", json=payload, timeout=30)
    assert answer.status_code == 201, answer.text
    return answer.json()


def _set_created_at(database_url: str, times: dict[int, dt.datetime]) -> None:
    """Move runs in time, as if recorded then (the service sets created_at itself)."""
    engine = db.create_db_engine(database_url)
    try:
        with engine.begin() as connection:
            for run_id, when in times.items():
                connection.execute(update(TuningRun).where(TuningRun.id == run_id).values(created_at=when))
    finally:
        engine.dispose()


@pytest.fixture
def seeded(server, database_url):
    """Seven runs over ten days that differ in every filtered dimension: (server, runs), each
    run the server's JSON with the time it was moved to."""
    _upload(server)
    base = file_environment(CUDNN_FILE).model_dump()
    older_fi = base | {"flashinfer_version": "0.6.13", "cutlass_dsl_version": "(not tracked)"}
    other_cuda = base | {"cuda_version": "12.9"}
    specs = [  # (key, environment, overrides, age)
        (h200_key(), base, {"trigger": "upload"}, dt.timedelta(days=10)),
        (h200_key(max_num_batched_tokens=4096), base, {"status": "failed", "trigger": "cli", "error": "boom"},
         dt.timedelta(days=6)),
        (h200_key(model="Qwen/Qwen3-30B-A3B", gpu_name="NVIDIA H100"), older_fi, {"trigger": "http"}, dt.timedelta(days=4)),
        (h200_key(gpu_name="NVIDIA B200", arch="sm100"), base, {"trigger": "pod"}, dt.timedelta(days=2)),
        (h200_key(model="Qwen/Qwen3-30B-A3B", tensor_parallel_size=2), other_cuda, {"trigger": "cli"}, dt.timedelta(hours=20)),
        (h200_key(), other_cuda, {"trigger": "http"}, dt.timedelta(hours=3)),
        (h200_key(dtype="bfloat16"), base, {"trigger": "cli"}, dt.timedelta(minutes=30)),
    ]
    runs = []
    for key, environment, overrides, age in specs:
        run = _record(server, key, environment, **overrides)
        run["created_at"] = NOW - age
        runs.append(run)
    _set_created_at(database_url, {run["id"]: run["created_at"] for run in runs})
    for run in runs:  # current as of now, after every recording
        run["is_current"] = httpx.get(f"{server}/v1/tunings/{run['id']}", timeout=30).json()["is_current"]
    assert 0 < sum(run["is_current"] for run in runs) < len(runs)
    return server, runs


def _ids(server: str, **params) -> list[int]:
    answer = httpx.get(f"{server}/v1/tunings", params={"limit": 500, **params}, timeout=30)
    assert answer.status_code == 200, answer.text
    return [run["id"] for run in answer.json()["items"]]


def _expected(runs: list[dict], predicate) -> list[int]:
    """Ids of the seeded runs ``predicate`` keeps, newest first (the history's order)."""
    kept = sorted((r for r in runs if predicate(r)), key=lambda r: (r["created_at"], r["id"]), reverse=True)
    return [r["id"] for r in kept]


def test_every_filter_narrows_to_exactly_its_runs(seeded):
    server, runs = seeded
    assert _ids(server) == _expected(runs, lambda r: True)  # newest first by created_at, not by id
    cases = {
        "gpu_name": ({"gpu_name": "NVIDIA H100"}, lambda r: r["key"]["gpu_name"] == "NVIDIA H100"),
        "arch": ({"arch": "sm100"}, lambda r: r["key"]["arch"] == "sm100"),
        "model": ({"model": "Qwen/Qwen3-30B-A3B"}, lambda r: r["key"]["model"] == "Qwen/Qwen3-30B-A3B"),
        "max_num_batched_tokens": ({"max_num_batched_tokens": 4096}, lambda r: r["key"]["max_num_batched_tokens"] == 4096),
        "dtype": ({"dtype": "bfloat16"}, lambda r: r["key"]["dtype"] == "bfloat16"),
        "tensor_parallel_size": ({"tensor_parallel_size": 2}, lambda r: r["key"]["tensor_parallel_size"] == 2),
        "flashinfer_version": ({"flashinfer_version": "0.6.13"}, lambda r: r["environment"]["flashinfer_version"] == "0.6.13"),
        "cuda_version": ({"cuda_version": "12.9"}, lambda r: r["environment"]["cuda_version"] == "12.9"),
        "status": ({"status": "failed"}, lambda r: r["status"] == "failed"),
        "trigger": ({"trigger": "cli"}, lambda r: r["trigger"] == "cli"),
        "pod trigger": ({"trigger": "pod"}, lambda r: r["trigger"] == "pod"),
        "since": ({"since": (NOW - dt.timedelta(days=3)).isoformat()}, lambda r: r["created_at"] >= NOW - dt.timedelta(days=3)),
        "until": ({"until": (NOW - dt.timedelta(days=3)).isoformat()}, lambda r: r["created_at"] < NOW - dt.timedelta(days=3)),
        "since and until": ({"since": (NOW - dt.timedelta(days=7)).isoformat(), "until": (NOW - dt.timedelta(hours=4)).isoformat()},
                            lambda r: NOW - dt.timedelta(days=7) <= r["created_at"] < NOW - dt.timedelta(hours=4)),
        "current_only": ({"current_only": True}, lambda r: r["is_current"]),
        "combined": ({"model": "meta-llama/Llama-3.1-8B", "trigger": "http", "cuda_version": "12.9"},
                     lambda r: r["key"]["model"] == "meta-llama/Llama-3.1-8B" and r["trigger"] == "http"
                     and r["environment"]["cuda_version"] == "12.9"),
        "nothing": ({"flashinfer_version": "9.9.9"}, lambda r: False),
    }
    for name, (params, predicate) in cases.items():
        expected = _expected(runs, predicate)
        assert len(expected) < len(runs), name  # every filter narrows
        assert _ids(server, **params) == expected, name
        assert httpx.get(f"{server}/v1/tunings", params=params).json()["total"] == len(expected), name
    # the typed client sends the same filters
    with TunecacheClient(server) as client:
        page = client.list_runs(TuningRunQuery(flashinfer_version="0.6.13", since=NOW - dt.timedelta(days=5)))
    assert [r.id for r in page.items] == _expected(runs, lambda r: r["environment"]["flashinfer_version"] == "0.6.13")


def test_cursor_pages_cover_every_run_once_while_runs_are_recorded(server):
    _upload(server)
    existing = [_record(server, h200_key(max_num_batched_tokens=1024 + i))["id"] for i in range(13)]
    seen, recorded_meanwhile, cursor = [], [], None
    while True:
        params = {"limit": 4} | ({"cursor": cursor} if cursor else {})
        page = httpx.get(f"{server}/v1/tunings", params=params, timeout=30).json()
        seen += [run["id"] for run in page["items"]]
        recorded_meanwhile.append(_record(server, h200_key(max_num_batched_tokens=99_000 + len(seen)))["id"])
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == sorted(existing, reverse=True)  # each once, in order; none of the new ones
    assert len(seen) == len(set(seen)) == 13 and not set(recorded_meanwhile) & set(seen)

    # offset pages shift when a run is recorded between them: why the cursor exists
    first = [r["id"] for r in httpx.get(f"{server}/v1/tunings", params={"limit": 4}).json()["items"]]
    _record(server, h200_key(max_num_batched_tokens=123_456))
    second = [r["id"] for r in httpx.get(f"{server}/v1/tunings", params={"limit": 4, "offset": 4}).json()["items"]]
    assert second[0] == first[-1]

    # the client's iter_runs follows the cursors: every run, once
    with TunecacheClient(server) as client:
        every = [run.id for run in client.iter_runs(TuningRunQuery(limit=5))]
    total = httpx.get(f"{server}/v1/tunings").json()["total"]
    assert len(every) == len(set(every)) == total


def _csv(answer: httpx.Response) -> list[list[str]]:
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/csv")
    return list(csv.reader(io.StringIO(answer.text)))


def test_csv_export_has_the_header_and_every_matching_run(seeded):
    server, runs = seeded
    rows = _csv(httpx.get(f"{server}/v1/tunings", params={"format": "csv", "limit": 1, "model": "Qwen/Qwen3-30B-A3B"}))
    header, body = rows[0], rows[1:]
    assert tuple(header) == RUN_CSV_COLUMNS
    expected = _expected(runs, lambda r: r["key"]["model"] == "Qwen/Qwen3-30B-A3B")
    assert [int(row[0]) for row in body] == expected  # limit does not apply to an export
    by_id = {r["id"]: r for r in runs}
    for row in body:
        record = dict(zip(header, row))
        run = by_id[int(record["id"])]
        assert record["model"] == run["key"]["model"] and record["flashinfer_version"] == run["environment"]["flashinfer_version"]
        assert dt.datetime.fromisoformat(record["created_at"]) == run["created_at"]
        assert record["trigger"] == run["trigger"] and record["entries"] == "42"
    failed = _csv(httpx.get(f"{server}/v1/tunings", params={"status": "failed"}, headers={"Accept": "text/csv"}))
    [row] = failed[1:]
    assert dict(zip(failed[0], row))["error"] == "boom"  # Accept: text/csv asks for it too
    assert httpx.get(f"{server}/v1/tunings", headers={"Accept": "application/json, text/csv"}).json()["total"] == len(runs)

    # the CLI streams the same export as the API gives its caller (here the local admin token, which
    # also sees the node and token names that an anonymous reader gets as "(hidden)")
    printed = tunecache("history", "--server", server, "--csv", "--model", "Qwen/Qwen3-30B-A3B", check=True)
    as_its_caller = _csv(as_admin.get(f"{server}/v1/tunings", params={"format": "csv", "model": "Qwen/Qwen3-30B-A3B"}))
    assert list(csv.reader(io.StringIO(printed.stdout))) == as_its_caller
    assert [row[0] for row in as_its_caller] == [row[0] for row in rows]


def test_csv_export_reads_in_chunks_and_covers_every_run_once(app_client, monkeypatch):
    from tunecache.service.routes import tunings

    monkeypatch.setattr(tunings, "CSV_CHUNK", 2)
    data = CUDNN_FILE.read_bytes()
    app_client.put(f"/v1/artifacts/{hashlib.sha256(data).hexdigest()}", content=data)
    ids = [app_client.post("/v1/tunings", json=run_payload(CUDNN_FILE, h200_key(max_num_batched_tokens=256 * (i + 1)))).json()["id"]
           for i in range(7)]
    rows = _csv(app_client.get("/v1/tunings", params={"format": "csv"}))
    assert [int(row[0]) for row in rows[1:]] == sorted(ids, reverse=True)
    # from a cursor on: the rest after the first JSON page
    page = app_client.get("/v1/tunings", params={"limit": 3}).json()
    rest = _csv(app_client.get("/v1/tunings", params={"format": "csv", "cursor": page["next_cursor"]}))
    assert [r["id"] for r in page["items"]] + [int(row[0]) for row in rest[1:]] == sorted(ids, reverse=True)


def test_bad_parameters_are_422_naming_them(app_client):
    def problem(path: str, **params) -> tuple[list, str]:
        answer = app_client.get(path, params=params)
        assert answer.status_code == 422, answer.text
        [error, *_] = answer.json()["detail"]
        return error["loc"], error["msg"]

    assert problem("/v1/tunings", cursor="not-a-cursor")[0] == ["query", "cursor"]
    assert problem("/v1/tunings", since="2026-12-01T08:00:00")[0] == ["query", "since"]  # no time zone
    # outside the years 1-9999 once in UTC (was a 500 from the database layer; the CSV export an empty body)
    assert problem("/v1/tunings", since="0001-01-01T00:00:00+05:00") == (["query", "since"],
                                                                         "Value error, is outside the years 1-9999 once in UTC")
    assert problem("/v1/tunings", until="9999-12-31T23:59:59-05:00")[0] == ["query", "until"]
    assert problem("/v1/tunings", format="csv", since="0001-01-01T00:00:00+05:00")[0] == ["query", "since"]
    assert problem("/v1/tunings", format="xml")[0] == ["query", "format"]
    assert problem("/v1/tunings", flashinfer_versio="0.7.4")[0] == ["query", "flashinfer_versio"]
    assert problem("/v1/tunings", arch="hopper")[0] == ["query", "arch"]
    _, message = problem("/v1/tunings", since="2026-12-02T00:00:00Z", until="2026-12-01T00:00:00Z")
    assert "until" in message and "since" in message
    from tunecache.contract import encode_run_cursor

    _, message = problem("/v1/tunings", offset=3, cursor=encode_run_cursor(NOW, 1))
    assert "offset" in message and "cursor" in message
    assert problem("/v1/fleet", hours=0)[0] == ["query", "hours"]
    assert problem("/v1/fleet", hours="a day")[0] == ["query", "hours"]
    for name, value in (("limit", 0), ("limit", 1001), ("limit", "all"), ("offset", -1), ("wanted_limit", 0),
                        ("wanted_limit", 1001), ("wanted_offset", -1)):
        assert problem("/v1/fleet", **{name: value})[0] == ["query", name], (name, value)
    assert app_client.get("/v1/fleet", params={"limit": 1000, "wanted_limit": 1}).status_code == 200


def test_history_cli_filters_pages_and_says_what_is_wrong(seeded):
    server, runs = seeded
    shown = tunecache("history", "--server", server, "--env", "cuda_version=12.9", check=True)
    lines = shown.stdout.splitlines()
    assert lines[0].split()[:3] == ["ID", "RECORDED", "(UTC)"]
    expected = _expected(runs, lambda r: r["environment"]["cuda_version"] == "12.9")
    assert [int(line.split()[0]) for line in lines[1:]] == expected
    assert f"{len(expected)} of {len(expected)} matching runs" in shown.stderr

    first = tunecache("history", "--server", server, "--limit", "2", "--since", "8d", check=True)
    cursor = first.stderr.split("--cursor ")[1].strip()
    rest = tunecache("history", "--server", server, "--limit", "2", "--since", "8d", "--cursor", cursor, check=True)
    everything = tunecache("history", "--server", server, "--limit", "2", "--since", "8d", "--all", check=True)
    ids = lambda out: [int(line.split()[0]) for line in out.splitlines()[1:]]  # noqa: E731
    assert ids(first.stdout) + ids(rest.stdout) == ids(everything.stdout)[:4]
    assert ids(everything.stdout) == _expected(runs, lambda r: r["created_at"] >= NOW - dt.timedelta(days=8))

    for args, named in ((["--env", "flashinfer=0.7.4"], "--env 'flashinfer=0.7.4'"),
                        (["--since", "yesterday"], "--since 'yesterday'"),
                        (["--since", "9999999999d"], "--since '9999999999d'"),
                        (["--until", "0001-01-01T00:00:00+05:00"], "--until"),
                        (["--status", "done"], "--status"),
                        (["--arch", "hopper"], "--arch"),
                        (["--since", "1d", "--until", "2d"], "until")):
        bad = tunecache("history", "--server", server, *args)
        assert bad.returncode == 2 and named in bad.stderr, (args, bad.stderr)
        assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr


def test_every_key_field_filters_the_api_and_the_cli(server):
    """Each key field (KEY_FIELDS, read from TuningKey) is a filter of ``GET /v1/tunings``,
    of the typed client and of ``tunecache history --<field>``; each narrows to exactly the
    runs of that value, quantization and the parallel sizes included."""
    _upload(server)
    keys = [
        h200_key(),
        h200_key(quantization="fp8"),
        h200_key(data_parallel_size=2, expert_parallel_size=2),
        h200_key(tensor_parallel_size=2, dtype="bfloat16"),
        h200_key(gpu_name="NVIDIA H100", model="Qwen/Qwen3-30B-A3B", max_num_batched_tokens=4096),
        h200_key(gpu_name="NVIDIA B200", arch="sm100"),
    ]
    runs = [_record(server, key) for key in keys]
    values = {"gpu_name": "NVIDIA H100", "arch": "sm100", "model": "Qwen/Qwen3-30B-A3B", "max_num_batched_tokens": 4096,
              "dtype": "bfloat16", "quantization": "fp8", "tensor_parallel_size": 2, "data_parallel_size": 2,
              "expert_parallel_size": 2}
    # engine: one engine so far, so nothing to narrow to (tests/unit/service/test_key_engine_migration.py filters on it)
    assert set(values) == set(KEY_FIELDS) - {"engine"}
    newest_first = sorted(runs, key=lambda r: r["id"], reverse=True)
    with TunecacheClient(server) as client:
        for field, value in values.items():
            expected = [r["id"] for r in newest_first if r["key"][field] == value]
            assert 0 < len(expected) < len(runs), field
            assert _ids(server, **{field: value}) == expected, field
            assert [r.id for r in client.list_runs(TuningRunQuery(**{field: value})).items] == expected, field
            shown = tunecache("history", "--server", server, "--" + field.replace("_", "-"), str(value), check=True)
            assert [int(line.split()[0]) for line in shown.stdout.splitlines()[1:]] == expected, (field, shown.stdout)
    both = tunecache("history", "--server", server, "-dp", "2", "--expert-parallel-size", "2", "--quantization", "auto",
                     check=True)
    assert [int(line.split()[0]) for line in both.stdout.splitlines()[1:]] == [runs[2]["id"]]
    bad = tunecache("history", "--server", server, "--quantization", "")
    assert bad.returncode == 2 and "--quantization" in bad.stderr, bad.stderr


def _report(key, environment: EnvironmentMetadata, outcome: ReportOutcome, pod: str, **fields) -> PodReportCreate:
    return PodReportCreate(key=key, environment_hash=environment.environment_hash(),
                           environment=environment if outcome is ReportOutcome.MISS else None, outcome=outcome,
                           install_seconds=fields.pop("seconds", 0.5), pod=pod, source=ReportSource.PLUGIN, **fields)


def test_fleet_matrix_hit_rates_and_wanted_list_from_seeded_reports(server, database_url):
    _upload(server)
    _upload(server, CUBLASLT_FILE)
    tuned_key, wanted_key = h200_key(), h200_key(model="Qwen/Qwen3-30B-A3B")
    env = file_environment(CUDNN_FILE)
    other_env = EnvironmentMetadata(**(env.model_dump() | {"cudnn_version": "91700"}))
    run = _record(server, tuned_key)
    differences = [{"field": "model", "stored": tuned_key.model, "yours": wanted_key.model}]
    hour = dt.timedelta(hours=1)
    seeded = [  # (report, received that long ago)
        (_report(tuned_key, env, ReportOutcome.INSTALLED, "pod-a", run_id=run["id"]), hour),
        (_report(tuned_key, env, ReportOutcome.INSTALLED, "pod-b", run_id=run["id"]), 2 * hour),
        (_report(tuned_key, env, ReportOutcome.INSTALLED, "pod-c", run_id=run["id"]), 3 * hour),
        (_report(tuned_key, env, ReportOutcome.ERROR, "pod-d", error_kind="UntrustedRun"), 4 * hour),
        (_report(tuned_key, other_env, ReportOutcome.MISS, "pod-e", run_id=run["id"],
                 differences=[{"field": "cudnn_version", "stored": "91900", "yours": "91700"}]), 5 * hour),
        (_report(tuned_key, env, ReportOutcome.ERROR, "pod-f", error_kind="OSError"), 30 * hour),
        (_report(wanted_key, env, ReportOutcome.MISS, "pod-a", run_id=run["id"], differences=differences), 6 * hour),
        (_report(wanted_key, env, ReportOutcome.MISS, "pod-b", run_id=run["id"], differences=differences), 2 * hour),
        (_report(wanted_key, env, ReportOutcome.MISS, "pod-a", run_id=run["id"], differences=differences), 1.5 * hour),
        (_report(wanted_key, env, ReportOutcome.MISS, "pod-z", run_id=run["id"], differences=differences), 40 * hour),
    ]
    engine = db.create_db_engine(database_url)
    try:
        with db.session_factory(engine).begin() as session:
            for report, ago in seeded:
                reports.record_report(session, report, received_at=NOW - ago)
    finally:
        engine.dispose()

    for hours in (24, 48):
        window = [(r, NOW - ago) for r, ago in seeded if ago <= dt.timedelta(hours=hours)]
        view = httpx.get(f"{server}/v1/fleet", params={"hours": hours}, timeout=30).json()
        keys = {(k["key"]["model"]): k for k in view["keys"]}
        assert set(keys) == {tuned_key.model, wanted_key.model}
        for key, row in ((tuned_key, keys[tuned_key.model]), (wanted_key, keys[wanted_key.model])):
            mine = [r for r, _ in window if r.key == key]
            installed = sum(r.outcome is ReportOutcome.INSTALLED for r in mine)
            assert (row["reports"], row["installed"]) == (len(mine), installed), hours
            assert row["missed"] == sum(r.outcome is ReportOutcome.MISS for r in mine)
            assert row["errors"] == sum(r.outcome is ReportOutcome.ERROR for r in mine)
            assert row["hit_rate"] == pytest.approx(installed / len(mine))
        [current] = keys[tuned_key.model]["current"]
        assert (current["run_id"], current["entries"], current["trigger"]) == (run["id"], 42, "upload")
        assert 0 <= current["age_s"] < 600 and keys[wanted_key.model]["current"] == []

        wanted = {(w["key"]["model"], w["environment_hash"]): w for w in view["wanted"]}
        misses = [(r, at) for r, at in window if r.outcome is ReportOutcome.MISS and r.key == wanted_key]
        w = wanted.pop((wanted_key.model, env.environment_hash()))
        assert w["pods"] == len({r.pod for r, _ in misses}) and w["reports"] == len(misses)
        assert dt.datetime.fromisoformat(w["last_asked_at"]) == max(at for _, at in misses)
        assert w["closest_run_id"] == run["id"] and w["differences"] == differences
        assert w["environment"] == env.model_dump()
        # the tuned key's miss in another environment is wanted too: no tuning for that cuDNN
        other = wanted.pop((tuned_key.model, other_env.environment_hash()))
        assert other["pods"] == 1 and other["differences"][0]["yours"] == "91700"
        assert wanted == {}

    # once the wanted environment has a current tuning, it is no longer wanted
    _record(server, tuned_key, other_env.model_dump())
    view = httpx.get(f"{server}/v1/fleet", timeout=30).json()
    assert [(w["key"]["model"]) for w in view["wanted"]] == [wanted_key.model]
    assert len(next(k for k in view["keys"] if k["key"]["model"] == tuned_key.model)["current"]) == 2

    assert (view["total_keys"], view["limit"], view["offset"]) == (2, 100, 0)
    assert (view["total_wanted"], view["wanted_limit"], view["wanted_offset"]) == (1, 100, 0)

    # pages: one key each, in the matrix's order (in 48 h: 6 reports of the tuned key, 4 of the other)
    pages = [httpx.get(f"{server}/v1/fleet", params={"hours": 48, "limit": 1, "offset": offset, "wanted_limit": 1,
                                                      "wanted_offset": offset}, timeout=30).json()
             for offset in range(3)]
    assert [[k["key"]["model"] for k in page["keys"]] for page in pages] == [[tuned_key.model], [wanted_key.model], []]
    assert [len(page["wanted"]) for page in pages] == [1, 0, 0]
    assert {(page["total_keys"], page["total_wanted"]) for page in pages} == {(2, 1)}
    assert [page["offset"] for page in pages] == [0, 1, 2] and {page["limit"] for page in pages} == {1}

    printed = tunecache("fleet", "--server", server, check=True).stdout
    assert "fleet over the last 24 h" in printed and "wanted (pods asked, no usable tuning):" in printed
    assert ": 2 keys, 1 wanted tuning" in printed.splitlines()[0]
    matrix_row = next(line for line in printed.splitlines() if line.startswith(wanted_key.model)).split()
    assert "none" in matrix_row and "0%" in matrix_row  # reported, never installed
    assert "model: stored meta-llama/Llama-3.1-8B, yours Qwen/Qwen3-30B-A3B" in printed.splitlines()[-1]
    assert json.loads(tunecache("fleet", "--server", server, "--json", "--hours", "48", check=True).stdout)["hours"] == 48

    first = tunecache("fleet", "--server", server, "--hours", "48", "--limit", "1", check=True)
    assert "keys 1-1 of 2, 1 wanted tuning" in first.stdout.splitlines()[0]
    assert "next page: --offset 1 --limit 1" in first.stderr
    second = tunecache("fleet", "--server", server, "--hours", "48", "--limit", "1", "--offset", "1", check=True)
    assert "keys 2-2 of 2, no wanted tunings past 1 of 1" in second.stdout.splitlines()[0]
    assert "wanted: none past 1 of 1" in second.stdout and "next page" not in second.stderr
    assert next(line for line in second.stdout.splitlines()[1:] if line.strip()).startswith("KEY")
    assert wanted_key.model in second.stdout and tuned_key.model not in second.stdout
    whole = json.loads(tunecache("fleet", "--server", server, "--hours", "48", "--all", "--json", check=True).stdout)
    assert [k["key"]["model"] for k in whole["keys"]] == [tuned_key.model, wanted_key.model]
    assert (whole["total_keys"], whole["offset"], len(whole["wanted"]), whole["total_wanted"]) == (2, 0, 1, 1)
    both = tunecache("fleet", "--server", server, "--all", "--offset", "1")
    assert both.returncode == 2 and "--offset" in both.stderr and "--all" in both.stderr
    assert tunecache("fleet", "--server", server, "--limit", "1001").returncode == 2


def _reads_whole(plan: list[str], table: str) -> bool:
    """Whether the plan reads ``table`` whole (PostgreSQL: a sequential scan; SQLite: a scan
    without an index)."""
    return any(step.startswith(f"Seq Scan on {table}") or "Seq Scan on " + table in step or step == f"SCAN {table}"
               for step in plan)


def test_history_and_fleet_queries_are_answered_from_indexes(engine):
    """Every query of the history and the fleet reaches ``tuning_runs`` and ``pod_reports``
    (the tables that grow) through an index, never by reading them whole; the history's
    order and cursor come from ``(created_at, id)``."""
    from sqlalchemy import delete

    from tunecache.service.models import PodReport

    week_ago = NOW - dt.timedelta(days=7)
    history = {
        "newest first": repository.history_page_query(TuningRunQuery(), None, 50),
        "after a cursor": repository.history_page_query(TuningRunQuery(), (week_ago, 123), 50),
        "by key fields and time": repository.history_page_query(
            TuningRunQuery(model="m", gpu_name="NVIDIA H200", status="succeeded", since=week_ago), None, 50),
        "by an environment field": repository.history_page_query(
            TuningRunQuery(flashinfer_version="0.7.4", trigger="cli"), (week_ago, 9), 50),
    }
    fleet = {
        "hit rates": (reports.report_counts(week_ago), "ix_pod_reports_received_key"),
        "wanted": (reports.miss_groups(week_ago), "ix_pod_reports_outcome_received"),
        "retention": (delete(PodReport).where(PodReport.received_at < week_ago), "ix_pod_reports_received_key"),
    }
    with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            # Empty tables: PostgreSQL may cost sorting no rows as low as reading the index in order
            # (it did once tuning_runs grew two columns); what is asserted is that the order and the
            # cursor can come from (created_at, id), as they do for a history of any size.
            connection.execute(text("SET LOCAL enable_sort = off"))
        for statement in (history["newest first"], history["after a cursor"]):
            assert any("ix_tuning_runs_created_id" in step for step in plan_of(connection, statement))
        if connection.dialect.name == "postgresql":
            connection.execute(text("SET LOCAL enable_sort = on"))
        for name, statement in history.items():
            plan = plan_of(connection, statement)
            assert any("ix_tuning_runs_" in step for step in plan), (name, plan)
            assert not _reads_whole(plan, "tuning_runs"), (name, plan)
        for name, (statement, index) in fleet.items():
            plan = plan_of(connection, statement)
            assert any(index in step for step in plan), (name, plan)
            assert not _reads_whole(plan, "pod_reports"), (name, plan)
        plan = plan_of(connection, reports.CURRENT_RUNS)  # the matrix: every current tuning, by primary keys
        assert not any(_reads_whole(plan, table) for table in ("tuning_runs", "tuning_keys", "environments")), plan


def test_csv_cells_a_spreadsheet_would_run_as_formulas_are_neutralised(server):
    """Issue 21: a model named ``=HYPERLINK(...)`` (any text cell starting with = + - @, tab or
    CR) is exported with a leading ``'``, as spreadsheets take it for text; the JSON keeps it."""
    _upload(server)
    model = '=HYPERLINK("http://evil.example/","open me")'
    run = _record(server, h200_key(model=model, gpu_name="@NVIDIA H200"), node="+node")
    failed = _record(server, h200_key(model=model, max_num_batched_tokens=4096), status="failed",
                     error="-2+3 (see the log)", node="\tnode")
    assert httpx.get(f"{server}/v1/tunings/{run['id']}", timeout=30).json()["key"]["model"] == model
    for printed in (as_admin.get(f"{server}/v1/tunings", params={"format": "csv"}, timeout=30).text,
                    tunecache("history", "--server", server, "--csv", check=True).stdout):
        header, *rows = list(csv.reader(io.StringIO(printed)))
        cells = {int(row[0]): dict(zip(header, row)) for row in rows}
        assert set(cells) == {run["id"], failed["id"]}
        assert (cells[run["id"]]["model"], cells[run["id"]]["gpu_name"], cells[run["id"]]["node"]) == (
            "'" + model, "'@NVIDIA H200", "'+node")
        assert (cells[failed["id"]]["error"], cells[failed["id"]]["node"]) == ("'-2+3 (see the log)", "'\tnode")
        assert cells[run["id"]]["max_num_batched_tokens"] == "8192" and cells[run["id"]]["status"] == "succeeded"
        assert not [cell for row in rows for cell in row if cell[:1] in ("=", "+", "-", "@", "\t", "\r")]


def test_history_and_fleet_print_control_characters_escaped(server):
    """Issue 21: what a pod reported anonymously (or a run recorded) reaches an operator's
    terminal with its control characters escaped, never as escape sequences."""
    _upload(server)
    _record(server, h200_key(gpu_name="NVIDIA H200\x1b]0;owned\x07"))
    env = file_environment(CUDNN_FILE)
    hostile_env = EnvironmentMetadata(**(env.model_dump() | {"cuda_version": "12.9\x1b[2J\x9b31m"}))
    report = _report(h200_key(model="evil/model", gpu_name="\x1b[31mNVIDIA H200"), hostile_env, ReportOutcome.MISS,
                     "pod-\x1b[8m", differences=[{"field": "cuda_version", "stored": "12.8", "yours": "12.9\x1b[2J"}])
    sent = httpx.post(f"{server}/v1/reports", content=report.model_dump_json(), timeout=30,
                      headers={"content-type": "application/json"})
    assert sent.status_code in (201, 202), sent.text
    deadline = dt.datetime.now() + dt.timedelta(seconds=60)  # reports are stored in batches
    while httpx.get(f"{server}/v1/fleet", timeout=30).json()["total_wanted"] == 0:
        assert dt.datetime.now() < deadline, "the report was never stored"
        time.sleep(0.1)
    fleet = tunecache("fleet", "--server", server, check=True)
    history = tunecache("history", "--server", server, check=True)
    for printed in (fleet.stdout + fleet.stderr, history.stdout + history.stderr):
        assert not [c for c in printed if c not in "\n" and (c < " " or "\x7f" <= c <= "\x9f")], printed
    assert "NVIDIA H200\\x1b]0;owned\\x07 (sm90)" in history.stdout
    assert "\\x1b[31mNVIDIA H200 (sm90)" in fleet.stdout and "cuda 12.9\\x1b[2J\\x9b31m" in fleet.stdout
    assert "yours 12.9\\x1b[2J" in fleet.stdout
