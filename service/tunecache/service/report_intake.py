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

Before a batch is stored, each report passes :class:`~tunecache.service.report_bounds.ReportFilter`
(when the intake has one; the service's does): an ``installed`` report whose run does not
exist or is another key's, a repeat of its boot, and what is past a source's bounds are not
stored (counted in ``tunecache_pod_reports_dropped_total``). That costs a batch two reads
(the tuning generation, the current tunings when it moved; the batch's installed runs),
none on the request path.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections import deque
from collections.abc import Callable

from sqlalchemy import insert, select
from sqlalchemy.orm import Session, sessionmaker

from tunecache.contract import KEY_FIELDS, PodReportCreate, TuningKey
from tunecache.service import metrics, reports
from tunecache.service.models import PodReport, TuningKeyRow, TuningRun
from tunecache.service.report_bounds import ReportFilter

log = logging.getLogger("tunecache")

#: Reports stored per insert and commit.
BATCH_ROWS = 500


class ReportIntake:
    """This process's reports not yet stored, and the thread that stores them.

    :meth:`offer` is called on the event loop (no I/O, no lock held across an ``await``);
    the storing thread starts with :meth:`start` and stores what is left at :meth:`stop`.
    """

    def __init__(self, sessions: sessionmaker[Session], flush_interval_s: float = 0.5, max_rows: int = 20_000,
                 bounds: ReportFilter | None = None,
                 after_batch: Callable[[Session, list[dict]], object] | None = None):
        self._sessions = sessions
        #: Called with each stored batch's rows, in a transaction of its own (the service's:
        #: :func:`tunecache.service.variant_autotune.queue_wanted_variants` when it is on).
        self.after_batch = after_batch
        self.flush_interval_s = flush_interval_s
        self.max_rows = max_rows
        self.bounds = bounds or ReportFilter(boots_per_key=1 << 30, new_keys=1 << 30)
        #: ``(row, checked)``: ``checked`` once the filter kept it (a batch the database
        #: refused is not filtered, nor counted, twice)
        self._rows: deque[tuple[dict, bool]] = deque()
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None

    def offer(self, report: PodReportCreate, received_at: dt.datetime, sender: str | None = None,
              token_name: str | None = None) -> bool:
        """Take one validated report, received at ``received_at`` (UTC) from ``sender``
        (:func:`~tunecache.service.report_bounds.source_of`; ``None``: no per-source bound)
        with the token named ``token_name`` (``None``: none). ``False`` when the intake
        already holds ``max_rows`` (nothing is taken; the route answers 503)."""
        if len(self._rows) >= self.max_rows:
            return False
        self._rows.append((reports.report_row(report, received_at, sender, token_name), False))
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
        and one commit, those the filter keeps (see the module). ``True`` when stored (or
        none were waiting); on a database error the rows go back to the front of the intake
        and ``False`` is returned."""
        batch = [self._rows.popleft() for _ in range(min(BATCH_ROWS, len(self._rows)))]
        if not batch:
            return True
        try:
            with self._sessions.begin() as session:
                batch = self._filtered(session, batch)
                if batch:
                    session.execute(insert(PodReport), [row for row, _checked in batch])
        except Exception as exc:  # a database down or busy: keep the rows, say it once per batch
            self._rows.extendleft(reversed(batch))
            log.warning("%d pod reports not stored yet: %s: %s", len(batch), type(exc).__name__,
                        str(exc).splitlines()[0] if str(exc) else "")
            return False
        if batch and self.after_batch is not None:
            try:
                with self._sessions.begin() as session:
                    self.after_batch(session, [row for row, _checked in batch])
            except Exception as exc:  # the reports are stored; what follows them is tried with the next batch
                log.warning("after a batch of pod reports: %s: %s", type(exc).__name__, str(exc).splitlines()[0])
        return True

    def _filtered(self, session: Session, batch: list[tuple[dict, bool]]) -> list[tuple[dict, bool]]:
        """The rows of ``batch`` the filter keeps, each marked checked; the others counted
        in ``tunecache_pod_reports_dropped_total``. Reads the current tunings (once per
        generation) and the batch's installed runs first: on a database error nothing is
        filtered yet."""
        unchecked = [row for row, checked in batch if not checked]
        if not unchecked:
            return batch
        run_ids = {row["run_id"] for row in unchecked if row["outcome"] == "installed"}
        run_keys: dict[int, str] = {}
        if run_ids:
            key_columns = [getattr(TuningKeyRow, f) for f in KEY_FIELDS]
            for run_id, *values in session.execute(
                    select(TuningRun.id, *key_columns).join(TuningKeyRow, TuningKeyRow.id == TuningRun.key_id)
                    .where(TuningRun.id.in_(run_ids))):
                run_keys[run_id] = TuningKey.model_validate(dict(zip(KEY_FIELDS, values))).key_hash()
        tuned = reports.current_tunings(session).keys if any(row["sender"] for row in unchecked) else {}
        kept = []
        for row, checked in batch:
            if not checked:
                reason = self.bounds.drop_reason(row, tuned, run_keys)
                if reason is not None:
                    metrics.pod_report_dropped(reason)
                    continue
            kept.append((row, True))
        return kept
