"""Which entries of FlashInfer's autotune file changed tactic between two tuning runs.

The pure comparison behind ``GET /v1/tunings/{run_a}/diff/{run_b}`` (the service reads the
two files and calls :func:`diff_runs`) and ``tunecache diff``: read each file's entries
(:func:`read_entries`), read each entry's key without evaluating it
(:func:`parse_file_key`), compare them (:func:`diff_entries`) and decide, entry by entry,
whether a changed tactic is a regression (:func:`judge_change`).

The file is FlashInfer's v1 autotune file, written by ``AutoTuner.save_configs``
(``flashinfer/autotuner/autotuner.py``, FlashInfer 0.7.4); this module only reads its
entries (loading it stays FlashInfer's job)::

    {"_metadata": {...}, "_generation": "<sha256>",            # underscore keys: bookkeeping
     "('bf16_gemm', 'CudnnBf16GemmRunner', ((1, 4096), (4096, 14336), (0,), (0,), (-1, 14336), (-1,)),
       (torch.bfloat16, False, True, True))": [runner_class, tactic, policy, selection], ...}

* the key is ``str(ProfilingCacheKey.key_fields)``: ``(custom_op, runner_class_name,
  nearest_profile, extras)``; files of FlashInfer before ``extras`` existed have
  ``(custom_op, runner_class_name, nearest_profile)``;
* ``tactic`` is ``_tactic_to_json(tactic)``: an int, or nested lists;
* ``policy`` (``AutoTuner._profiling_policy``, e.g. ``["cuda_graph_profile_replays", 1,
  "l2_cache_policy", "cold-chain:8"]``) and ``selection`` (``AutoTuner._selection_record``:
  ``{"time_ms", "runner_up_ms", "margin", "candidates"}``, milliseconds, ``margin =
  runner_up_ms / time_ms - 1``) are absent from files older FlashInfer versions wrote:
  such entries have no recorded times and are never judged a regression.

Pure Python (json, re): no evaluation of file contents, no FlashInfer import.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from tunecache.client.autotune_file import NotAnAutotuneFile
from tunecache.contract import (
    EntryChange,
    TacticChange,
    TuningRunDiff,
    TuningRunDiffSummary,
    TuningRunRead,
    differences,
)

#: Keys longer than this are not parsed (shown as they are); FlashInfer's are ~200 characters.
MAX_KEY_CHARS = 16 * 1024
#: Deepest nesting of brackets a key may have; FlashInfer's have 3.
MAX_KEY_DEPTH = 32


class BadFileKey(ValueError):
    """A file key that is not the ``str()`` of FlashInfer's ``(op, runner, shapes[, extras])`` tuple."""


@dataclass(frozen=True, repr=False)
class Name:
    """A bare name in a key, kept as written: ``torch.bfloat16``, ``inf``, or an opaque
    ``<ActivationType.Swiglu: 3>``. Its ``repr`` is its text, so a parsed key's ``str()``
    is the key again."""

    text: str

    def __repr__(self) -> str:
        return self.text


@dataclass(frozen=True)
class FileKey:
    """One entry's key, read: ``op`` (FlashInfer's custom op), ``runner`` (runner class),
    ``shapes`` (``nearest_profile``: bucketed input shapes), ``extras`` (the runner's further
    key fields; ints, floats, strings, ``True``/``False``/``None``, tuples, lists and dicts as
    Python values, anything else as a :class:`Name`). ``has_extras``: the key had its fourth
    field (FlashInfer files before it have three)."""

    op: str
    runner: str
    shapes: tuple[tuple[int, ...], ...]
    extras: tuple[Any, ...] = ()
    has_extras: bool = True

    def text(self) -> str:
        """The key as FlashInfer writes it: ``str()`` of the tuple."""
        fields = (self.op, self.runner, self.shapes, self.extras) if self.has_extras else (self.op, self.runner, self.shapes)
        return str(fields)

    @property
    def bucket(self) -> str:
        """The shapes, readable: ``AxB`` per input, space-separated (``1024x4096 4096x14336 0``)."""
        return " ".join("x".join(str(d) for d in shape) if shape else "()" for shape in self.shapes)

    @property
    def extras_text(self) -> str:
        """The extras as FlashInfer wrote them, without the parentheses: ``torch.bfloat16, False``."""
        return ", ".join(repr(value) for value in self.extras)


