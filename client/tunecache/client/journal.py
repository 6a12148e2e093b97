"""The install journal: what one install puts in place, written down before each step, so that
the install is taken back whole when it fails, and finished or undone by the next install when
its process died midway (``kill -9``, the OOM killer, a pod deleted).

An install (:func:`all_or_nothing`) keeps one journal file, ``<state dir>/install-journal/<id>.jsonl``
(the state dir: ``TUNECACHE_STATE_DIR``, :func:`state_dir`), under an exclusive ``flock`` for as
long as it runs. Before each step it appends one line, the **intent**: the ``target`` it is about
to put in place, where what is there now will be kept (``old``, ``.NAME.old-XXXXXXXX`` beside it;
``null``: nothing is there), and the inode of what goes there (``new``, its staged path, and its
``ino``/``dev``, which renames keep). A directory it stages in is noted too (``staging``). When the
install stands it appends ``{"done": true}``, drops what it replaced and removes the file.

:func:`recover_interrupted` runs first in every install (and every lookup before one): each
journal no live process holds (its lock died with its process) is finished when it says
``done`` (what it replaced is dropped) or undone entry by entry, newest first: a ``target`` that
holds the install's inode is taken out and its ``old`` returns (swapped back in one step where
the system can); an ``old`` that never replaced anything is dropped. Every step of an undo can
be repeated, so an undo killed midway is finished by the next. Every kind on disk is then of one
run again, and no ``.old-*`` copy outlives the next install.

Without a writable state directory the journal is kept in memory only (as before): a failed
install is still taken back, a killed one is not.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass
from pathlib import Path

#: The journals' directory under the state dir (:func:`state_dir`).
JOURNAL_DIR = "install-journal"


def state_dir() -> Path:
    """``$TUNECACHE_STATE_DIR`` (default ``$XDG_CACHE_HOME/tunecache``, ``~/.cache/tunecache``):
    where the pod keeps what outlives one install (its rollback memory, the install journals)."""
    base = os.environ.get("TUNECACHE_STATE_DIR") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "tunecache")
    return Path(base).expanduser()


def journal_dir() -> Path:
    return state_dir() / JOURNAL_DIR


@dataclass(frozen=True)
class Intent:
    """One step of an install: ``new`` (inode ``ino`` on device ``dev``) goes to ``target``;
    what ``target`` holds now is kept at ``old`` (``None``: it holds nothing)."""

    target: str
    old: str | None
    new: str
    ino: int
    dev: int

    def holds_new(self) -> bool:
        """Whether ``target`` is the install's (its inode)."""
        try:
            found = os.lstat(self.target)
        except OSError:
            return False
        return (found.st_ino, found.st_dev) == (self.ino, self.dev)

    def undo(self) -> None:
        """Put back what ``target`` held before this step, whichever part of it was done.
        Can be repeated. Raises OSError."""
        target, old = Path(self.target), Path(self.old) if self.old else None
        kept = old is not None and os.path.lexists(old)
        if self.holds_new():
            if kept and old.is_dir() and target.is_dir() and exchange(old, target):
                remove(old)  # holds the install's entry now
                return
            remove(target)
            if kept:
                os.rename(old, target)
        elif kept:
            if os.path.lexists(target):  # never replaced: ``old`` is the install's entry, or a link to the same file
                remove(old)
            else:
                os.rename(old, target)
        new = Path(self.new)
        if new != target and os.path.lexists(new) and self._is_new(new):
            remove(new)  # staged, never put in place

    def _is_new(self, path: Path) -> bool:
        found = os.lstat(path)
        return (found.st_ino, found.st_dev) == (self.ino, self.dev)


class Journal:
    """What one install put in place (:func:`all_or_nothing`), in memory and, where the state
    dir can be written, in its journal file (see the module)."""

    def __init__(self, directory: Path | None) -> None:
        self._intents: list[Intent] = []
        self._staging: list[str] = []
        self._directory = directory
        self._fd: int | None = None
        self._path: Path | None = None

    def open(self) -> None:
        """Make the journal file, under its lock, before the install does anything; in memory
        only when it cannot be made."""
        if self._directory is None or self._fd is not None:
            return
        try:
            self._directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self._directory, prefix=".", suffix=".tmp")
            fcntl.flock(fd, fcntl.LOCK_EX)  # held until this install ends: it is live
            path = self._directory / f"{uuid.uuid4().hex}.jsonl"
            os.rename(tmp, path)  # recover_interrupted reads named ones only once it holds their lock
            self._fd, self._path = fd, path
        except OSError:
            self._directory = None  # a read-only or full state dir: in memory only

    def _append(self, record: dict) -> None:
        """Append one line to the journal file; in memory only when it cannot be written."""
        self.open()
        if self._fd is None:
            return
        try:
            os.write(self._fd, (json.dumps(record) + "\n").encode())
        except OSError:  # a full state dir: in memory only from here, the file says so
            self._close_file()

    def intend(self, target: Path, old: Path | None, new: Path) -> None:
        """Before ``new`` is put at ``target`` (what is there kept at ``old``): note it."""
        found = os.lstat(new)
        intent = Intent(str(target), str(old) if old is not None else None, str(new), found.st_ino, found.st_dev)
        self._intents.append(intent)
        self._append(asdict(intent))

    def staging(self, path: Path) -> None:
        """``path`` is a place this install stages in (removed when it ends, however it ends)."""
        self._staging.append(str(path))
        self._append({"staging": str(path)})

    def rollback(self) -> None:
        """Take back everything put in place, newest first: the old entries return. Never raises."""
        _undo(self._intents, self._staging)
        self._close()

    def commit(self) -> None:
        """The install stands: drop what it replaced. Never raises."""
        self._append({"done": True})
        _finish(self._intents, self._staging)
        self._close()

    def _close(self) -> None:
        self._intents, self._staging = [], []
        self._close_file()

    def _close_file(self) -> None:
        """Remove the journal file (what it says is in memory) and write no other."""
        self._directory = None
        if self._fd is not None:
            if self._path is not None:
                self._path.unlink(missing_ok=True)
            os.close(self._fd)
            self._fd = self._path = None


