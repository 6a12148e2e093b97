"""Bounds on what pod reports can do to the fleet view and to the database.

Anyone may report (the ``read`` policy), so a report is a claim, not a fact. What keeps a
few hostile sources from rewriting the fleet view (``GET /v1/fleet``) or growing the
database, per process, per :data:`WINDOW_S` (one hour, fixed windows):

* **per source**: a *source* is who sent the report (:func:`source_of`): the token's name
  where a token was presented, else the client address (an IPv6 address as its /64, the
  block one host is given). At most ``TUNECACHE_REPORT_SOURCE_MAX`` reports of a source are
  taken (:class:`SourceGate`, on the event loop, before the intake: a flood never fills the
  intake); the rest are answered 202 and not stored;
* **per key and source**: one source counts for at most ``TUNECACHE_REPORT_BOOTS_PER_KEY``
  pod boots of one key, and brings at most ``TUNECACHE_REPORT_NEW_KEYS`` keys without a
  current tuning into the view (:class:`ReportFilter`); the wanted list shows how many
  distinct sources asked for a key, so one address cannot pass for a fleet;
* **per boot**: a report its boot already sent (same boot, pod, rank, reporting install
  kind, key, environment, outcome, run, error kind, with or without attestation) is not
  stored again, and the fleet view counts distinct boots, not reports;
* **installed**: an ``installed`` report must name a run that exists and is of the
  report's key, else it is not stored: made-up reports cannot move a key's hit rate.

Why 202 and not 429 past a bound: a pod never retries a report, and a real pod behind the
address of a flooder (one NAT, one node) would be refused with the flooder; dropping
quietly costs it no error and the flooder learns nothing. Pods that must not share a
budget with their neighbours present a token of their own (a source of its own). Every
report not stored is counted in ``tunecache_pod_reports_dropped_total{reason}``.

No database work on the request: :class:`SourceGate` is a dict on the event loop;
:class:`ReportFilter` runs in the intake's storing thread, once per report of a batch,
with the current tunings (read once per tuning generation) and one read of the batch's
installed runs. Their memory is bounded: :data:`MAX_SOURCES` sources a window (the rest
share one budget, :data:`OTHER_SOURCES`), each with at most its bounds' worth of keys and
boots, and :data:`MAX_REMEMBERED` reports remembered for repeats; everything is forgotten
when the window ends. The bounds are per process: N processes or replicas take up to N
times as much.
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Callable, Container, Mapping

from tunecache.contract import ReportOutcome
from tunecache.service.report_retention import Interval
from tunecache.service.tokens import Caller

#: Seconds of one window of the bounds (fixed windows: every count starts again at 0).
WINDOW_S = 3600.0
#: Sources tracked per window; the others share the budget of :data:`OTHER_SOURCES`.
MAX_SOURCES = 10_000
#: The source of every source past :data:`MAX_SOURCES` in a window.
OTHER_SOURCES = "(other sources)"
#: Reports remembered per window to recognise repeats (past it, repeats are stored and
#: still counted once per boot by the fleet view).
MAX_REMEMBERED = 200_000

_INSTALLED = ReportOutcome.INSTALLED.value


def source_of(host: str | None, caller: Caller) -> str:
    """Who sent a report: ``token:<name>`` with a token, else the client address (IPv6 as its
    /64 network; :func:`tunecache.service.client_address.client_address`: a proxy's own
    address unless it is named in ``TUNECACHE_TRUSTED_PROXIES``). At most 128 characters
    (``pod_reports.sender``)."""
    if not caller.anonymous:
        return f"token:{caller.name}"[:128]
    host = host or "-"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host[:128]
    if address.version == 6:
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)


class SourceGate:
    """At most ``per_source`` reports taken per source and window (on the event loop, no
    lock). ``admit`` answers whether this one is taken."""

    def __init__(self, per_source: int, window_s: float = WINDOW_S, clock: Callable[[], float] = time.monotonic,
                 max_sources: int = MAX_SOURCES):
        self.per_source, self.max_sources = per_source, max_sources
        self._window = Interval(window_s, clock, due_at_once=False)
        self._taken: dict[str, int] = {}

    def admit(self, source: str) -> bool:
        """Count one report of ``source``; ``False`` past its bound (nothing is counted)."""
        if self._window.due():  # a new window: every count starts again
            self._taken.clear()
        if source not in self._taken and len(self._taken) >= self.max_sources:
            source = OTHER_SOURCES
        taken = self._taken.get(source, 0)
        if taken >= self.per_source:
            return False
        self._taken[source] = taken + 1
        return True


class _Source:
    """What one source brought in this window: per key, its boots (and reports without a
    boot id, each a boot); keys without a current tuning."""

    __slots__ = ("boots", "unnamed", "new_keys")

    def __init__(self) -> None:
        self.boots: dict[str, set[str]] = {}
        self.unnamed: dict[str, int] = {}
        self.new_keys = 0


class ReportFilter:
    """Which reports of a batch are stored (the intake's storing thread only, no lock):
    :meth:`drop_reason` for each, in order."""

    def __init__(self, boots_per_key: int, new_keys: int, window_s: float = WINDOW_S,
                 clock: Callable[[], float] = time.monotonic, max_sources: int = MAX_SOURCES,
                 max_remembered: int = MAX_REMEMBERED):
        self.boots_per_key, self.new_keys, self.max_sources = boots_per_key, new_keys, max_sources
        self.max_remembered = max_remembered
        self._window = Interval(window_s, clock, due_at_once=False)
        self._sources: dict[str, _Source] = {}
        self._seen: set[tuple] = set()

    def drop_reason(self, row: dict, tuned_keys: Container[str], run_keys: Mapping[int, str]) -> str | None:
        """``None`` to store ``row`` (a :func:`tunecache.service.reports.report_row`; it is
        then counted), else why not (a :data:`tunecache.service.metrics.DROP_REASONS`).

        Args:
            row: the report's columns; ``sender`` ``None`` (not from a request): no
                per-source bound.
            tuned_keys: key hashes with a current tuning.
            run_keys: run id -> its key's hash, for the batch's installed runs that exist.
        """
        if self._window.due():  # a new window: every count starts again
            self._sources.clear()
            self._seen.clear()
        key_hash, boot = row["key_hash"], row["boot_id"]
        if row["outcome"] == _INSTALLED and run_keys.get(row["run_id"]) != key_hash:
            return "unknown_run"
        repeat = None
        if boot is not None:
            repeat = (boot, row["pod"], row["rank"], row["source"], key_hash, row["environment_hash"], row["outcome"],
                      row["run_id"], row["error_kind"], row["compiled"] is not None)
            if repeat in self._seen:
                return "repeat"
        sender = row["sender"]
        if sender is not None:
            if sender not in self._sources and len(self._sources) >= self.max_sources:
                sender = OTHER_SOURCES
            source = self._sources.get(sender) or self._sources.setdefault(sender, _Source())
            boots = source.boots.get(key_hash)
            if boots is None:
                if key_hash not in tuned_keys and source.new_keys >= self.new_keys:
                    return "new_key"
            elif boot is None or boot not in boots:
                if len(boots) + source.unnamed.get(key_hash, 0) >= self.boots_per_key:
                    return "key"
            if boots is None:
                boots = source.boots[key_hash] = set()
                if key_hash not in tuned_keys:
                    source.new_keys += 1
            if boot is None:
                source.unnamed[key_hash] = source.unnamed.get(key_hash, 0) + 1
            else:
                boots.add(boot)
        if repeat is not None and len(self._seen) < self.max_remembered:
            self._seen.add(repeat)
        return None
