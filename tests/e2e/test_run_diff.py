"""Run diff (``GET /v1/tunings/{run_a}/diff/{run_b}``, ``tunecache diff``) with the real H200
FlashInfer files and files derived from them: every key of both fixtures read as Python's
own parser reads it, the regression rule at its boundary, and the route and the CLI on a
live ``tunecache serve`` (404/422 bodies, the table, ``--json``, exit codes)."""

from __future__ import annotations

import ast
import copy
import hashlib
import json
from pathlib import Path

import httpx
import pytest

from tests.support.cli import tunecache
from tests.support.paths import CUBLASLT_FILE, CUDNN_FILE
from tests.support.serve import as_admin
from tests.support.builders import h200_key, run_payload
from tunecache.contract import TuningRunDiff
from tunecache.formats.autotune_file import AutotuneEntry, NotAnAutotuneFile, read_entries
from tunecache.formats.file_key import BadFileKey, Name, parse_file_key
from tunecache.service.run_diff import diff_entries, judge_change

# What this module tests is the diff of two files: its server runs on SQLite only (tests/conftest.py); blob
# storage runs on both databases in tests/unit/service/test_repository.py.
SERVER_DATABASE_INCIDENTAL = True

MODEL = "meta-llama/Llama-3.1-8B"
FIXTURE_FILES = [CUDNN_FILE, CUBLASLT_FILE]


# ----------------------------------------------------------------------------- oracle


def _literal(node: ast.AST):
    """A key's value as Python's own parser sees it (nothing evaluated): dotted names as text."""
    if isinstance(node, ast.Tuple):
        return tuple(_literal(e) for e in node.elts)
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_literal(node.operand)
    if isinstance(node, ast.Attribute):
        return f"{_literal(node.value)}.{node.attr}"
    if isinstance(node, ast.Name):
        return node.id
    raise AssertionError(f"unexpected node {ast.dump(node)}")


def _oracle(file_key: str) -> tuple:
    return _literal(ast.parse(file_key, mode="eval").body)


def _entries(path: Path) -> dict[str, list]:
    return {k: v for k, v in json.loads(path.read_text()).items() if not k.startswith("_")}


# ----------------------------------------------------------------------------- parser


@pytest.mark.parametrize("path", FIXTURE_FILES, ids=lambda p: p.name)
def test_every_fixture_key_is_read_as_pythons_parser_reads_it_and_round_trips(path):
    entries = _entries(path)
    assert len(entries) == 42
    for file_key, value in entries.items():
        key = parse_file_key(file_key)
        op, runner, shapes, extras = _oracle(file_key)
        assert (key.op, key.runner, key.shapes) == (op, runner, shapes), file_key
        assert key.runner == value[0]  # save_configs writes the key's runner class as the entry's runner
        assert [e.text if isinstance(e, Name) else e for e in key.extras] == list(extras), file_key
        assert key.text() == file_key
        assert key.bucket == " ".join("x".join(map(str, shape)) for shape in shapes)
    # read_entries keeps every entry, with FlashInfer 0.7.4's selection record as written
    read = read_entries(path.read_bytes())
    assert list(read) == list(entries)
    for file_key, entry in read.items():
        runner, tactic, policy, selection = entries[file_key]
        assert (entry.runner, entry.tactic, entry.policy) == (runner, tactic, policy)
        assert (entry.time_ms, entry.runner_up_ms, entry.margin, entry.candidates) == (
            selection["time_ms"], selection["runner_up_ms"], selection["margin"], selection["candidates"])


def test_keys_of_older_flashinfer_and_unusual_extras_round_trip():
    for text in [
        "('bf16_gemm', 'CudnnBf16GemmRunner', ((1, 4096), (4096, 4096)))",  # before extras existed
        "('fused_moe', 'CutlassMoERunner', ((8, 7168), (), (-1, 8)), (<ActivationType.Swiglu: 3>, None, 1e-05, -inf))",
        "('op', 'R', ((1,),), ('it\\'s \"quoted\"', [1, (2,)], {'k': 1.5}, torch.float8_e4m3fn, False))",
    ]:
        key = parse_file_key(text)
        assert key.text() == text
    older = parse_file_key("('bf16_gemm', 'CudnnBf16GemmRunner', ((1, 4096), (4096, 4096)))")
    assert (older.has_extras, older.extras, older.bucket) == (False, (), "1x4096 4096x4096")


@pytest.mark.parametrize("text", [
    "__import__('os').system('touch /tmp/pwned')",
    "('op', 'R', ((1,),), (open('x'),))",
    "('op', 'R', ((1, True),), ())",  # a shape of a boolean
    "('op', 'R', ((1,),), (), 'one too many')",
    "['op', 'R', ((1,),), ()]",
    "('op', 'R', ((1,),), {1, 2})",
    "('op', 'R', ((1,),), ()",
    "(" * 40 + ")" * 40,
    "('op', 'R', ((" + "1, " * 10000 + "),), ())",
])
def test_keys_that_are_not_flashinfer_keys_are_refused_not_evaluated(text, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(BadFileKey):
        parse_file_key(text)
    assert not Path("/tmp/pwned").exists() and not (tmp_path / "x").exists()


def test_an_unreadable_key_is_still_diffed_by_its_text_and_a_bad_entry_is_named():
    a = read_entries(json.dumps({"_metadata": {}, "not a tuple": ["SomeRunner", 3]}).encode())
    b = read_entries(json.dumps({"_metadata": {}, "not a tuple": ["SomeRunner", [3]]}).encode())
    assert (a["not a tuple"].key, a["not a tuple"].tactic, a["not a tuple"].time_ms) == (None, 3, None)
    (change,), unchanged = diff_entries(a, b)
    assert unchanged == 0
    assert (change.status, change.op, change.runner, change.bucket, change.shapes, change.tactic_a, change.tactic_b,
            change.note) == ("changed", "not a tuple", "SomeRunner", "", None, 3, [3], "no recorded times")
    with pytest.raises(NotAnAutotuneFile, match="entry 'k' is not"):
        read_entries(json.dumps({"k": "CudnnRunner"}).encode(), source="f")
    with pytest.raises(NotAnAutotuneFile, match="not JSON"):
        read_entries(b"\xff{")


# ----------------------------------------------------------------------------- the rule


def _entry(time_ms, margin, tactic=0, policy=("cuda_graph_profile_replays", 1, "l2_cache_policy", "cold-chain:8")):
    return AutotuneEntry(file_key="k", key=None, runner="R", tactic=tactic, policy=list(policy) if policy else None,
                         time_ms=time_ms, margin=margin)


def test_slower_beyond_the_larger_recorded_margin_is_a_regression_and_within_it_is_not():
    a = _entry(0.100, 0.05)
    assert judge_change(a, _entry(0.104, 0.001, tactic=1)) == (False, "within the recorded margin 5.00%")
    assert judge_change(a, _entry(0.105, 0.001, tactic=1))[0] is False  # exactly at a's margin: a near-tie
    assert judge_change(a, _entry(0.1051, 0.001, tactic=1)) == (True, "beyond the recorded margin 5.00%")
    # the larger of the two margins counts, whichever run recorded it, and a negative margin by its size
    assert judge_change(_entry(0.100, 0.001), _entry(0.107, 0.08, tactic=1))[0] is False
    assert judge_change(_entry(0.100, -0.09), _entry(0.107, 0.001, tactic=1))[0] is False
    assert judge_change(_entry(0.100, -0.01), _entry(0.107, 0.001, tactic=1))[0] is True
    # faster is never a regression
    assert judge_change(_entry(0.100, 0.0), _entry(0.050, 0.0, tactic=1)) == (False, "faster")
    # nothing to judge by
    assert judge_change(_entry(None, None, policy=None), _entry(None, None, tactic=1, policy=None)) == (
        False, "no recorded times")
    assert judge_change(_entry(None, None, policy=None), _entry(0.2, 0.0, tactic=1)) == (False, "no recorded time in a")
    assert judge_change(_entry(0.1, None), _entry(0.2, None, tactic=1)) == (False, "no recorded margin")
    assert judge_change(_entry(0.1, 0.0), _entry(0.2, 0.0, tactic=1, policy=("l2_cache_policy", "hot"))) == (
        False, "measured under different policies")


# ----------------------------------------------------------------------------- live server


def _push(server: str, path: Path, **key_fields) -> int:
    """Store a FlashInfer file as a run through the API, as ``tunecache push`` does (upload
    the bytes, record the run); returns the run's id."""
    data = path.read_bytes()
    uploaded = as_admin.put(f"{server}/v1/artifacts/{hashlib.sha256(data).hexdigest()}", content=data)
    assert uploaded.status_code in (200, 201), uploaded.text
    recorded = as_admin.post(f"{server}/v1/tunings", json=run_payload(path, h200_key(model=MODEL, **key_fields)))
    assert recorded.status_code == 201, recorded.text
    return recorded.json()["id"]


def _other_tactic(entries: dict[str, list], tactic):
    return next(v[1] for v in entries.values() if v[1] != tactic)


class Derived:
    """A copy of the cuDNN fixture with, by margin as recorded: the entry of the largest margin
    re-tuned to another tactic within it, the next one to another tactic slower beyond it,
    and the third removed."""

    def __init__(self, tmp_path: Path):
        doc = json.loads(CUDNN_FILE.read_text())
        entries = {k: v for k, v in doc.items() if not k.startswith("_")}
        by_margin = sorted(entries, key=lambda k: entries[k][3]["margin"], reverse=True)
        self.within, self.beyond, self.removed = by_margin[:3]
        self.a = entries
        derived = copy.deepcopy(doc)
        for file_key, slower in ((self.within, 1 + entries[self.within][3]["margin"] / 2),
                                 (self.beyond, (1 + entries[self.beyond][3]["margin"]) * 1.2)):
            runner, tactic, policy, selection = derived[file_key]
            time_ms = round(selection["time_ms"] * slower, 6)
            derived[file_key] = [runner, _other_tactic(entries, tactic), policy,
                                 {"time_ms": time_ms, "runner_up_ms": round(time_ms * 1.001, 6), "margin": 0.001,
                                  "candidates": selection["candidates"]}]
        del derived[self.removed]
        self.b = {k: v for k, v in derived.items() if not k.startswith("_")}
        self.path = tmp_path / "retuned.json"
        self.path.write_text(json.dumps(derived, indent=2))


def _diff(server: str, a: int, b: int) -> httpx.Response:
    return httpx.get(f"{server}/v1/tunings/{a}/diff/{b}")


def _row(stdout: str, file_key: str) -> str:
    bucket = " ".join("x".join(map(str, shape)) for shape in _oracle(file_key)[2])
    rows = [line for line in stdout.splitlines() if f"  {bucket}  " in line]
    assert len(rows) == 1, (bucket, stdout)
    return rows[0]


def test_a_retune_with_a_near_tie_a_regression_and_a_removed_entry(server, tmp_path):
    derived = Derived(tmp_path)
    run_a, run_b = _push(server, CUDNN_FILE), _push(server, derived.path)

    answer = _diff(server, run_a, run_b)
    assert answer.status_code == 200, answer.text
    diff = TuningRunDiff.model_validate(answer.json())
    assert (diff.run_a, diff.run_b, diff.differences) == (run_a, run_b, [])
    assert diff.summary.model_dump() == {"entries_a": 42, "entries_b": 41, "added": 0, "removed": 1, "changed": 2,
                                         "unchanged": 39, "regressions": 1, "timed_a": 42, "timed_b": 41}
    by_key = {e.file_key: e for e in diff.entries}
    assert set(by_key) == {derived.within, derived.beyond, derived.removed}
    for file_key in (derived.within, derived.beyond):
        e, a, b = by_key[file_key], derived.a[file_key], derived.b[file_key]
        op, runner, shapes, _ = _oracle(file_key)
        assert (e.status, e.op, e.runner, e.shapes) == ("changed", op, runner, [list(s) for s in shapes])
        assert (e.tactic_a, e.tactic_b) == (a[1], b[1]) and e.tactic_a != e.tactic_b
        assert (e.time_ms_a, e.time_ms_b, e.margin_a, e.margin_b) == (a[3]["time_ms"], b[3]["time_ms"],
                                                                     a[3]["margin"], b[3]["margin"])
        assert e.slowdown == pytest.approx(b[3]["time_ms"] / a[3]["time_ms"] - 1, abs=1e-6)
    assert by_key[derived.within].regression is False and by_key[derived.within].note.startswith("within")
    assert by_key[derived.within].slowdown > 0  # slower, but within the margin: a near-tie, not a regression
    assert by_key[derived.beyond].regression is True and by_key[derived.beyond].note.startswith("beyond")
    removed = by_key[derived.removed]
    assert (removed.status, removed.tactic_a, removed.tactic_b, removed.time_ms_a, removed.time_ms_b, removed.regression) == (
        "removed", derived.a[derived.removed][1], None, derived.a[derived.removed][3]["time_ms"], None, False)
    # ordered by op, runner, then shapes numerically
    assert [e.shapes for e in diff.entries] == sorted(e.shapes for e in diff.entries)

    # the other way round: the removed entry is added, and both changes are speed-ups
    back = TuningRunDiff.model_validate(_diff(server, run_b, run_a).json())
    assert (back.summary.added, back.summary.removed, back.summary.changed, back.summary.regressions) == (1, 0, 2, 0)
    assert {e.file_key: e.status for e in back.entries}[derived.removed] == "added"
    assert {e.file_key: e.note for e in back.entries if e.status == "changed"} == {derived.within: "faster",
                                                                                  derived.beyond: "faster"}

    # the CLI: a table, a summary line, exit 0; --fail-on-regression exits 18 in one line
    shown = tunecache("diff", str(run_a), str(run_b), "--server", server)
    assert shown.returncode == 0, shown.stderr
    assert "REGRESSION (beyond the recorded margin" in _row(shown.stdout, derived.beyond)
    assert "REGRESSION" not in _row(shown.stdout, derived.within)
    assert "within the recorded margin" in _row(shown.stdout, derived.within)
    tactics = f"{json.dumps(derived.a[derived.beyond][1], separators=(',', ':'))} -> " \
              f"{json.dumps(derived.b[derived.beyond][1], separators=(',', ':'))}"
    assert tactics in _row(shown.stdout, derived.beyond)
    assert _row(shown.stdout, derived.removed).startswith("removed")
    assert shown.stdout.splitlines()[-1] == (f"42 entries in run {run_a}, 41 in run {run_b}: 0 added, 1 removed, "
                                             f"2 changed tactic, 39 unchanged; 1 regression")
    failing = tunecache("diff", str(run_a), str(run_b), "--server", server, "--fail-on-regression")
    assert failing.returncode == 18 and failing.stdout == shown.stdout
    assert failing.stderr == (f"tunecache: error: 1 regression (--fail-on-regression): run {run_b} is slower than "
                              f"run {run_a} beyond the recorded margin in 1 entry\n")
    assert tunecache("diff", str(run_b), str(run_a), "--server", server, "--fail-on-regression").returncode == 0

    as_json = tunecache("diff", str(run_a), str(run_b), "--server", server, "--json")
    assert as_json.returncode == 0 and TuningRunDiff.model_validate_json(as_json.stdout) == diff


def test_the_two_h200_files_differ_in_every_entry_and_in_the_key(server):
    cudnn, cublaslt = _push(server, CUDNN_FILE), _push(server, CUBLASLT_FILE, tensor_parallel_size=2)
    diff = TuningRunDiff.model_validate(_diff(server, cudnn, cublaslt).json())
    # another runner is another key to FlashInfer: every cuDNN entry removed, every cuBLASLt one added
    assert [(d.field, d.stored, d.yours) for d in diff.differences] == [("tensor_parallel_size", "1", "2")]
    assert {e.file_key for e in diff.entries if e.status == "removed"} == set(_entries(CUDNN_FILE))
    assert {e.file_key for e in diff.entries if e.status == "added"} == set(_entries(CUBLASLT_FILE))
    assert (diff.summary.changed, diff.summary.unchanged, diff.summary.regressions) == (0, 0, 0)
    assert {e.runner for e in diff.entries} == {"CudnnBf16GemmRunner", "CublasltBf16GemmRunner"}
    shown = tunecache("diff", str(cudnn), str(cublaslt), "--server", server)
    assert shown.returncode == 0 and "differs: tensor_parallel_size: 1 -> 2" in shown.stdout
    # the same run against itself: nothing changed
    same = TuningRunDiff.model_validate(_diff(server, cudnn, cudnn).json())
    assert same.entries == [] and same.summary.unchanged == 42
    assert "no entry changed tactic" in tunecache("diff", str(cudnn), str(cudnn), "--server", server).stdout


def test_files_without_recorded_times_show_changes_and_never_a_regression(server, tmp_path):
    doc = json.loads(CUDNN_FILE.read_text())
    old = {k: (v[:2] if not k.startswith("_") else v) for k, v in doc.items()}  # [runner, tactic]: before policy
    changed_key = next(k for k in old if not k.startswith("_"))
    retuned = copy.deepcopy(old)
    retuned[changed_key] = [old[changed_key][0], _other_tactic(_entries(CUDNN_FILE), old[changed_key][1])]
    (tmp_path / "old.json").write_text(json.dumps(old))
    (tmp_path / "old-retuned.json").write_text(json.dumps(retuned))
    run_old, run_retuned = _push(server, tmp_path / "old.json"), _push(server, tmp_path / "old-retuned.json")
    run_new = _push(server, CUDNN_FILE)

    diff = TuningRunDiff.model_validate(_diff(server, run_old, run_retuned).json())
    assert (diff.summary.changed, diff.summary.regressions, diff.summary.timed_a, diff.summary.timed_b) == (1, 0, 0, 0)
    (entry,) = diff.entries
    assert (entry.file_key, entry.time_ms_a, entry.time_ms_b, entry.note) == (changed_key, None, None, "no recorded times")
    shown = tunecache("diff", str(run_old), str(run_retuned), "--server", server, "--fail-on-regression")
    assert shown.returncode == 0, shown.stderr
    assert "no recorded times" in _row(shown.stdout, changed_key)
    assert shown.stdout.splitlines()[-1].endswith(
        f"0 regressions; run {run_old} has no recorded times; run {run_retuned} has no recorded times")
    # one side timed: still nothing to compare against
    mixed = TuningRunDiff.model_validate(_diff(server, run_retuned, run_new).json())
    (entry,) = mixed.entries
    assert entry.note == "no recorded time in a" and entry.regression is False and entry.time_ms_b is not None


def test_unknown_runs_are_404_and_runs_without_a_readable_file_are_422(server):
    run = _push(server, CUDNN_FILE)
    missing = _diff(server, run, 999999)
    assert missing.status_code == 404 and missing.json() == {"detail": "no tuning run 999999"}
    both = _diff(server, 999998, 999999)
    assert both.status_code == 404 and both.json() == {"detail": "no tuning runs 999998 and 999999"}
    assert _diff(server, 0, run).status_code == 422  # ids start at 1

    failed = as_admin.post(f"{server}/v1/tunings", json=run_payload(CUDNN_FILE, status="failed", artifacts=[],
                                                                      error="tuner died"))
    assert failed.status_code == 201, failed.text
    no_file = _diff(server, run, failed.json()["id"])
    assert no_file.status_code == 422
    assert no_file.json() == {"detail": f"run {failed.json()['id']} (failed) has no FlashInfer autotune file "
                                        f"(flashinfer_autotune_v1 artifact) to diff"}

    garbage = b"this is not JSON"
    sha = hashlib.sha256(garbage).hexdigest()
    assert as_admin.put(f"{server}/v1/artifacts/{sha}", content=garbage).status_code == 201
    body = run_payload(CUDNN_FILE)
    body["artifacts"][0]["sha256"] = sha
    # such a run is refused when it is recorded (so a diff never meets one recorded since)
    refused = as_admin.post(f"{server}/v1/tunings", json=body)
    assert refused.status_code == 422 and "is not JSON" in refused.json()["detail"]

    # the CLI: one line each, exit 5
    for a, b, says in ((run, 999999, "no tuning run 999999"), (run, failed.json()["id"], "has no FlashInfer autotune file")):
        result = tunecache("diff", str(a), str(b), "--server", server)
        assert result.returncode == 5 and result.stdout == ""
        assert result.stderr.count("\n") == 1 and result.stderr.startswith("tunecache: error: ") and says in result.stderr
