"""Install reports: after each install a pod tells the server what it came to, best-effort.

Every install (``tunecache pull``, the Python API's :func:`tunecache.client.api.install_tuning`
and :func:`tunecache.client.install.pull_autotune_file`, the vLLM plugin) ends in one
:class:`tunecache.contract.PodReportCreate`: the key and environment hash (the environment
itself on a miss), ``installed`` with the run / ``miss`` with the closest run's differing
fields / ``error`` with the error's class, the seconds the install took, JIT modules
installed and skipped, the pod's hostname and rank, and the pod boot's id (:func:`boot_id`:
the fleet view counts a boot once, however many installs, ranks and repeats it reports).

An install that failed because the server could not be reached, did not answer in time or
answered with an error status is not reported (:func:`worth_reporting`): that server would
not take the report either, and a fleet of pods would only add load to a server in trouble.

The report never delays or fails the install: it is sent after the install finished, on a
daemon thread (:func:`send_in_background`), with one attempt and
``TUNECACHE_REPORT_TIMEOUT`` (2 s) for everything (connect, send, answer); any failure is
logged at debug level and dropped. A process that ends right after (``tunecache pull``)
waits at exit for its reports until their timeout at most (:func:`wait_for_reports`, run
by :mod:`atexit`), so its exit code never changes and its exit comes at most that much
later. ``TUNECACHE_REPORT=0`` (the client's ``reports``) sends nothing.

    with installing(client, key, environment, ReportSource.API) as report:
        installed = ...                     # the install; an exception is reported and re-raised
        report.installed(run_id, jit_modules=2, jit_skipped=0)
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from tunecache.store.http import ServerError, ServerUnreachable, TunecacheClient
from tunecache.contract import (
    BOOT_ID_PATTERN,
    EnvironmentMetadata,
    PodReportCreate,
    ReportOutcome,
    ReportSource,
    ReportedDifference,
    TuningKey,
)
from tunecache.store import NoCompatibleTuning

log = logging.getLogger("tunecache.report")

#: Seconds a report thread may run past its timeout before :func:`wait_for_reports` stops waiting.
_SLACK_S = 0.25

_pending: list[tuple[threading.Thread, float]] = []
_lock = threading.Lock()
_atexit_registered = False


#: This process's boot id, once made (:func:`boot_id`).
_boot_id: str | None = None


def boot_id() -> str:
    """This pod boot's id, as every report of the boot carries it
    (:attr:`~tunecache.contract.PodReportCreate.boot_id`).

    ``TUNECACHE_BOOT_ID`` when it holds a valid one (an operator may set it, e.g. to the
    Kubernetes pod's UID; it must differ between boots); else a random one made now and put
    in ``TUNECACHE_BOOT_ID``, so the processes this one starts afterwards (vLLM's workers,
    each a rank) inherit it and the boot's ranks count once. The same for the life of the
    process."""
    global _boot_id
    if _boot_id is None:
        given = os.environ.get("TUNECACHE_BOOT_ID", "")
        if not re.fullmatch(BOOT_ID_PATTERN, given):
            given = os.urandom(16).hex()
            os.environ["TUNECACHE_BOOT_ID"] = given
        _boot_id = given
    return _boot_id


def pod_name() -> str:
    """This pod's name as reports carry it: the hostname (a Kubernetes pod's name)."""
    return (socket.gethostname() or "unknown")[:255]


def worth_reporting(error: BaseException) -> bool:
    """Whether an install that raised ``error`` is reported: a miss or a failure on the pod
    (untrusted run, corrupt artifact, full disk, ...) is; the server being unreachable, too
    slow (:class:`~tunecache.store.http.InstallDeadlineExceeded` included) or answering an
    error status is not (see the module)."""
    return not isinstance(error, (ServerUnreachable, ServerError))


def outcome_of(error: BaseException) -> tuple[ReportOutcome, dict]:
    """The report fields of an install that raised ``error``: a miss (the closest run and
    its differences, as the lookup's 404 named them) or an error (its class name)."""
    if isinstance(error, NoCompatibleTuning):
        closest = error.miss.closest[0] if error.miss.closest else None
        differences = [ReportedDifference(field=d.field, stored=d.stored[:4096], yours=d.yours[:4096])
                       for d in (closest.differences if closest else [])][:16]
        return ReportOutcome.MISS, {"run_id": closest.run_id if closest else None, "differences": differences}
    return ReportOutcome.ERROR, {"error_kind": type(error).__name__[:64]}


def build_report(key: TuningKey, environment: EnvironmentMetadata, outcome: ReportOutcome, seconds: float,
                 source: ReportSource, *, rank: int | None = None, looked_up: bool = True, **fields) -> PodReportCreate | None:
    """A report of one install (``fields``: ``run_id``, ``differences``, ``error_kind``,
    ``jit_modules``, ``jit_skipped``); the environment goes along with a miss. ``None``
    when the values cannot make a valid report (logged at debug level): reporting never raises."""
    try:
        return PodReportCreate(
            key=key, environment_hash=environment.environment_hash(),
            environment=environment if outcome is ReportOutcome.MISS else None, outcome=outcome,
            install_seconds=min(max(seconds, 0.0), 86400.0), pod=pod_name(), rank=rank, source=source,
            looked_up=looked_up, boot_id=boot_id(), **fields)
    except Exception as exc:
        log.debug("tunecache: no install report: %s", exc)
        return None


def send_in_background(client: TunecacheClient, report: PodReportCreate | None) -> threading.Thread | None:
    """Send ``report`` to ``client``'s server on a daemon thread, through a
    :meth:`~TunecacheClient.reporting_client` (one attempt, ``report_timeout_s`` in all);
    never raises, never waits. ``None`` when nothing is sent (``client.reports`` is off,
    or no report)."""
    if report is None or not getattr(client, "reports", False):
        return None
    try:
        sender = client.reporting_client()
    except Exception as exc:  # e.g. a CA bundle that went away since the install
        log.debug("tunecache: install report not sent: %s: %s", type(exc).__name__, exc)
        return None
    thread = threading.Thread(target=_send, args=(sender, report), name="tunecache-report", daemon=True)
    _track(thread, time.monotonic() + sender.report_timeout_s + _SLACK_S)
    thread.start()
    return thread


def _send(sender: TunecacheClient, report: PodReportCreate) -> None:
    try:
        with sender, sender.deadline_scope():
            sender.send_report(report)
    except Exception as exc:  # best-effort: the install is done whatever happens here
        log.debug("tunecache: install report not sent: %s: %s", type(exc).__name__, exc)


def _track(thread: threading.Thread, deadline: float) -> None:
    global _atexit_registered
    with _lock:
        _pending[:] = [(t, d) for t, d in _pending if t.is_alive()]
        _pending.append((thread, deadline))
        if not _atexit_registered:
            atexit.register(wait_for_reports)
            _atexit_registered = True


def wait_for_reports(timeout: float | None = None) -> bool:
    """Wait for the reports still being sent, each until its own deadline (its timeout
    after it started), and at most ``timeout`` seconds in all. Returns whether all were
    done. Registered with :mod:`atexit` by the first report of a process."""
    give_up = None if timeout is None else time.monotonic() + timeout
    with _lock:
        pending = list(_pending)
    for thread, deadline in pending:
        until = deadline if give_up is None else min(deadline, give_up)
        thread.join(max(0.0, until - time.monotonic()))
    with _lock:
        _pending[:] = [(t, d) for t, d in _pending if t.is_alive()]
        return not _pending


@dataclass
class InstallReport:
    """What an install under :func:`installing` came to; call :meth:`installed` when it did."""

    run_id: int | None = None
    jit_modules: int = 0
    jit_skipped: int = 0
    installed_from: list[int] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    def installed(self, run_id: int, jit_modules: int = 0, jit_skipped: int = 0,
                  installed_from: list[int] | None = None) -> None:
        """The install put run ``run_id`` in place, with ``jit_modules`` JIT modules
        installed and ``jit_skipped`` of the run's not (``installed_from``: the runs it
        installed from, the default ``[run_id]``)."""
        self.run_id, self.jit_modules, self.jit_skipped = run_id, jit_modules, jit_skipped
        self.installed_from = installed_from or [run_id]


@contextlib.contextmanager
def installing(client: TunecacheClient, key: TuningKey, environment: EnvironmentMetadata, source: ReportSource,
               rank: int | None = None) -> Iterator[InstallReport]:
    """Time the install in the ``with`` block and report it when it ends: ``installed``
    when the block called :meth:`InstallReport.installed`, a miss or an error when it
    raised and :func:`worth_reporting` (the exception goes on unchanged;
    :class:`KeyboardInterrupt` and :class:`SystemExit` are not reported). Sent by
    :func:`send_in_background`."""
    report = InstallReport()
    try:
        yield report
    except Exception as exc:
        if not worth_reporting(exc):
            raise
        outcome, fields = outcome_of(exc)
        send_in_background(client, build_report(key, environment, outcome, time.monotonic() - report.started, source,
                                                rank=rank, **fields))
        raise
    if report.run_id is not None:
        send_in_background(client, build_report(
            key, environment, ReportOutcome.INSTALLED, time.monotonic() - report.started, source, rank=rank,
            run_id=report.run_id, jit_modules=report.jit_modules, jit_skipped=report.jit_skipped,
            installed_from=report.installed_from))