_TOKEN = re.compile(
    r"""\s*(?:
      (?P<punct>[()\[\]{},:])
    | (?P<string>'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*")
    | (?P<opaque>[bB](?:'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*")|<[^<>\n]*>)
    | (?P<number>-?(?:\d+\.\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|\d+)(?![\w.]))
    | (?P<name>-?[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)
    )""",
    re.VERBOSE,
)
_ESCAPE = re.compile(r"\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|.)", re.DOTALL)
_SIMPLE_ESCAPES = {"\\": "\\", "'": "'", '"': '"', "n": "\n", "r": "\r", "t": "\t", "a": "\a", "b": "\b",
                   "f": "\f", "v": "\v", "0": "\0"}
_CONSTANTS = {"True": True, "False": False, "None": None}
_CLOSE = {"(": ")", "[": "]", "{": "}"}


def _unescape(match: re.Match) -> str:
    code = match[1]
    if code[0] in "xuU" and len(code) > 1:
        return chr(int(code[1:], 16))
    return _SIMPLE_ESCAPES.get(code, match[0])


def _tokens(text: str) -> list[tuple[str, str]]:
    """``(kind, text)`` of each token; BadFileKey at the first character no token starts with."""
    tokens, pos = [], 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None or match.end() == pos:
            if not text[pos:].strip():
                break
            raise BadFileKey(f"unexpected {text[pos:pos + 20]!r} at character {pos}")
        tokens.append((match.lastgroup, match[match.lastgroup]))
        pos = match.end()
    return tokens


class _Parser:
    """Recursive descent over the tokens of one Python literal (tuples, lists, dicts,
    strings, numbers, names): the grammar of a ``repr``, nothing evaluated."""

    def __init__(self, text: str):
        self.tokens = _tokens(text)
        self.at = 0

    def _next(self) -> tuple[str, str]:
        if self.at >= len(self.tokens):
            raise BadFileKey("the key ends early")
        token = self.tokens[self.at]
        self.at += 1
        return token

    def _peek(self) -> str | None:
        return self.tokens[self.at][1] if self.at < len(self.tokens) and self.tokens[self.at][0] == "punct" else None

    def value(self, depth: int = 0) -> Any:
        if depth > MAX_KEY_DEPTH:
            raise BadFileKey(f"nested deeper than {MAX_KEY_DEPTH} levels")
        kind, text = self._next()
        if kind == "string":
            return _ESCAPE.sub(_unescape, text[1:-1])
        if kind == "number":
            return float(text) if any(c in text for c in ".eE") else int(text)
        if kind == "name":
            return _CONSTANTS[text] if text in _CONSTANTS else Name(text)
        if kind == "opaque":
            return Name(text)
        if text not in _CLOSE:
            raise BadFileKey(f"unexpected {text!r}")
        return self._container(text, depth + 1)

    def _container(self, opening: str, depth: int) -> Any:
        closing, items, pairs, trailing_comma = _CLOSE[opening], [], [], False
        while self._peek() != closing:
            item = self.value(depth)
            if opening == "{":
                if self._next() != ("punct", ":"):
                    raise BadFileKey("a set, or a dict entry without ':'")
                pairs.append((item, self.value(depth)))
            else:
                items.append(item)
            if self._peek() == closing:
                trailing_comma = False
                break
            if self._next() != ("punct", ","):
                raise BadFileKey(f"expected ',' or {closing!r}")
            trailing_comma = True
        self._next()
        if opening == "[":
            return items
        if opening == "{":
            try:
                return dict(pairs)
            except TypeError:
                raise BadFileKey("a dict with an unhashable key") from None
        if len(items) == 1 and not trailing_comma:
            return items[0]  # "(x)" is x, as in Python; a 1-tuple is written "(x,)"
        return tuple(items)

    def parse(self) -> Any:
        result = self.value()
        if self.at != len(self.tokens):
            raise BadFileKey(f"unexpected {self.tokens[self.at][1]!r} after the key")
        return result


def _is_shapes(value: Any) -> bool:
    return isinstance(value, tuple) and all(
        isinstance(shape, tuple) and all(isinstance(d, int) and not isinstance(d, bool) for d in shape)
        for shape in value
    )


