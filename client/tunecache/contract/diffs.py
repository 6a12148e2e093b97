"""Run diffs (``GET /v1/tunings/{a}/diff/{b}``): how the FlashInfer autotune files of two
stored runs differ, entry by entry."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from tunecache.contract.identity import FieldDifference, StrEnum, TuningKey


class EntryChange(StrEnum):
    """How one entry of FlashInfer's autotune file differs between run ``a`` and run ``b``
    of a diff. Entries are matched by their exact file key, as ``AutoTuner`` looks them up.

    * ``added``: only in ``b``; ``removed``: only in ``a`` (a pod of ``b`` runs that bucket
      on FlashInfer's default tactic);
    * ``changed``: in both, with another tactic. Entries with the same tactic in both are
      only counted (:attr:`TuningRunDiffSummary.unchanged`).
    """

    ADDED = "added"
    REMOVED = "removed"
    CHANGED = "changed"


class TacticChange(BaseModel):
    """One entry of FlashInfer's autotune file that differs between the two runs of a diff.

    Which entry, from its file key ``str((op, runner_class, nearest_profile, extras))``
    (``flashinfer/autotuner/autotuner.py``: ``ProfilingCacheKey.file_key``, written by
    ``AutoTuner.save_configs``), read without evaluating it:

    * ``op``: FlashInfer's custom op, e.g. ``bf16_gemm``; ``runner``: the runner class,
      e.g. ``CudnnBf16GemmRunner``;
    * ``shapes``: ``nearest_profile``, the input shapes with each tuned dimension mapped to
      its bucket (``-1``: a dimension a constraint derives); ``bucket``: the same, readable,
      ``AxB`` per input (``1024x4096 4096x14336 0 0 -1x14336 -1``): the file does not say
      which dimension is the tuned one, so every one is shown;
    * ``extras``: the runner's further key fields as FlashInfer wrote them
      (``torch.bfloat16, False, True, True``); ``file_key``: the key itself.

    A key that cannot be read keeps ``op`` = ``file_key``, ``runner`` = the entry's runner
    class, ``shapes`` = ``None``.

    What each run chose and measured (``_a`` / ``_b``; ``None`` on the side without the
    entry, and where the file records nothing: FlashInfer before 0.7.4 writes no
    ``selection`` record):

    * ``tactic``: FlashInfer's tactic as JSON (an int; a list for compound tactics);
    * ``time_ms``: the chosen tactic's measured time, milliseconds;
    * ``margin``: how far it was ahead of the fastest other candidate, relative
      (``runner_up_ms / time_ms - 1``; negative when FlashInfer's tie tolerance kept an
      earlier tactic over a slightly faster one; ``None`` with a single candidate).

    ``slowdown``: ``time_ms_b / time_ms_a - 1`` when both times are recorded (``0.05``:
    ``b`` is 5 % slower).

    ``regression`` ("slower beyond its recorded margin"): ``status`` is ``changed``, both
    times and at least one margin are recorded, both were measured under the same policy
    (``[runner, tactic, policy, selection]``'s ``policy``: CUDA-graph replays, L2 cache),
    and ``time_ms_b > time_ms_a * (1 + m)`` with ``m`` the larger of ``|margin_a|`` and
    ``|margin_b|``. Why: each run's margin is how far apart its tuner itself measured its
    best two candidates. A re-tune that picks another tactic whose time is within that gap
    picked between candidates the tuner could not tell apart (two fresh tunings of one key
    differ in many such near-tied entries, with margins well under 1 %); only a slowdown
    beyond the larger of the two gaps is more than such a flip. The absolute value keeps a
    negative margin's gap (a tie FlashInfer settled by tolerance) as wide as it was.
    ``note`` says why a regression could not be decided, when it could not (e.g.
    ``"no recorded times"``).
    """

    status: EntryChange
    op: str
    runner: str
    bucket: str
    shapes: list[list[int]] | None = None
    extras: str = ""
    file_key: str
    tactic_a: Any = None
    tactic_b: Any = None
    time_ms_a: float | None = None
    time_ms_b: float | None = None
    margin_a: float | None = None
    margin_b: float | None = None
    slowdown: float | None = None
    regression: bool = False
    note: str | None = None


class TuningRunDiffSummary(BaseModel):
    """Counts of a run diff: entries in each file, how many were ``added``, ``removed``,
    ``changed`` (another tactic) or ``unchanged`` (same tactic), how many changes are
    ``regressions``, and how many entries of each file record a time (``timed_a``,
    ``timed_b``; 0: the file has no recorded times, so nothing in it can be a regression)."""

    entries_a: int
    entries_b: int
    added: int
    removed: int
    changed: int
    unchanged: int
    regressions: int
    timed_a: int
    timed_b: int


class TuningRunDiff(BaseModel):
    """Answer of ``GET /v1/tunings/{run_a}/diff/{run_b}``: how run ``b``'s FlashInfer
    autotune file differs from run ``a``'s, entry by entry.

    ``differences``: every key and environment field in which the runs differ
    (:func:`differences` with ``a`` as ``stored`` and ``b`` as ``yours``): times measured in
    different environments are not comparable one to one. ``entries``: the added, removed
    and changed entries (:class:`TacticChange`), ordered by op, runner and shapes.
    """

    run_a: int
    run_b: int
    key_a: TuningKey
    key_b: TuningKey
    environment_hash_a: str
    environment_hash_b: str
    differences: list[FieldDifference]
    entries: list[TacticChange]
    summary: TuningRunDiffSummary
