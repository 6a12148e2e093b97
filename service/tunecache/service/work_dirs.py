"""The job worker's work directories: one per job, locked while its worker runs it, and
removed when the worker that made it died (``kill -9``) before it could remove it."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger("tunecache.worker")

#: In each job's work directory: the file its worker holds an exclusive ``flock`` on while
#: the job runs; a directory whose lock can be taken was left by a worker that died.
WORK_DIR_LOCK = ".tunecache-worker.lock"


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        return True
    return True


@contextlib.contextmanager
def job_work_dir(work_root: Path | None, job_id: int) -> Iterator[Path]:
    """A new work directory for ``job_id`` under ``work_root`` (the system's temporary
    directory by default), locked (:data:`WORK_DIR_LOCK`) while in use and removed after."""
    path = Path(tempfile.mkdtemp(prefix=f"tunecache-job-{job_id}-", dir=work_root))
    fd = os.open(path / WORK_DIR_LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        os.close(fd)


def remove_abandoned_work_dirs(work_root: Path | None) -> list[Path]:
    """Remove the job work directories under ``work_root`` whose worker process is gone
    (their :data:`WORK_DIR_LOCK` can be taken); those of live workers are left alone, and so
    is anything without the lock file. Returns what was removed."""
    removed = []
    for path in Path(work_root or tempfile.gettempdir()).glob("tunecache-job-*"):
        try:
            fd = os.open(path / WORK_DIR_LOCK, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:  # not one of ours, or already gone
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # a live worker's
            os.close(fd)
            continue
        try:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        finally:
            os.close(fd)
    if removed:
        log.warning("removed the work directories of dead workers: %s", ", ".join(str(p) for p in removed))
    return removed
