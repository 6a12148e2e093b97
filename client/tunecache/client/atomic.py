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
from contextvars import ContextVar
from pathlib import Path


class Journal:
    """What one install put in place, so that it can be taken back whole
    (:func:`all_or_nothing`): each directory or file swapped in with what it replaced (kept
    beside it until the install ends), each entry added."""

    def __init__(self) -> None:
        self._done: list[tuple[Path, Path | None]] = []

    def put(self, target: Path, old: Path | None) -> None:
        """``target`` was put in place; ``old`` holds what was there before (``None``: nothing)."""
        self._done.append((target, old))

    def rollback(self) -> None:
        """Take back everything put in place, newest first: the old entries return. Never raises."""
        for target, old in reversed(self._done):
            try:
                if old is not None and old.is_dir() and target.is_dir() and _exchange(old, target):
                    _remove(old)
                    continue
                _remove(target)
                if old is not None:
                    old.rename(target)
            except OSError:
                continue
        self._done.clear()

    def commit(self) -> None:
        """The install stands: drop what it replaced. Never raises."""
        for _, old in self._done:
            if old is not None:
                _remove(old)
        self._done.clear()


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            path.unlink()
        except FileNotFoundError:
            pass


_journal: ContextVar[Journal | None] = ContextVar("tunecache_install_journal", default=None)


@contextmanager
def all_or_nothing() -> Iterator[Journal]:
    """Within the block, what :func:`swap_into_place`, :func:`write_atomically` and
    :func:`note_added` put in place is journaled; when the block raises (a full volume midway),
    all of it is taken back and the old entries return, so an install leaves everything as it
    was or all of it in place. The replaced entries are dropped when the block ends well."""
    journal = Journal()
    token = _journal.set(journal)
    try:
        yield journal
    except BaseException:
        journal.rollback()
        raise
    else:
        journal.commit()
    finally:
        _journal.reset(token)


def note_added(path: Path) -> None:
    """Journal an entry an install renamed into a place that was empty (see :func:`all_or_nothing`)."""
    journal = _journal.get()
    if journal is not None:
        journal.put(path, None)


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


#: ``renameat2``'s flag that swaps two paths in one step (Linux 3.15+, ``include/uapi/linux/fs.h``).
_RENAME_EXCHANGE = 2
#: ``AT_FDCWD``: paths relative to the working directory.
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap the directories ``a`` and ``b`` in one step (Linux ``renameat2(RENAME_EXCHANGE)``,
    through the C library's wrapper): a process that opens a path under ``b`` meanwhile finds
    the old entry or the new one, never none. ``False`` where the system or the filesystem
    cannot (no wrapper, ``EINVAL``, ``ENOSYS``, ``EXDEV``...): the caller renames twice."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    return renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0


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
    """Put the directory ``staged`` at ``target``, replacing an existing ``target``: in one
    step where the system can (:func:`_exchange`), so that a reader never finds ``target``
    missing; a ``target`` that already holds the same files is left as it is (``staged`` is
    removed). Elsewhere two renames (a reader may find it missing in between). Call it holding
    :func:`directory_lock` of ``target.parent``."""
    journal = _journal.get()
    if not target.exists():
        staged.rename(target)
        note_added(target)
        return
    if same_tree(staged, target):
        shutil.rmtree(staged, ignore_errors=True)
        return
    if _exchange(staged, target):  # the old one is at ``staged`` now
        if journal is not None:
            kept = target.with_name(f".{target.name}.old-{uuid.uuid4().hex[:8]}")
            staged.rename(kept)
            journal.put(target, kept)
        else:
            shutil.rmtree(staged, ignore_errors=True)
        return
    old = target.with_name(f".{target.name}.old-{uuid.uuid4().hex[:8]}")
    target.rename(old)
    staged.rename(target)
    if journal is not None:
        journal.put(target, old)
    else:
        shutil.rmtree(old, ignore_errors=True)


def write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path`` and rename it into place, so a
    reader sees the old file or the whole new one, never a partial one (mode 0644).

    Raises:
        OSError: the file cannot be written (nothing is left behind).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    journal = _journal.get()
    old = None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; the pod's vLLM user must read it
        if journal is not None and path.is_file():  # kept for a roll back, without a moment of no file
            old = path.with_name(f".{path.name}.old-{uuid.uuid4().hex[:8]}")
            os.link(path, old)
        os.replace(tmp, path)
        if journal is not None:
            journal.put(path, old)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        if old is not None:
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
