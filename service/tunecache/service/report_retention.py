"""Pod reports are kept ``TUNECACHE_REPORT_RETENTION_DAYS``: what deletes older ones, and when.

:func:`prune_reports` deletes the reports received before a time (the ``received_at`` index),
and :func:`tunecache.service.auto_tune_refusals.prune` the automatic tunings refused with
them; the report route runs both after an answer, at most once a minute per process
(:class:`Pruner`). :class:`Interval` is the clock of that and of the report bounds' windows
(:mod:`tunecache.service.report_bounds`). Functions take the caller's session and never commit.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable

from sqlalchemy import delete
from sqlalchemy.orm import Session

from tunecache.service.models import PodReport


def prune_reports(session: Session, older_than: dt.datetime) -> int:
    """Delete the reports received before ``older_than``; returns how many."""
    result = session.execute(delete(PodReport).where(PodReport.received_at < older_than))
    return result.rowcount or 0


class Interval:
    """Says when something is due: at most once per ``interval_s`` by ``clock``, the first
    time at once (``due_at_once``) or ``interval_s`` after it was made. No lock: one
    thread (or the event loop) asks."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic, due_at_once: bool = True):
        self.interval_s, self._clock = interval_s, clock
        self._next = clock() + (0.0 if due_at_once else interval_s)

    def due(self) -> bool:
        """Whether it is due now; if so, the next time is ``interval_s`` later."""
        now = self._clock()
        if now < self._next:
            return False
        self._next = now + self.interval_s
        return True


class Pruner(Interval):
    """Says when this process should delete old reports: at most once per ``interval_s``
    (the first call: at once). Called on the event loop only."""

    def __init__(self, interval_s: float = 60.0):
        super().__init__(interval_s)