def parse_file_key(text: str) -> FileKey:
    """Read a FlashInfer autotune file key (``str((op, runner, nearest_profile, extras))``,
    ``ProfilingCacheKey.file_key``) without evaluating it.

    A small tokenizer and recursive-descent parser of Python literals: names such as
    ``torch.bfloat16`` and opaque reprs such as ``<ActivationType.Swiglu: 3>`` stay text
    (:class:`Name`), so ``parse_file_key(k).text() == k`` for every key ``str()`` wrote.

    Raises:
        BadFileKey: longer than :data:`MAX_KEY_CHARS`, not a Python literal of the kinds
            above, or not a tuple ``(str, str, tuple of int tuples[, tuple])``.
    """
    if len(text) > MAX_KEY_CHARS:
        raise BadFileKey(f"key of {len(text)} characters (at most {MAX_KEY_CHARS} are read)")
    fields = _Parser(text).parse()
    if not isinstance(fields, tuple) or len(fields) not in (3, 4):
        raise BadFileKey("not a tuple (op, runner, shapes[, extras])")
    op, runner, shapes = fields[:3]
    extras = fields[3] if len(fields) == 4 else ()
    if not isinstance(op, str) or not isinstance(runner, str) or not _is_shapes(shapes) or not isinstance(extras, tuple):
        raise BadFileKey("not a tuple (op: str, runner: str, shapes: tuple of int tuples[, extras: tuple])")
    return FileKey(op=op, runner=runner, shapes=shapes, extras=extras, has_extras=len(fields) == 4)


@dataclass(frozen=True)
class AutotuneEntry:
    """One entry of a FlashInfer autotune file: its key (``file_key``; ``key`` read, or
    ``None`` when it cannot be), the chosen ``runner`` class and ``tactic`` (JSON as written),
    and what its ``policy`` and ``selection`` record (``None`` where the file has nothing):
    ``time_ms`` and ``runner_up_ms`` (milliseconds), ``margin`` (``runner_up_ms / time_ms - 1``),
    ``candidates``."""

    file_key: str
    key: FileKey | None
    runner: str
    tactic: Any
    policy: list[Any] | None = None
    time_ms: float | None = None
    runner_up_ms: float | None = None
    margin: float | None = None
    candidates: int | None = None

    def order(self) -> tuple:
        """Sort order: op, runner, shapes (numerically: buckets 1, 2, 4, ...), extras, key."""
        if self.key is None:
            return (self.file_key, self.runner, (), "", self.file_key)
        return (self.key.op, self.key.runner, self.key.shapes, self.key.extras_text, self.file_key)


def _number(value: Any, positive: bool = False) -> float | None:
    """A finite JSON number (not a boolean), else ``None``; with ``positive``, above 0 too."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value) if not positive or value > 0 else None


def read_entries(data: bytes, source: str = "file") -> dict[str, AutotuneEntry]:
    """The entries of a FlashInfer v1 autotune file by their key, in file order.

    Keys starting with ``_`` (``_metadata``, ``_generation``, ``_records``) are FlashInfer's
    bookkeeping and skipped. A value is ``[runner_class, tactic]``, optionally followed by
    ``policy`` (a list) and ``selection`` (an object: ``time_ms``, ``runner_up_ms``,
    ``margin``, ``candidates``); values of the wrong type in ``selection`` count as not
    recorded. A key that cannot be read (:func:`parse_file_key`) is kept with ``key=None``.

    Raises:
        NotAnAutotuneFile: not JSON, not an object, or an entry that is not
            ``[runner_class: str, tactic, ...]`` (named).
    """
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise NotAnAutotuneFile(f"{source} is not JSON: {exc}") from None
    except RecursionError:
        raise NotAnAutotuneFile(f"{source} is nested too deeply to be a FlashInfer autotune file") from None
    if not isinstance(doc, dict):
        raise NotAnAutotuneFile(f"{source} is not a FlashInfer autotune file (top level is not an object)")
    entries: dict[str, AutotuneEntry] = {}
    for file_key, value in doc.items():
        if file_key.startswith("_"):
            continue
        if not isinstance(value, list) or len(value) < 2 or not isinstance(value[0], str):
            raise NotAnAutotuneFile(f"{source}: entry {file_key[:120]!r} is not [runner_class, tactic, ...]")
        policy = value[2] if len(value) > 2 and isinstance(value[2], list) else None
        selection = value[3] if len(value) > 3 and isinstance(value[3], dict) else {}
        candidates = selection.get("candidates")
        try:
            key = parse_file_key(file_key)
        except BadFileKey:
            key = None
        entries[file_key] = AutotuneEntry(
            file_key=file_key, key=key, runner=value[0], tactic=value[1], policy=policy,
            time_ms=_number(selection.get("time_ms"), positive=True),
            runner_up_ms=_number(selection.get("runner_up_ms"), positive=True),
            margin=_number(selection.get("margin")),
            candidates=candidates if isinstance(candidates, int) and not isinstance(candidates, bool) else None,
        )
    return entries


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
        NotAnAutotuneFile: a file is not a FlashInfer autotune file (the message names its run).
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
