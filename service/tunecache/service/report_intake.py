"""Pod reports are taken in memory and stored in batches (``POST /v1/reports``).

A boot storm is when reports come fastest: every worker of every pod sends one right after
its install. Stored one insert and one commit per request, they cost the service more
than the boot's lookup and artifact together and competed with them for database threads
(``bench/boot_storm.py``, cell ``tunecache-report``). So the route only validates a report
and hands it to this process's :class:`ReportIntake`, which a thread of its own stores
:data:`BATCH_ROWS` at a time, one multi-row insert and one commit per batch, at least every
``flush_interval_s`` seconds.

What that costs, said plainly: a report is in the database up to ``flush_interval_s``
(default 0.5 s) after it was answered, and the reports taken but not yet stored are lost
if the process dies (a clean stop stores them first). Reports are best-effort telemetry
(the pod never waits for or retries one), so that is the trade. The intake holds at most
``max_rows`` reports: past that (a database down for long) the route answers 503 with
``Retry-After`` and nothing is taken; a batch the database refused is kept and tried again
after ``flush_interval_s``, so nothing taken is dropped while there is room.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections import deque

from sqlalchemy import insert
from sqlalchemy.orm import Session, sessionmaker

from tunecache.contract import PodReportCreate
from tunecache.service import reports
from tunecache.service.models import PodReport

log = logging.getLogger("tunecache")

#: Reports stored per insert and commit.
BATCH_ROWS = 500


class ReportIntake:
    """This process's reports not yet stored, and the thread that stores them.

    :meth:`offer` is called on the event loop (no I/O, no lock held across an ``await``);
    the storing thread starts with :meth:`start` and stores what is left at :meth:`stop`.
    """

    def __init__(self, sessions: sessionmaker[Session], flush_interval_s: float = 0.5, max_rows: int = 20_000):
        self._sessions = sessions
        self.flush_interval_s = flush_interval_s
        self.max_rows = max_rows
        self._rows: deque[dict] = deque()
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None

    def offer(self, report: PodReportCreate, received_at: dt.datetime) -> bool:
        """Take one validated report, received at ``received_at`` (UTC). ``False`` when the
        intake already holds ``max_rows`` (nothing is taken; the route answers 503)."""
        if len(self._rows) >= self.max_rows:
            return False
        self._rows.append(reports.report_row(report, received_at))
        if len(self._rows) >= BATCH_ROWS:
            self._wake.set()
        return True

    def pending(self) -> int:
        """Reports taken and not stored yet."""
        return len(self._rows)

    def start(self) -> None:
        """Start the storing thread (a daemon: it never keeps a process from exiting)."""
        self._thread = threading.Thread(target=self._run, name="tunecache-report-intake", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Store what is left (for at most ``timeout_s`` seconds) and end the thread."""
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self._rows:
            log.warning("%d pod reports not stored at shutdown", len(self._rows))

    def _run(self) -> None:
        while True:
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()
            stopping = self._stopping
            while self._rows:
                if not self.store_batch():
                    break  # the database refused: try again after the interval (or give up at stop)
            if stopping:
                return

    def store_batch(self) -> bool:
        """Store up to :data:`BATCH_ROWS` of the reports taken, oldest first, in one insert
        and one commit. ``True`` when stored (or none were waiting); on a database error
        the rows go back to the front of the intake and ``False`` is returned."""
        batch = [self._rows.popleft() for _ in range(min(BATCH_ROWS, len(self._rows)))]
        if not batch:
            return True
        try:
            with self._sessions.begin() as session:
                session.execute(insert(PodReport), batch)
        except Exception as exc:  # a database down or busy: keep the rows, say it once per batch
            self._rows.extendleft(reversed(batch))
            log.warning("%d pod reports not stored yet: %s: %s", len(batch), type(exc).__name__,
                        str(exc).splitlines()[0] if str(exc) else "")
            return False
        return True
