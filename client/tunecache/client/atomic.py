"""Putting files and directories in place whole, safely beside other processes.

Every install of tunecache is staged beside its target and renamed into place, so a
reader sees the old content or the whole new one, never a part. The workers of one pod
install at the same moment (one per rank), often into the same FlashInfer workspace or
cache root: :func:`directory_lock` serializes the swaps of one directory's entries, so two
installers never rename over each other (which failed with ``FileNotFoundError`` and
``ENOTEMPTY`` and could leave ``.old-*`` copies behind). Installing what is already there
is a success: the second installer swaps in the same bytes.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def directory_lock(directory: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``directory`` itself (created if missing) for the
    block; other processes installing into it wait. Leaves no file behind."""
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


@contextmanager
def file_lock(path: Path, timeout_s: float, poll_s: float = 0.05) -> Iterator[None]:
    """Hold an exclusive ``flock`` on the file ``path`` (created, mode 0644, with its parent
    directories, if missing; never removed) for the block, waiting at most ``timeout_s``
    seconds for another process to release it (polled every ``poll_s`` seconds). The
    kernel releases the lock when its holder exits, so a crashed holder never blocks anyone.

    Raises:
        TimeoutError: another process held the lock for all of ``timeout_s`` seconds.
        OSError: the file cannot be created or opened (read-only or full volume, permissions).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"{path} stayed locked by another process for {timeout_s:g} s") from None
                time.sleep(poll_s)
        yield
    finally:
        os.close(fd)  # releases the lock


def swap_into_place(staged: Path, target: Path) -> None:
    """Rename the directory ``staged`` to ``target``, replacing an existing ``target``.
    Call it holding :func:`directory_lock` of ``target.parent``."""
    old = target.with_name(f".{target.name}.old-{uuid.uuid4().hex[:8]}")
    if target.exists():
        target.rename(old)
    staged.rename(target)
    shutil.rmtree(old, ignore_errors=True)


def write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path`` and rename it into place, so a
    reader sees the old file or the whole new one, never a partial one (mode 0644).

    Raises:
        OSError: the file cannot be written (nothing is left behind).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; the pod's vLLM user must read it
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
