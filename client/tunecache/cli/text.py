"""Text of the commands' tables (``history``, ``fleet``, ``job list``, ``workers``, ``audit``, ``show``):
aligned columns of text from the service with its control characters escaped, keys in one
cell, times and ages."""

from __future__ import annotations

import datetime as dt

from tunecache.contract import TuningKey

#: Control characters (C0, DEL, C1: what a terminal acts on, ESC and CSI among them) as
#: ``\xNN``: text in the tables comes from the service, and some of it from anonymous pod reports.
CONTROL_ESCAPES = {code: f"\\x{code:02x}" for code in (*range(0x20), *range(0x7F, 0xA0))}


def printable(text: str) -> str:
    """``text`` with its control characters escaped (:data:`CONTROL_ESCAPES`), so that
    printing it cannot move the cursor, retitle the terminal or hide what follows."""
    return text.translate(CONTROL_ESCAPES)


def aligned(rows: list[tuple[str, ...]]) -> list[str]:
    """Rows of cells as text lines, each column as wide as its widest cell; control
    characters in a cell are escaped (:func:`printable`)."""
    rows = [tuple(printable(cell) for cell in row) for row in rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]


def key_text(key: TuningKey) -> str:
    """A key in one cell: model, GPU, max_num_batched_tokens, tp, and what else is not the default."""
    extra = [f"{name}={getattr(key, name)}" for name, default in (("dtype", "auto"), ("quantization", "auto"),
                                                                  ("data_parallel_size", 1), ("expert_parallel_size", 1))
             if getattr(key, name) != default]
    return " ".join([key.model, f"{key.gpu_name} ({key.arch})", f"mnbt={key.max_num_batched_tokens}",
                     f"tp={key.tensor_parallel_size}", *extra])


def age(seconds: float) -> str:
    """``45s``, ``12m``, ``5h 3m``, ``2d 4h``."""
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m"
    if seconds < 86400:
        return f"{seconds // 3600}h {seconds % 3600 // 60}m"
    return f"{seconds // 86400}d {seconds % 86400 // 3600}h"


def when(value: dt.datetime | None) -> str:
    """A time in UTC to the second (``2026-12-01 08:00:00Z``); ``-`` for none."""
    return "-" if value is None else value.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")