def _undo(intents: list[Intent], staging: list[str]) -> None:
    for intent in reversed(intents):
        try:
            intent.undo()
        except OSError:
            continue
    for path in staging:
        remove(Path(path))


def _finish(intents: list[Intent], staging: list[str]) -> None:
    for intent in intents:
        if intent.old is not None:
            remove(Path(intent.old))
    for path in staging:
        remove(Path(path))


def _read(fd: int) -> tuple[list[Intent], list[str], bool]:
    """A journal file's intents, staging places and whether it says ``done`` (a line cut short
    by the kill is left out: nothing was done after it)."""
    with os.fdopen(os.dup(fd), "r", errors="replace") as stream:
        lines = stream.read().splitlines()
    intents, staging, done = [], [], False
    for line in lines:
        try:
            record = json.loads(line)
            if record.get("done") is True:
                done = True
            elif "staging" in record:
                staging.append(str(record["staging"]))
            else:
                intents.append(Intent(**record))
        except (ValueError, TypeError, AttributeError):
            continue
    return intents, staging, done


def recover_interrupted() -> int:
    """Finish or undo every install whose process died midway (see the module): the journals
    no live process holds. Returns how many. Never raises."""
    directory = journal_dir()
    try:
        found = sorted(directory.glob("*.jsonl"))
    except OSError:
        return 0
    recovered = 0
    for path in found + sorted(directory.glob(".*.tmp")):  # .tmp: a journal its install never got to name
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.fstat(fd).st_nlink == 0:  # another install recovered it meanwhile
                continue
            intents, staging, done = _read(fd)
            (_finish if done else _undo)(intents, staging)
            path.unlink(missing_ok=True)
            recovered += bool(intents or staging)
        except OSError:  # held: a live install
            continue
        finally:
            os.close(fd)
    return recovered


def referenced() -> set[str]:
    """Every path the journals on disk name as kept (``old``): what no sweep may remove."""
    names: set[str] = set()
    try:
        paths = list(journal_dir().glob("*.jsonl"))
    except OSError:
        return names
    for path in paths:
        try:
            for line in path.read_text(errors="replace").splitlines():
                try:
                    old = json.loads(line).get("old")
                except (ValueError, AttributeError):
                    continue
                if old:
                    names.add(old)
        except OSError:
            continue
    return names


_journal: ContextVar[Journal | None] = ContextVar("tunecache_install_journal", default=None)


def current() -> Journal | None:
    """The journal of the install running in this context (``None``: none)."""
    return _journal.get()


@contextmanager
def all_or_nothing() -> Iterator[Journal]:
    """Within the block, what :func:`tunecache.client.atomic.swap_into_place`,
    :func:`~tunecache.client.atomic.write_atomically` and :func:`note_added` put in place is
    journaled; when the block raises (a full volume midway), all of it is taken back and the old
    entries return, so an install leaves everything as it was or all of it in place. The replaced
    entries are dropped when the block ends well. An install killed within the block is finished
    or undone by the next (:func:`recover_interrupted`, which runs first)."""
    recover_interrupted()
    journal = Journal(journal_dir())
    journal.open()
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


def note_added(path: Path, new: Path) -> None:
    """Journal, before it happens, that ``new`` is about to be renamed into ``path``, a place
    that is empty (see :func:`all_or_nothing`)."""
    journal = _journal.get()
    if journal is not None:
        journal.intend(path, None, new)


def staging_dir(parent: Path, prefix: str = ".tunecache-") -> Path:
    """A new directory in ``parent`` to stage in (``tempfile.mkdtemp``), noted in this
    context's journal, so that an install killed while it stages leaves nothing behind."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    journal = _journal.get()
    if journal is not None:
        journal.staging(path)
    return path


def remove(path: Path) -> None:
    """Remove a file, link or directory tree, if there. Never raises."""
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    except OSError:
        pass


#: ``renameat2``'s flag that swaps two paths in one step (Linux 3.15+, ``include/uapi/linux/fs.h``).
_RENAME_EXCHANGE = 2
#: ``AT_FDCWD``: paths relative to the working directory.
_AT_FDCWD = -100


def exchange(a: Path, b: Path) -> bool:
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
