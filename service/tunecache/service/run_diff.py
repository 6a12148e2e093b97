"""Which entries of FlashInfer's autotune file changed tactic between two tuning runs.

The comparison behind ``GET /v1/tunings/{run_a}/diff/{run_b}`` and the dashboard's diff page
(both call :func:`diff_stored_runs`, which reads the two stored files, bounded, and calls
:func:`diff_runs`; ``tunecache diff`` shows its answer): read each file's entries and their
keys (:func:`tunecache.formats.autotune_file.read_entries`), compare them
(:func:`diff_entries`) and decide, entry by entry, whether a changed tactic is a regression
(:func:`judge_change`).

An entry's ``policy`` (``AutoTuner._profiling_policy``) and ``selection``
(``AutoTuner._selection_record``: ``time_ms``, ``runner_up_ms``, ``margin``) are absent
from files older FlashInfer versions wrote: such entries have no recorded times and are
never judged a regression.

Pure Python: no evaluation of file contents, no FlashInfer import; only
:func:`diff_stored_runs` reads the database.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from tunecache.contract import (
    MAX_AUTOTUNE_FILE_BYTES,
    ArtifactKind,
    EntryChange,
    TacticChange,
    TuningRunDiff,
    TuningRunDiffSummary,
    TuningRunRead,
    differences,
)
from tunecache.formats.autotune_file import AutotuneEntry, NotAnAutotuneFile, read_entries
from tunecache.service import artifact_store, repository


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


# ------------------------------------------------------------------------- stored runs

#: Largest FlashInfer file a diff reads, in bytes: memory and time stay bounded whatever was
#: stored (runs recorded before the bound existed may hold larger ones).
MAX_DIFF_FILE_BYTES = MAX_AUTOTUNE_FILE_BYTES

#: Diffs one server process computes at once. Each holds both files and their parsed entries
#: (about 75 MiB at :data:`MAX_DIFF_FILE_BYTES`, bench/request_memory.py) and a core for
#: seconds; anyone may ask for one (a read), so more at once would multiply both. Another
#: diff meanwhile is refused (:class:`DiffsBusy`: 503 with ``Retry-After``; the client retries it).
DIFFS_AT_ONCE = 1


class RunsNotFound(LookupError):
    """A run to diff does not exist (HTTP 404; the message names every missing one)."""


class CannotDiff(ValueError):
    """A run has no FlashInfer autotune file to diff, one not stored, one over
    :data:`MAX_DIFF_FILE_BYTES` or one that is not a FlashInfer file (HTTP 422; the message
    names the run)."""


class DiffsBusy(RuntimeError):
    """This server process is computing :data:`DIFFS_AT_ONCE` diffs already (HTTP 503 with
    ``Retry-After``)."""


def diff_stored_runs(sessions: sessionmaker[Session], slots: threading.BoundedSemaphore, run_a: int,
                     run_b: int) -> TuningRunDiff:
    """:func:`diff_runs` of stored runs ``run_a`` and ``run_b``, in one of the process's
    ``slots`` (:data:`DIFFS_AT_ONCE`): each file read up to :data:`MAX_DIFF_FILE_BYTES`, in one
    short transaction; the comparison after it, holding no database connection.

    Raises:
        DiffsBusy: every slot is taken.
        RunsNotFound, CannotDiff: as they say.
    """
    if not slots.acquire(blocking=False):
        raise DiffsBusy(f"this server process is computing another diff (at most {DIFFS_AT_ONCE} at once)")
    try:
        with sessions.begin() as session:
            runs = {run_id: repository.get_run(session, run_id) for run_id in (run_a, run_b)}
            missing = [run_id for run_id, run in runs.items() if run is None]
            if missing:
                raise RunsNotFound(f"no tuning run{'s' if len(missing) > 1 else ''} "
                                   f"{' and '.join(str(run_id) for run_id in missing)}")
            files = {run_id: _autotune_file(session, run) for run_id, run in runs.items()}
        try:
            return diff_runs(runs[run_a], files[run_a], runs[run_b], files[run_b])
        except NotAnAutotuneFile as exc:
            raise CannotDiff(str(exc)) from None
    finally:
        slots.release()


def _autotune_file(session: Session, run: TuningRunRead) -> bytes:
    """The bytes of the run's FlashInfer autotune file.

    Raises:
        CannotDiff: it has none, they are not stored, or they are over :data:`MAX_DIFF_FILE_BYTES`.
    """
    artifact = run.artifact(ArtifactKind.FLASHINFER_AUTOTUNE)
    if artifact is None:
        raise CannotDiff(f"run {run.id} ({run.status}) has no FlashInfer autotune file "
                         f"({ArtifactKind.FLASHINFER_AUTOTUNE} artifact) to diff")
    size = artifact_store.blob_size(session, artifact.sha256)
    if size is None:
        raise CannotDiff(f"run {run.id}'s FlashInfer autotune file (sha256 {artifact.sha256}) is not stored")
    if size > MAX_DIFF_FILE_BYTES:
        raise CannotDiff(f"run {run.id}'s FlashInfer autotune file is {size} bytes; "
                         f"a diff reads at most {MAX_DIFF_FILE_BYTES}")
    return artifact_store.read_blob(session, artifact.sha256) or b""
