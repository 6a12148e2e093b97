"""Files a command reads on a user's say-so, read bounded: a path may name a pipe, a FIFO or a
device (``/dev/zero``, ``/dev/stdin``) whose size ``stat`` reports as 0, so a size checked
beforehand bounds nothing; :func:`read_bounded` never holds more than its limit plus one byte."""

from __future__ import annotations

from pathlib import Path


class FileTooLarge(OSError):
    """``path`` holds more than ``limit`` bytes (nothing past ``limit + 1`` was read)."""

    def __init__(self, path: Path, limit: int):
        super().__init__(f"{path} is over {limit:,} bytes")
        self.path, self.limit = path, limit


def read_bounded(path: Path, limit: int) -> bytes:
    """The bytes of ``path``, at most ``limit`` of them.

    Raises:
        FileTooLarge: it holds more (a regular file, a pipe or a device alike).
        OSError: it cannot be opened or read.
    """
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise FileTooLarge(path, limit)
    return data
