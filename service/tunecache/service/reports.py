"""Storage of pod reports (table ``pod_reports``) and the fleet view read from them.

A pod sends one report after each install (:class:`tunecache.contract.PodReportCreate`,
``POST /v1/reports``); :func:`record_report` stores it in one short insert. The fleet view
(:func:`fleet_view`, ``GET /v1/fleet``) puts three reads together:

* :data:`CURRENT_RUNS`: the current tunings (``current_tunings`` and the run, key and
  environment of each: one row per key and environment that has one), as plain columns;
* :func:`report_counts`: reports of the window by key and outcome, from the index
  ``(received_at, key_hash, outcome)`` alone (an index-only scan): the hit rate of each key;
* :func:`miss_groups`: miss reports of the window by key and environment (distinct pods,
  count, latest), from the index ``(outcome, received_at, key_hash, environment_hash)``;
  those whose key and environment have a current tuning by now are not wanted any more.

and then reads a few report rows by id (:func:`report_keys`, :func:`latest_misses`): the key
of each reported key without a current tuning, the latest report of each wanted tuning. It
reads columns, never ORM rows, and builds each key (and its ``key_hash``) once: at 1,000
keys, 2,700 current tunings and 100,000 reports (14,000 in a day) it answers in about 30 ms
on 2 cores (``bench/fleet_queries.py``).

Reports are kept ``TUNECACHE_REPORT_RETENTION_DAYS``; :func:`prune_reports` deletes older
ones (the ``received_at`` index again), run by :class:`Pruner` at most once a minute per
process. Functions take the caller's session and never commit.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import time
from collections import defaultdict

from sqlalchemy import Select, Text, cast, delete, func, select
from sqlalchemy.orm import Session

from tunecache.contract import (
    FLEET_LIMIT,
    KEY_FIELDS,
    EnvironmentMetadata,
    FieldDifference,
    FleetKey,
    FleetRun,
    FleetView,
    PodReportCreate,
    ReportOutcome,
    TuningKey,
    WantedTuning,
)
from tunecache.service.models import CurrentTuning, Environment, PodReport, TuningKeyRow, TuningRun, utcnow

#: The key fields of a report row, in :data:`tunecache.contract.KEY_FIELDS` order.
_KEY_COLUMNS = tuple(getattr(PodReport, f) for f in KEY_FIELDS)


def record_report(session: Session, report: PodReportCreate, received_at: dt.datetime | None = None) -> int:
    """Store one report (received now, or at ``received_at``); returns its id. One insert."""
    row = PodReport(
        received_at=received_at or utcnow(),
        key_hash=report.key.key_hash(),
        **report.key.model_dump(),
        environment_hash=report.environment_hash,
        environment=report.environment.model_dump() if report.environment is not None else None,
        outcome=report.outcome.value,
        run_id=report.run_id,
        differences=[d.model_dump() for d in report.differences] or None,
        error_kind=report.error_kind,
        install_seconds=report.install_seconds,
        jit_modules=report.jit_modules,
        jit_skipped=report.jit_skipped,
        pod=report.pod,
        rank=report.rank,
        source=report.source.value,
        looked_up=report.looked_up,
    )
    session.add(row)
    session.flush()
    return row.id


def prune_reports(session: Session, older_than: dt.datetime) -> int:
    """Delete the reports received before ``older_than``; returns how many."""
    result = session.execute(delete(PodReport).where(PodReport.received_at < older_than))
    return result.rowcount or 0


class Pruner:
    """Says when this process should delete old reports: at most once per ``interval_s``
    (the first call: at once). Called on the event loop only (no lock)."""

    def __init__(self, interval_s: float = 60.0):
        self.interval_s = interval_s
        self._next = 0.0

    def due(self) -> bool:
        """Whether a prune is due now; if so, the next one is due ``interval_s`` later."""
        now = time.monotonic()
        if now < self._next:
            return False
        self._next = now + self.interval_s
        return True


def report_counts(since: dt.datetime) -> Select:
    """Reports received since ``since`` by key and outcome: ``(key_hash, outcome, count,
    latest received_at)``. Every column is in the index ``(received_at, key_hash, outcome)``,
    so PostgreSQL answers from the index alone."""
    return (select(PodReport.key_hash, PodReport.outcome, func.count(), func.max(PodReport.received_at))
            .where(PodReport.received_at >= since)
            .group_by(PodReport.key_hash, PodReport.outcome))


def miss_groups(since: dt.datetime) -> Select:
    """Miss reports received since ``since`` by key and environment: ``(key_hash,
    environment_hash, distinct pods, count, latest received_at, latest id)``."""
    return (select(PodReport.key_hash, PodReport.environment_hash, func.count(PodReport.pod.distinct()), func.count(),
                   func.max(PodReport.received_at), func.max(PodReport.id))
            .where(PodReport.outcome == ReportOutcome.MISS.value, PodReport.received_at >= since)
            .group_by(PodReport.key_hash, PodReport.environment_hash))


def report_keys(since: dt.datetime, key_hashes: list[str]) -> Select:
    """The key of each of ``key_hashes`` as its latest report since ``since`` names it:
    ``(key_hash, *KEY_FIELDS)``, one row per key hash that has a report in the window."""
    latest = (select(func.max(PodReport.id))
              .where(PodReport.received_at >= since, PodReport.key_hash.in_(key_hashes))
              .group_by(PodReport.key_hash))
    return select(PodReport.key_hash, *_KEY_COLUMNS).where(PodReport.id.in_(latest.scalar_subquery()))


def wanted_rows(since: dt.datetime) -> Select:
    """Each group of :func:`miss_groups` with what the wanted list shows of its latest
    report: ``(key_hash, environment_hash, distinct pods, count, latest received_at,
    environment, closest run_id, differences, *KEY_FIELDS)``, ``environment`` and
    ``differences`` as JSON text (decoded for the groups shown only). The latest report is
    read by its primary key."""
    groups = miss_groups(since).subquery()
    key_hash, environment_hash, pods, count, last, latest_id = groups.c
    return (select(key_hash, environment_hash, pods, count, last, cast(PodReport.environment, Text), PodReport.run_id,
                   cast(PodReport.differences, Text), *_KEY_COLUMNS)
            .join_from(groups, PodReport, PodReport.id == latest_id))


#: The current tunings with what the matrix shows of each: ``(key id, environment id, run
#: id, created_at, entries, trigger)``; ``entries`` is the summary's ``entries`` as JSON text
#: (:func:`_entries`), read in the database (a tuner's summary is ~1 KB of JSON).
CURRENT_RUNS = (
    select(CurrentTuning.key_id, CurrentTuning.environment_id, TuningRun.id, TuningRun.created_at,
           cast(TuningRun.summary["entries"], Text), TuningRun.trigger)
    .select_from(CurrentTuning)
    .join(TuningRun, TuningRun.id == CurrentTuning.run_id)
)

#: The keys that have a current tuning: ``(id, *KEY_FIELDS)``, each once.
CURRENT_KEYS = select(TuningKeyRow.id, *(getattr(TuningKeyRow, f) for f in KEY_FIELDS)).where(
    TuningKeyRow.id.in_(select(CurrentTuning.key_id)))

#: The environments that have a current tuning: ``(id, env_hash, flashinfer_version)``.
CURRENT_ENVIRONMENTS = select(Environment.id, Environment.env_hash, Environment.flashinfer_version).where(
    Environment.id.in_(select(CurrentTuning.environment_id)))

#: A JSON integer as JSON writes it (what ``json.loads`` reads as an ``int``).
_JSON_INT = re.compile(r"-?(?:0|[1-9][0-9]*)")


def _entries(text: str | None) -> int | None:
    """The summary's ``entries`` (its JSON text) when it is a JSON integer (or boolean, which
    Python counts as one: 1 or 0), else ``None``."""
    if text is None:
        return None
    if _JSON_INT.fullmatch(text):
        return int(text)
    return {"true": 1, "false": 0}.get(text)


#: Key hashes per ``IN (...)`` of :func:`report_keys`.
_IN_CHUNK = 500


def _key(values) -> TuningKey:
    """The key of a row's key columns (in :data:`~tunecache.contract.KEY_FIELDS` order)."""
    return TuningKey.model_validate(dict(zip(KEY_FIELDS, values)))


