"""Reading FlashInfer autotune cache files (the "v1" JSON file of ``AutoTuner.save_configs``).

The file is FlashInfer's own format and is stored and installed byte for byte; this
module reads what tunecache needs from it: the ``_metadata`` block (the environment it
was tuned in) and the number of tuning entries (:func:`parse_autotune_file`), and each
entry with its key, tactic and recorded times (:func:`read_entries`). Loading it into
FlashInfer is FlashInfer's job (``AutoTuner.get().load_configs(path)``).

Layout (``flashinfer/autotuner/autotuner.py``, ``AutoTuner.save_configs``, FlashInfer 0.7.4)::

    {"_metadata": {...}, "_generation": "<sha256>",              # underscore keys: bookkeeping
     "('bf16_gemm', 'CudnnBf16GemmRunner', ...)": [runner_class, tactic, policy, selection],
     ...}

* the key is ``str(ProfilingCacheKey.key_fields)``, read by
  :func:`tunecache.formats.file_key.parse_file_key`;
* ``tactic`` is ``_tactic_to_json(tactic)``: an int, or nested lists;
* ``policy`` (``AutoTuner._profiling_policy``, e.g. ``["cuda_graph_profile_replays", 1,
  "l2_cache_policy", "cold-chain:8"]``) and ``selection`` (``AutoTuner._selection_record``:
  ``{"time_ms", "runner_up_ms", "margin", "candidates"}``, milliseconds, ``margin =
  runner_up_ms / time_ms - 1``) are absent from files older FlashInfer versions wrote.

Pure Python (json): no evaluation of file contents, no FlashInfer import.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from tunecache.contract import EnvironmentMetadata
from tunecache.formats.file_key import BadFileKey, FileKey, parse_file_key

#: The name of FlashInfer's file among a run's artifacts.
AUTOTUNE_FILE_NAME = "autotune.json"


class NotAnAutotuneFile(ValueError):
    """The bytes are not a FlashInfer autotune cache file with a ``_metadata`` block."""


def _json_object(data: bytes, source: str) -> dict:
    """The file's top-level JSON object.

    Raises:
        NotAnAutotuneFile: not JSON, or not an object.
    """
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise NotAnAutotuneFile(f"{source} is not JSON: {exc}") from None
    except RecursionError:  # e.g. 100,000 nested lists: json's decoder recurses
        raise NotAnAutotuneFile(f"{source} is nested too deeply to be a FlashInfer autotune file") from None
    if not isinstance(doc, dict):
        raise NotAnAutotuneFile(f"{source} is not a FlashInfer autotune file (top level is not an object)")
    return doc


@dataclass(frozen=True)
class AutotuneFile:
    """What tunecache reads from a FlashInfer autotune cache file."""

    environment: EnvironmentMetadata
    entries: int
    """Number of tuning entries (keys that do not start with ``_``)."""


def parse_autotune_file(data: bytes, source: str = "file") -> AutotuneFile:
    """Read the environment and entry count of a FlashInfer autotune cache file.

    Args:
        data: the file's bytes (UTF-8 JSON).
        source: how to name the file in error messages.

    Raises:
        NotAnAutotuneFile: not JSON, not an object, no ``_metadata`` object, or a
            ``_metadata`` field that is not a usable string (named).
    """
    doc = _json_object(data, source)
    metadata = doc.get("_metadata")
    if not isinstance(metadata, dict):
        raise NotAnAutotuneFile(
            f"{source} has no _metadata block: not a FlashInfer (>= 0.6) autotune cache file"
        )
    try:
        environment = EnvironmentMetadata.from_flashinfer_metadata(metadata)
    except ValueError as exc:
        raise NotAnAutotuneFile(f"{source}: {exc}") from None
    return AutotuneFile(
        environment=environment,
        entries=sum(1 for k in doc if not k.startswith("_")),
    )


#: Bookkeeping keys of a v1 file beside ``_metadata``, by the FlashInfer that reads them:
#: FlashInfer 0.7 pops ``_generation`` and ``_records`` (an object) before reading entries;
#: FlashInfer 0.6 pops only ``_metadata`` and reads every other key as an entry.
_BOOKKEEPING_07 = ("_generation", "_records")


def check_loadable(data: bytes, source: str = "file") -> AutotuneFile:
    """:func:`parse_autotune_file`, and every entry as FlashInfer's loader
    (``AutoTuner.load_configs``, 0.6.13 and 0.7.4) reads it: the value of each key but the
    bookkeeping ones is ``[runner_class: str, tactic, ...]``, a third element (the profiling
    policy, read with ``tuple(...)``) is a list, and FlashInfer 0.7's ``_records`` is an
    object. An entry FlashInfer cannot read makes its ``load_configs`` raise (an
    ``IndexError`` for ``"key": "x"``) in every pod that installs the file.

    And a ``_metadata`` value ``"*"`` is refused: FlashInfer's loader takes it as "any
    environment", while tunecache files a run under exactly one environment and hands it only
    to pods of that environment; a wildcard file would be stored under a ``"*"`` environment no
    pod has (record the file FlashInfer wrote where it tuned).

    The checks are written here rather than run through FlashInfer's loader: on a server, the
    loader compares the file's environment with the server's own first and, as they differ,
    skips the entries unread (tests/unit/client/formats/test_autotune_file.py holds both to
    the same cases).

    Raises:
        NotAnAutotuneFile: as :func:`parse_autotune_file`, or naming the first entry or
            ``_metadata`` field FlashInfer would not load.
    """
    parsed = parse_autotune_file(data, source)
    doc = _json_object(data, source)
    wildcards = [k for k, v in doc["_metadata"].items() if v == "*"]
    if wildcards:
        raise NotAnAutotuneFile(f"{source}: _metadata.{wildcards[0]} is the wildcard '*': tunecache stores a run under "
                                "the one environment it was tuned in; record the file FlashInfer wrote there")
    version = str(doc["_metadata"].get("flashinfer_version", ""))
    bookkeeping = _BOOKKEEPING_07 if not version.startswith("0.6") else ()
    if "_records" in bookkeeping and "_records" in doc and not isinstance(doc["_records"], dict):
        raise NotAnAutotuneFile(f"{source}: _records is not an object (FlashInfer's loader raises on it)")
    for key, value in doc.items():
        if key == "_metadata" or key in bookkeeping:
            continue
        shown = key if len(key) <= 120 else key[:117] + "..."
        if not isinstance(value, list) or len(value) < 2 or not isinstance(value[0], str):
            raise NotAnAutotuneFile(f"{source}: entry {shown!r} is not [runner_class, tactic, ...] "
                                    f"(FlashInfer's loader fails on {json.dumps(value)[:80]})")
        if len(value) > 2 and not isinstance(value[2], list):
            raise NotAnAutotuneFile(f"{source}: entry {shown!r} has a profiling policy that is not a list")
    return parsed


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
        doc = _json_object(data, source)
    except RecursionError:
        raise NotAnAutotuneFile(f"{source} is nested too deeply to be a FlashInfer autotune file") from None
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
