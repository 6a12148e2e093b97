"""The tuner child's guards: it dies with the process that started it, and it holds its
GPU's lock for as long as it lives, so one GPU never runs two tuners.

Without them, a service killed with ``kill -9`` mid-job left its tuner running (parent pid
1), and the job, claimed again once its lease expired, started a second tuner on the same
GPU beside it: both runs' timings skewed.

* **Dying with the parent.** :func:`run_tuner <tunecache.service.tuner.process.run_tuner>`
  starts the child in a process group of its own and names itself in
  :data:`PARENT_PID_VARIABLE`. Linux's ``PR_SET_PDEATHSIG`` would signal the child alone,
  not the vLLM processes it starts; so a thread of the child watches its parent pid and,
  once the parent is gone, kills the child's whole process group.
* **The GPU lock.** An exclusive ``flock`` on ``<lock dir>/tunecache-gpu-<devices>.lock``
  (``devices``: ``CUDA_VISIBLE_DEVICES``, ``all`` when unset; lock dir:
  :data:`LOCK_DIR_VARIABLE`, default the system's temporary directory), taken before the
  child touches the GPU and released by the kernel when it exits however it exits. A second
  tuner for the same devices waits for it (its parent's timeout bounds the wait) and says
  so once in its log, with the holder's pid.
"""

from __future__ import annotations

import fcntl
import os
import re
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

#: Set by the tuner's parent to its own pid; the child dies when that process is gone.
PARENT_PID_VARIABLE = "TUNECACHE_TUNER_PARENT_PID"
#: Directory of the GPU lock files (default: the system's temporary directory).
LOCK_DIR_VARIABLE = "TUNECACHE_GPU_LOCK_DIR"
#: Seconds between two looks at the parent, and between two tries of a held GPU lock.
POLL_S = 0.5


def die_with_parent() -> threading.Thread | None:
    """Start the watch of :data:`PARENT_PID_VARIABLE`'s process (``None`` when unset): once
    this process's parent is no longer that pid, SIGKILL this process group. Call it first
    thing in the child; a parent that died before the call is seen at once."""
    named = os.environ.get(PARENT_PID_VARIABLE, "")
    if not named.isdigit():
        return None
    parent = int(named)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(POLL_S)
        os.killpg(os.getpgrp(), signal.SIGKILL)

    thread = threading.Thread(target=watch, name="tunecache-die-with-parent", daemon=True)
    thread.start()
    return thread


def gpu_lock_path() -> Path:
    """This process's GPU lock file (see the module's docstring)."""
    devices = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip() or "all"
    name = re.sub(r"[^A-Za-z0-9,_-]", "_", devices)[:100]
    return Path(os.environ.get(LOCK_DIR_VARIABLE) or tempfile.gettempdir()) / f"tunecache-gpu-{name}.lock"


def hold_gpu_lock(path: Path | None = None) -> int:
    """Take the GPU lock (waiting while another tuner holds it) and keep it: returns the
    open descriptor, which must stay open for the life of the process. Writes this pid into
    the file for the next one's message."""
    path = path or gpu_lock_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    said = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if not said:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                print(f"tunecache: waiting for the GPU: another tuner (pid {holder}) holds {path}", file=sys.stderr,
                      flush=True)
                said = True
            time.sleep(POLL_S)
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd
