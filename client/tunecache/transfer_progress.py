"""Progress of the CLI's long waits, on a terminal only: bytes of ``pull``'s and ``push``'s
artifact transfers (done, rate, time left) and a job's stage while ``job wait`` follows it.

rich's progress bar (:mod:`rich.progress`, which the CLI's stack brings) on stderr, shown once
the work has taken :data:`SHOW_AFTER_S`; nothing at all on a pipe, in a log, or with
``--quiet``, so that scripts read the commands' output as before. Transfers are told through
the HTTP client's :data:`~tunecache.store.http.transport.TransferCallback` (bytes done and
in all, per artifact), whatever reads or writes the bytes.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Annotated

import typer

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

#: Seconds of work before a progress bar appears (a quick command shows none).
SHOW_AFTER_S = 1.0

QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="no progress bar (there is none on a pipe either)")]


class DelayedProgress:
    """One rich progress bar on stderr, started at the first update after ``show_after_s``
    and only on a terminal (never with ``quiet``). A context manager: the bar is stopped
    (left as it ended) on exit."""

    def __init__(self, columns: Sequence[ProgressColumn], *, quiet: bool = False, console: Console | None = None,
                 show_after_s: float = SHOW_AFTER_S) -> None:
        self.console = console or Console(stderr=True)
        self.enabled = not quiet and self.console.is_terminal
        self._columns, self._show_after_s = columns, show_after_s
        self._started = time.monotonic()
        self._progress: Progress | None = None
        self._task = None

    @property
    def shown(self) -> bool:
        """Whether the bar has appeared."""
        return self._progress is not None

    def update(self, description: str, completed: float, total: float | None) -> None:
        """Show ``completed`` of ``total`` (``None``: unknown) with ``description``."""
        if not self.enabled:
            return
        if self._progress is None:
            if time.monotonic() - self._started < self._show_after_s:
                return
            self._progress = Progress(*self._columns, console=self.console)
            self._progress.start()
            self._task = self._progress.add_task(description, total=total)
        self._progress.update(self._task, description=description, completed=completed, total=total)

    def __enter__(self) -> "DelayedProgress":
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()


class TransferProgress(DelayedProgress):
    """Bytes moved by a command's artifact transfers, as one bar: done of the sizes announced
    so far, rate, time left. Pass it as the client's ``on_transfer``."""

    def __init__(self, what: str, **options) -> None:
        super().__init__((TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                          TimeRemainingColumn()), **options)
        self.what = what
        self._lock = threading.Lock()
        self._finished = 0  # bytes of the transfers that ended (or were started again)
        self._finished_total = 0
        #: each thread's transfer under way: done and total (an install downloads several at once)
        self._current: dict[int, tuple[int, int | None]] = {}
        self.transfers = 0

    def __call__(self, done: int, total: int | None) -> None:
        """One transfer's ``done`` of ``total`` bytes (:data:`~tunecache.store.http.transport.TransferCallback`),
        told from the thread that moves it."""
        with self._lock:
            me = threading.get_ident()
            if done == 0:  # this thread's next transfer (or a retried one) starts
                ended, ended_total = self._current.pop(me, (0, 0))
                self._finished += ended
                self._finished_total += ended_total or ended
                self.transfers += 1
            self._current[me] = (done, total)
            unknown = any(t is None for _, t in self._current.values())
            known = self._finished_total + sum(t or 0 for _, t in self._current.values())
            self.update(f"{self.what} ({self.transfers} artifact{'' if self.transfers == 1 else 's'})",
                        self._done(), None if unknown else known)

    def _done(self) -> int:
        return self._finished + sum(d for d, _ in self._current.values())

    @property
    def done(self) -> int:
        """Bytes moved so far, every transfer together."""
        with self._lock:
            return self._done()


class JobProgress(DelayedProgress):
    """A tuning job followed by ``job wait``: its state, stage and step of total, time waited."""

    def __init__(self, **options) -> None:
        super().__init__((TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()),
                         **options)

    def job(self, job) -> None:
        """Show a polled :class:`~tunecache.contract.TuningJobRead`."""
        stage = f", stage {job.stage}" if job.stage else ""
        self.update(f"job {job.id}: {job.status}{stage}", job.step or 0, job.total)


@contextlib.contextmanager
def transfer_progress(client, what: str, quiet: bool) -> Iterator[TransferProgress]:
    """Within: ``client``'s artifact transfers (its ``on_transfer``) shown as one
    :class:`TransferProgress` bar saying ``what``."""
    with TransferProgress(what, quiet=quiet) as progress:
        client.on_transfer = progress
        try:
            yield progress
        finally:
            client.on_transfer = None
