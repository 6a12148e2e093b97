"""Which entries of FlashInfer's autotune file changed tactic between two tuning runs.

The comparison behind ``GET /v1/tunings/{run_a}/diff/{run_b}`` (the route reads the two
files and calls :func:`diff_runs`; ``tunecache diff`` shows its answer): read each file's
entries and their keys (:func:`tunecache.formats.autotune_file.read_entries`), compare
them (:func:`diff_entries`) and decide, entry by entry, whether a changed tactic is a
regression (:func:`judge_change`).

An entry's ``policy`` (``AutoTuner._profiling_policy``) and ``selection``
(``AutoTuner._selection_record``: ``time_ms``, ``runner_up_ms``, ``margin``) are absent
from files older FlashInfer versions wrote: such entries have no recorded times and are
never judged a regression.

Pure Python: no evaluation of file contents, no FlashInfer import.
"""

from __future__ import annotations

import json
from typing import Any

from tunecache.contract import (
    EntryChange,
    TacticChange,
    TuningRunDiff,
    TuningRunDiffSummary,
    TuningRunRead,
    differences,
)
from tunecache.formats.autotune_file import AutotuneEntry, read_entries


def _canonical(value: Any) -> str:
    """JSON text that is equal exactly when two tactics are (``0`` is not ``false``)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def judge_change(a: AutotuneEntry, b: AutotuneEntry) -> tuple[bool, str | None]:
    """Whether an entry whose tactic changed from ``a`` to ``b`` is a regression, and a short
    note saying why (or why it cannot be told).

    The rule, "slower beyond its recorded margin" (justified on
    :class:`~tunecache.contract.TacticChange`): both ``time_ms`` recorded, at least one
    ``margin`` recorded, the same measurement ``policy`` in both, and
    ``b.time_ms > a.time_ms * (1 + max(|a.margin|, |b.margin|))`` (margins not recorded
    left out of the max).

    Notes: ``"no recorded times"`` (neither entry has a time), ``"no recorded time in a"``
    / ``"... in b"``, ``"measured under different policies"`` (times not comparable),
    ``"faster"``, ``"no recorded margin"`` (slower, but no margin to judge by),
    ``"within the recorded margin M%"`` (a near-tie) or ``"beyond the recorded margin M%"``.
    """
    if a.time_ms is None and b.time_ms is None:
        return False, "no recorded times"
    if a.time_ms is None or b.time_ms is None:
        return False, f"no recorded time in {'a' if a.time_ms is None else 'b'}"
    if a.policy != b.policy:
        return False, "measured under different policies"
    if b.time_ms < a.time_ms:
        return False, "faster"
    margins = [abs(m) for m in (a.margin, b.margin) if m is not None]
    if not margins:
        return False, "no recorded margin"
    margin = max(margins)
    if b.time_ms > a.time_ms * (1 + margin):
        return True, f"beyond the recorded margin {margin * 100:.2f}%"
    return False, f"within the recorded margin {margin * 100:.2f}%"


def _change(status: EntryChange, a: AutotuneEntry | None, b: AutotuneEntry | None) -> TacticChange:
    either = a or b
    assert either is not None
    regression, note = judge_change(a, b) if a is not None and b is not None else (False, None)
    slowdown = None
    if a is not None and b is not None and a.time_ms is not None and b.time_ms is not None:
        slowdown = round(b.time_ms / a.time_ms - 1, 6)
    key = either.key
    return TacticChange(
        status=status,
        op=key.op if key else either.file_key,
        runner=key.runner if key else either.runner,
        bucket=key.bucket if key else "",
        shapes=[list(shape) for shape in key.shapes] if key else None,
        extras=key.extras_text if key else "",
        file_key=either.file_key,
        tactic_a=a.tactic if a else None,
        tactic_b=b.tactic if b else None,
        time_ms_a=a.time_ms if a else None,
        time_ms_b=b.time_ms if b else None,
        margin_a=a.margin if a else None,
        margin_b=b.margin if b else None,
        slowdown=slowdown,
        regression=regression,
        note=note,
    )


def diff_entries(a: dict[str, AutotuneEntry], b: dict[str, AutotuneEntry]) -> tuple[list[TacticChange], int]:
    """The entries added (only in ``b``), removed (only in ``a``) and changed (another
    tactic), ordered by op, runner and shapes, and the number of entries with the same
    tactic in both. Entries are matched by their exact key, as FlashInfer looks them up."""
    changes: list[tuple[tuple, TacticChange]] = []
    unchanged = 0
    for file_key in a.keys() | b.keys():
        ea, eb = a.get(file_key), b.get(file_key)
        if ea is not None and eb is not None:
            if _canonical(ea.tactic) == _canonical(eb.tactic):
                unchanged += 1
                continue
            status = EntryChange.CHANGED
        else:
            status = EntryChange.REMOVED if eb is None else EntryChange.ADDED
        changes.append(((ea or eb).order(), _change(status, ea, eb)))
    changes.sort(key=lambda pair: pair[0])
    return [change for _, change in changes], unchanged


def diff_runs(run_a: TuningRunRead, file_a: bytes, run_b: TuningRunRead, file_b: bytes) -> TuningRunDiff:
    """How run ``b``'s FlashInfer autotune file (``file_b``, its bytes) differs from run
    ``a``'s: every added, removed and changed entry (:func:`diff_entries`) with each run's
    recorded times and margins and a regression flag (:func:`judge_change`), the key and
    environment fields in which the runs differ, and the counts.

    Raises:
        tunecache.formats.autotune_file.NotAnAutotuneFile: a file is not a FlashInfer autotune file (the message names its run).
    """
    a = read_entries(file_a, source=f"run {run_a.id}'s FlashInfer file")
    b = read_entries(file_b, source=f"run {run_b.id}'s FlashInfer file")
    entries, unchanged = diff_entries(a, b)
    summary = TuningRunDiffSummary(
        entries_a=len(a),
        entries_b=len(b),
        added=sum(e.status is EntryChange.ADDED for e in entries),
        removed=sum(e.status is EntryChange.REMOVED for e in entries),
        changed=sum(e.status is EntryChange.CHANGED for e in entries),
        unchanged=unchanged,
        regressions=sum(e.regression for e in entries),
        timed_a=sum(e.time_ms is not None for e in a.values()),
        timed_b=sum(e.time_ms is not None for e in b.values()),
    )
    return TuningRunDiff(
        run_a=run_a.id,
        run_b=run_b.id,
        key_a=run_a.key,
        key_b=run_b.key,
        environment_hash_a=run_a.environment_hash,
        environment_hash_b=run_b.environment_hash,
        differences=differences(run_a.key, run_a.environment, run_b.key, run_b.environment),
        entries=entries,
        summary=summary,
    )
