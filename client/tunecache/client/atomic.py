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
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tunecache.client.journal import all_or_nothing, current, exchange, note_added, referenced, remove, staging_dir

__all__ = ["all_or_nothing", "note_added", "staging_dir", "directory_lock", "file_lock", "same_tree", "swap_into_place",
           "write_atomically", "remove_stale", "STALE_AFTER_S"]


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


def _entries(root: Path) -> dict[str, tuple[str, str | None]]:
    """Every entry under ``root`` (symlinks not followed): relative path -> (kind, link target)."""
    found: dict[str, tuple[str, str | None]] = {}
    stack = [root]
    while stack:
        directory = stack.pop()
        with os.scandir(directory) as entries:
            for entry in entries:
                name = os.path.relpath(entry.path, root)
                if entry.is_symlink():
                    found[name] = ("link", os.readlink(entry.path))
                elif entry.is_dir(follow_symlinks=False):
                    found[name] = ("dir", None)
                    stack.append(Path(entry.path))
                else:
                    found[name] = ("file", None)
    return found


def same_tree(a: Path, b: Path) -> bool:
    """Whether the directories ``a`` and ``b`` hold the same entries: files with the same bytes,
    directories, and links to the same targets (links are not followed)."""
    entries = _entries(a)
    if entries != _entries(b):
        return False
    return all((a / name).read_bytes() == (b / name).read_bytes() for name, (kind, _) in entries.items() if kind == "file")


def swap_into_place(staged: Path, target: Path) -> None:
    """Put ``staged`` (a directory, or a file) at ``target``, replacing an existing ``target``:
    a directory in one step where the system can (:func:`tunecache.client.journal.exchange`), so
    that a reader never finds ``target`` missing, a file by one ``rename``; a ``target`` that
    already holds the same files is left as it is (``staged`` is removed). Elsewhere two renames
    (a reader may find it missing in between). Each step is journaled before it is taken
    (:mod:`tunecache.client.journal`), and the ``.NAME.old-*`` copies of ``target`` an install
    killed before the journal existed left are removed. Call it holding
    :func:`directory_lock` of ``target.parent``."""
    journal = current()
    _sweep_old(target)
    if not os.path.lexists(target):
        if journal is not None:
            journal.intend(target, None, staged)
        staged.rename(target)
        return
    if staged.is_dir() and target.is_dir() and same_tree(staged, target) or (
            staged.is_file() and target.is_file() and not target.is_symlink()
            and staged.read_bytes() == target.read_bytes()):
        remove(staged)
        return
    kept = target.with_name(f".{target.name}.old-{uuid.uuid4().hex[:8]}")
    if journal is not None:
        journal.intend(target, kept, staged)
    if staged.is_dir() and target.is_dir():
        staged.rename(kept)
        if exchange(kept, target):  # the old one is at ``kept`` now
            if journal is None:
                remove(kept)
            return
        kept.rename(staged)
    if staged.is_file() and target.is_file():
        os.link(target, kept)  # kept for a roll back, without a moment of no file
        os.replace(staged, target)
    else:
        target.rename(kept)
        staged.rename(target)
    if journal is None:
        remove(kept)


def _sweep_old(target: Path) -> None:
    """Remove the ``.NAME.old-*`` copies beside ``target`` that no install journal names (an
    install killed before it kept a journal left them)."""
    try:
        found = list(target.parent.glob(f".{target.name}.old-*"))
    except OSError:
        return
    if found:
        keep = referenced()
        for path in found:
            if str(path) not in keep:
                remove(path)


def write_atomically(path: Path, data: bytes | Any) -> None:
    """Write ``data`` to a temporary file beside ``path`` and rename it into place, so a
    reader sees the old file or the whole new one, never a partial one (mode 0644). ``data``:
    bytes, or anything with an ``open()`` of them (a downloaded artifact, copied in blocks).

    Raises:
        OSError: the file cannot be written (nothing is left behind).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    journal = current()
    old = None
    try:
        with os.fdopen(fd, "wb") as f:
            if isinstance(data, (bytes, bytearray, memoryview)):
                f.write(data)
            else:
                with data.open() as source:
                    shutil.copyfileobj(source, f, 1 << 20)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; the pod's vLLM user must read it
        if journal is not None:
            old = path.with_name(f".{path.name}.old-{uuid.uuid4().hex[:8]}") if path.is_file() else None
            journal.intend(path, old, Path(tmp))
            if old is not None:  # kept for a roll back, without a moment of no file
                os.link(path, old)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        if old is not None and os.path.lexists(path) and os.path.lexists(old) and os.path.samefile(path, old):
            old.unlink(missing_ok=True)
        raise


#: What an earlier boot left beside what it installed (unpacked directories, a variant's
#: tarball, a marker) is removed once it is this old: another engine on the same cache root may
#: still be booting from a newer one.
STALE_AFTER_S = 3600.0


def remove_stale(paths: Iterable[Path], older_than_s: float = STALE_AFTER_S) -> None:
    """Remove each of ``paths`` (files or directories) last changed over ``older_than_s`` ago;
    what cannot be removed is left."""
    now = time.time()
    for path in paths:
        try:
            if now - path.lstat().st_mtime < older_than_s:
                continue
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        except OSError:
            continue