def fleet_view(session: Session, hours: float, now: dt.datetime | None = None) -> FleetView:
    """The fleet matrix and the wanted list over the last ``hours`` (see the module).

    Keys: every key with a current tuning, and every key pods reported in the window,
    most reports first, then by model; each with its current runs (newest first), its
    report counts and ``hit_rate`` = installed / all reports. Wanted: each key and
    environment with miss reports in the window and no current tuning now, most distinct
    pods first, with the latest report's closest run and differences. At most
    :data:`~tunecache.contract.FLEET_LIMIT` of each (``truncated`` says when there were more).
    """
    now = now or utcnow()
    since = now - dt.timedelta(hours=hours)
    keys: dict[str, TuningKey] = {}
    hash_of_key_id: dict[int, str] = {}
    for key_id, *values in session.execute(CURRENT_KEYS):
        key = _key(values)
        hash_of_key_id[key_id] = key_hash = key.key_hash()
        keys[key_hash] = key
    environments = {environment_id: (env_hash, flashinfer_version)
                    for environment_id, env_hash, flashinfer_version in session.execute(CURRENT_ENVIRONMENTS)}
    runs: dict[str, list[FleetRun]] = defaultdict(list)
    current_pairs: set[tuple[str, str]] = set()
    for key_id, environment_id, run_id, created_at, entries, trigger in session.execute(CURRENT_RUNS):
        key_hash = hash_of_key_id[key_id]
        env_hash, flashinfer_version = environments[environment_id]
        current_pairs.add((key_hash, env_hash))
        runs[key_hash].append(FleetRun(
            run_id=run_id, environment_hash=env_hash, flashinfer_version=flashinfer_version, created_at=created_at,
            age_s=max(0.0, (now - created_at).total_seconds()), entries=_entries(entries), trigger=trigger))

    counts: dict[str, dict[str, int]] = defaultdict(dict)
    last_report: dict[str, dt.datetime] = {}
    for key_hash, outcome, count, latest in session.execute(report_counts(since)):
        counts[key_hash][outcome] = count
        last_report[key_hash] = max(latest, last_report.get(key_hash, latest))

    # Wanted: groups whose key and environment have no current tuning. Their rows also name
    # the reported keys without a current tuning; any others are read by key hash.
    groups = []
    for row in session.execute(wanted_rows(since)):
        key_hash = row[0]
        if key_hash not in keys and key_hash in counts:
            keys[key_hash] = _key(row[8:])
        if (key_hash, row[1]) not in current_pairs:
            groups.append(row)
    unnamed = [h for h in counts if h not in keys]
    for start in range(0, len(unnamed), _IN_CHUNK):
        for key_hash, *values in session.execute(report_keys(since, unnamed[start:start + _IN_CHUNK])):
            keys[key_hash] = _key(values)

    order = []
    for key_hash, key in keys.items():
        by_outcome = counts.get(key_hash, {})
        order.append((-sum(by_outcome.values()), key.model, key.gpu_name, key.max_num_batched_tokens, key_hash))
    order.sort()
    matrix = []
    for minus_total, _model, _gpu_name, _tokens, key_hash in order[:FLEET_LIMIT]:
        by_outcome = counts.get(key_hash, {})
        total = -minus_total
        installed = by_outcome.get(ReportOutcome.INSTALLED.value, 0)
        matrix.append(FleetKey(
            key=keys[key_hash], current=sorted(runs.get(key_hash, []), key=lambda r: r.created_at, reverse=True),
            reports=total, installed=installed, missed=by_outcome.get(ReportOutcome.MISS.value, 0),
            errors=by_outcome.get(ReportOutcome.ERROR.value, 0), hit_rate=installed / total if total else None,
            last_report_at=last_report.get(key_hash)))

    groups.sort(key=lambda g: (-g[2], -g[3], -g[4].timestamp()))
    wanted = []
    for key_hash, env_hash, pods, count, last, environment, closest_run_id, found, *values in groups[:FLEET_LIMIT]:
        environment = json.loads(environment) if environment is not None else None
        found = json.loads(found) if found is not None else None
        wanted.append(WantedTuning(
            key=keys.get(key_hash) or _key(values), environment_hash=env_hash,
            environment=EnvironmentMetadata.model_validate(environment) if environment else None,
            pods=pods, reports=count, last_asked_at=last, closest_run_id=closest_run_id,
            differences=[FieldDifference.model_validate(d) for d in found or []]))
    return FleetView(hours=hours, since=since, generated_at=now, keys=matrix, wanted=wanted,
                     truncated=len(keys) > FLEET_LIMIT or len(groups) > FLEET_LIMIT)
