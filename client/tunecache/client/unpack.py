"""Unpacking a run's tarball in one pass: inflated once, front to back, each entry checked at
its header and written into a staging directory as it arrives (tarfile's stream mode, within
the pod's unpack bounds: :func:`tunecache.formats.tarball.stream_bounded`), never whole in
memory. A refusal stops the pass; the caller removes the staging directory, so nothing of a
refused tarball reaches its destination, which only ever sees whole entries renamed into place
(:mod:`tunecache.client.atomic`).

The rules every tarball of a run is held to (:func:`safe_entry`): no absolute or ``..`` paths,
only plain files and directories (no links, devices or fifos); a kind with rules of its own
(a FlashInfer JIT module: :func:`tunecache.formats.jit_module.jit_entry_module`) checks each
entry with them instead. tarfile's ``data`` filter is applied on top.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import shutil
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath

from tunecache.formats.jit_module import MTIME_NS_HEADER, _valid_mtime_ns
from tunecache.formats.tarball import TarSource, stream_bounded

#: A check of one entry, raising the kind's error to refuse it.
EntryCheck = Callable[[tarfile.TarInfo], object]

#: The directories each staging directory's destination path had to have made (deepest first).
_made: dict[Path, list[Path]] = {}
#: The staging directories made inside the :func:`staging_scope` under way (``None``: none is).
_pending: contextvars.ContextVar[list[Path] | None] = contextvars.ContextVar("tunecache_staging", default=None)


@contextlib.contextmanager
def staging_scope() -> Iterator[None]:
    """Every staging directory :func:`unpack_beside` makes inside the block is gone after it,
    whatever happens: an install whose destinations unpacked (staged) and then did not all
    commit (one refused its tarball, a write failed) leaves nothing unpacked behind."""
    token = _pending.set([])
    try:
        yield
    finally:
        for staging in _pending.get() or ():
            discard(staging)
        _pending.reset(token)


def safe_entry(what: str, error: type[ValueError]) -> EntryCheck:
    """The check every tarball of a run passes: a relative path without ``..``, a plain file or
    a directory (raises ``error`` naming the entry)."""

    def check(member: tarfile.TarInfo) -> None:
        path = PurePosixPath(member.name)
        if path.is_absolute() or ".." in path.parts or not (member.isfile() or member.isdir()):
            raise error(f"unsafe entry in {what} artifact: {member.name!r}")

    return check


def unpack(source: TarSource, staging: Path, what: str, error: type[ValueError],
           check: EntryCheck | None = None) -> list[tarfile.TarInfo]:
    """Unpack the gzip'd tar ``source`` into the directory ``staging`` in one pass, each entry
    checked (``check``, default :func:`safe_entry`) before its data is read; files and
    directories get the exact modification times they carry (:data:`MTIME_NS_HEADER`, else
    tar's own), deepest first so a directory's is set last. Returns the entries' headers.

    Raises:
        error: an entry refused, past the unpack bounds, not a gzip'd tar (what is already in
            ``staging`` stays there for the caller to remove); OSError when writing fails;
        a streamed download's error (:mod:`tunecache.client.artifact_stream`): its bytes
            failed their sha256 (ArtifactCorrupt, before any refusal of them), it stalled.
    """
    checked = check or safe_entry(what, error)
    members = []
    staging.mkdir(parents=True, exist_ok=True)
    try:
        with contextlib.closing(stream_bounded(source, what, error, once=True)) as entries:
            for tar, member in entries:
                checked(member)
                try:
                    tar.extract(member, staging, set_attrs=True, filter="data")
                except tarfile.FilterError as exc:
                    raise error(f"unsafe entry in {what} artifact: {member.name!r} ({exc})") from None
                members.append(member)
    except error:
        failure = getattr(source, "failure", None)  # a streamed download's bytes that failed their sha256
        if failure is not None:
            raise failure from None
        raise
    for member in sorted(members, key=lambda m: m.name, reverse=True):
        ns = member.pax_headers.get(MTIME_NS_HEADER)
        where = staging / member.name
        if ns is not None and _valid_mtime_ns(ns):
            os.utime(where, ns=(int(ns), int(ns)))
        elif member.isdir():
            os.utime(where, (member.mtime, member.mtime))
    return members


def unpack_beside(source: TarSource, destination: Path, what: str, error: type[ValueError],
                  check: EntryCheck | None = None) -> Path:
    """:func:`unpack` into a new staging directory inside ``destination`` (on its file system,
    so that what is unpacked is renamed into place); returns it, for the caller to rename from
    and remove. On a refusal or a failed write the staging directory goes, and so do the
    directories of ``destination``'s path that had to be made for it: a refused tarball leaves
    nothing behind.

    Raises:
        as :func:`unpack`.
    """
    return _stage_beside(destination, lambda staging: unpack(source, staging, what, error, check))


def copy_beside(staged: Path, destination: Path) -> Path:
    """A new staging directory inside ``destination`` holding a copy of ``staged`` (what
    :func:`unpack_beside` unpacked and checked for another destination of the same entries):
    the tarball is not inflated and checked a second time. Files and directories keep their
    modification times (``shutil.copytree`` with ``shutil.copy2``). Removed as
    :func:`unpack_beside`'s staging directories are.

    Raises:
        OSError: a copy failed (the new staging directory is gone then).
    """
    return _stage_beside(destination, lambda staging: shutil.copytree(staged, staging, dirs_exist_ok=True))


def _stage_beside(destination: Path, fill: Callable[[Path], object]) -> Path:
    """A new staging directory inside ``destination``, filled by ``fill``, noted in the
    :func:`staging_scope` under way; on a failure it goes with the directories made for it."""
    from tunecache.client.atomic import staging_dir

    made = [p for p in (destination, *destination.parents) if not p.exists()]  # deepest first
    destination.mkdir(parents=True, exist_ok=True)
    staging = staging_dir(destination)
    _made[staging] = made
    try:
        fill(staging)
    except BaseException:
        discard(staging)
        raise
    pending = _pending.get()
    if pending is not None:
        pending.append(staging)
    return staging


def discard(staging: Path) -> None:
    """Remove a staging directory of :func:`unpack_beside`, and the directories made for it
    that are still empty (nothing was renamed into them)."""
    shutil.rmtree(staging, ignore_errors=True)
    for directory in _made.pop(staging, ()):
        with contextlib.suppress(OSError):
            directory.rmdir()
