"""Storage of pod reports (table ``pod_reports``) and the fleet view read from them.

A pod sends one report after each install (:class:`tunecache.contract.PodReportCreate`,
``POST /v1/reports``); the service takes it in memory and stores it in a batch
(:mod:`tunecache.service.report_intake`, rows by :func:`report_row`). The fleet view
(:func:`fleet_view`, ``GET /v1/fleet``) puts three reads together, as plain columns (never
ORM rows):

* :func:`current_tunings`: the current tunings (``current_tunings`` with the run, key and
  environment of each: one per key and environment that has one; :data:`CURRENT_KEYS`,
  :data:`CURRENT_ENVIRONMENTS`, :data:`CURRENT_RUNS`), each key built and hashed once. They
  only change with the tuning generation, so they are read once per generation and kept;
* :func:`report_counts`: pod boots that reported in the window by key and outcome (a boot
  counts once, however many reports it sent: :func:`boots`), from the index ``(received_at,
  key_hash, outcome, boot_id)`` alone (an index-only scan): the hit rate of each key;
* :func:`wanted_rows`: :func:`miss_groups` (miss reports of the window by key and
  environment: distinct pods, count, latest; from the index ``(outcome, received_at,
  key_hash, environment_hash)``; distinct sources too) each with its latest report, read by
  primary key; those
  whose key and environment have a current tuning by now are not wanted any more. Their rows
  also name the reported keys that have no current tuning (:func:`report_keys` names any
  other, rare: a key with error reports only).

Every key and wanted group of the window is counted and ordered, but the answer is a page
(``limit`` keys from ``offset``, ``wanted_limit`` wanted tunings from ``wanted_offset``):
only the page's rows are built, then validated once, as a whole. (A whole matrix of 1,000
keys was a 1.2 MB answer whose validation and encoding cost more than its reads.)
``bench/fleet_queries.py`` times the first and a deep page on PostgreSQL with 1,000 keys,
10,000 runs and 100,000 reports (docs/benchmarks.md, "Fleet queries").

Reports are kept ``TUNECACHE_REPORT_RETENTION_DAYS`` (:mod:`tunecache.service.report_retention`
deletes older ones). Functions take the caller's session and never commit.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import threading
import weakref
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, Select, Text, and_, bindparam, case, cast, func, select
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import BindParameter

from tunecache.contract import (
    FLEET_PAGE_DEFAULT,
    KEY_FIELDS,
    FleetView,
    PodReportCreate,
    ReportOutcome,
    TuningKey,
)
from tunecache.service import auto_tune_refusals, fleet_images, repository
from tunecache.service.models import (CurrentTuning, CurrentVariant, Environment, PodReport, TuningKeyRow, TuningRun,
                                      utcnow)

#: The key fields of a report row, in :data:`tunecache.contract.KEY_FIELDS` order.
_KEY_COLUMNS = tuple(getattr(PodReport, f) for f in KEY_FIELDS)


def report_row(report: PodReportCreate, received_at: dt.datetime, sender: str | None = None,
               token_name: str | None = None) -> dict:
    """The ``pod_reports`` columns of one report received at ``received_at`` (UTC) from
    ``sender`` (:func:`tunecache.service.report_bounds.source_of`) with the token named
    ``token_name`` (``None``: none), as a dict for an insert (one row of
    :func:`record_report` or of a batch, :mod:`tunecache.service.report_intake`)."""
    return dict(
        received_at=received_at,
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
        compiled={k.value: v for k, v in report.compiled.items()} if report.compiled is not None else None,
        compiled_total=sum(report.compiled.values()) if report.compiled is not None else None,
        boot_id=report.boot_id,
        variant=report.variant,
        variant_missing=report.variant_missing,
        engine_args=report.engine_args or None,
        missing_kinds=",".join(report.missing_kinds) or None,
        installed_from=report.installed_from or None,
        sender=sender,
        token_name=token_name,
    )


def record_report(session: Session, report: PodReportCreate, received_at: dt.datetime | None = None) -> int:
    """Store one report (received now, or at ``received_at``); returns its id. One insert.
    (The service stores the reports pods send in batches: :mod:`tunecache.service.report_intake`.)"""
    row = PodReport(**report_row(report, received_at or utcnow()))
    session.add(row)
    session.flush()
    return row.id


def boots():
    """Pod boots among a group's reports: distinct ``boot_id``s, plus one per report without
    one (a client before boot ids: each report a boot of its own, as it counted before)."""
    return func.count(PodReport.boot_id.distinct()) + func.count() - func.count(PodReport.boot_id)


def report_counts(since: dt.datetime | BindParameter) -> Select:
    """Pod boots that reported since ``since`` by key and outcome (:func:`boots`): ``(key_hash,
    outcome, boots, latest received_at)``. Every column is in the index ``(received_at,
    key_hash, outcome, boot_id)``, so PostgreSQL answers from the index alone."""
    return (select(PodReport.key_hash, PodReport.outcome, boots(), func.max(PodReport.received_at))
            .where(PodReport.received_at >= since)
            .group_by(PodReport.key_hash, PodReport.outcome))


def attestations(since: dt.datetime | BindParameter) -> Select:
    """Attested reports received since ``since`` by key: ``(key_hash, attested, at the floor)``."""
    return (select(PodReport.key_hash, func.count(PodReport.compiled_total),
                   func.sum(case((PodReport.compiled_total == 0, 1), else_=0)))
            .where(PodReport.received_at >= since, PodReport.compiled_total.is_not(None))
            .group_by(PodReport.key_hash))


def still_compiling(since: dt.datetime, key_hashes: list[str]) -> Select:
    """The attestations of boots that compiled something, received since ``since``, of ``key_hashes``."""
    return (select(PodReport.key_hash, PodReport.compiled)
            .where(PodReport.received_at >= since, PodReport.compiled_total > 0, PodReport.key_hash.in_(key_hashes)))


def miss_groups(since: dt.datetime | BindParameter) -> Select:
    """Miss reports received since ``since`` by key and environment: ``(key_hash,
    environment_hash, distinct pods, boots (:func:`boots`), latest received_at, latest id,
    distinct sources)``."""
    return (select(PodReport.key_hash, PodReport.environment_hash, func.count(PodReport.pod.distinct()), boots(),
                   func.max(PodReport.received_at), func.max(PodReport.id), func.count(PodReport.sender.distinct()))
            .where(PodReport.outcome == ReportOutcome.MISS.value, PodReport.received_at >= since)
            .group_by(PodReport.key_hash, PodReport.environment_hash))


def report_keys(since: dt.datetime, key_hashes: list[str]) -> Select:
    """The key of each of ``key_hashes`` as its latest report since ``since`` names it:
    ``(key_hash, *KEY_FIELDS)``, one row per key hash that has a report in the window."""
    latest = (select(func.max(PodReport.id))
              .where(PodReport.received_at >= since, PodReport.key_hash.in_(key_hashes))
              .group_by(PodReport.key_hash))
    return select(PodReport.key_hash, *_KEY_COLUMNS).where(PodReport.id.in_(latest.scalar_subquery()))


def wanted_rows(since: dt.datetime | BindParameter) -> Select:
    """Each group of :func:`miss_groups` with what the wanted list shows of its latest
    report: ``(key_hash, environment_hash, distinct pods, count, latest received_at,
    environment, closest run_id, differences, distinct sources, *KEY_FIELDS)``, ``environment`` and
    ``differences`` as JSON text (decoded for the groups shown only). The latest report is
    read by its primary key."""
    groups = miss_groups(since).subquery()
    key_hash, environment_hash, pods, count, last, latest_id, sources = groups.c
    return (select(key_hash, environment_hash, pods, count, last, cast(PodReport.environment, Text), PodReport.run_id,
                   cast(PodReport.differences, Text), sources, *_KEY_COLUMNS)
            .join_from(groups, PodReport, PodReport.id == latest_id))


def variant_groups(since: dt.datetime | BindParameter) -> Select:
    """Reports naming an engine variant received since ``since`` by key, environment and
    variant: ``(key_hash, environment_hash, variant, boots (:func:`boots`), boots that found
    no warm state for it, distinct pods, latest received_at, latest id)``."""
    missing = PodReport.variant_missing.is_(True)
    return (select(PodReport.key_hash, PodReport.environment_hash, PodReport.variant, boots(),
                   func.count(case((missing, PodReport.boot_id)).distinct())
                   + func.coalesce(func.sum(case((and_(missing, PodReport.boot_id.is_(None)), 1), else_=0)), 0),
                   func.count(PodReport.pod.distinct()), func.max(PodReport.received_at), func.max(PodReport.id))
            .where(PodReport.received_at >= since, PodReport.variant.is_not(None))
            .group_by(PodReport.key_hash, PodReport.environment_hash, PodReport.variant))


#: The current run of every engine variant: ``(variant, run id, env_hash, *KEY_FIELDS)``.
CURRENT_VARIANTS = (
    select(CurrentVariant.variant, CurrentVariant.run_id, Environment.env_hash,
           *(getattr(TuningKeyRow, f) for f in KEY_FIELDS))
    .select_from(CurrentVariant)
    .join(TuningKeyRow, TuningKeyRow.id == CurrentVariant.key_id)
    .join(Environment, Environment.id == CurrentVariant.environment_id)
)


def _fleet_variants(connection: Connection, since: dt.datetime,
                    refused: dict[tuple[str, str], dict[str, int]]) -> dict[str, list[dict[str, Any]]]:
    """Each key's engine variants reported since ``since`` (:func:`variant_groups`), as
    :class:`~tunecache.contract.FleetVariant` fields, most boots first; with the engine
    arguments of each group's latest report, the variant's current run now and its
    automatic tunings refused (``refused``: :func:`~tunecache.service.auto_tune_refusals.refusals_since`)."""
    groups = connection.execute(variant_groups(since)).all()
    if not groups:
        return {}
    current = {(_key(values).key_hash(), env_hash, variant): run_id
               for variant, run_id, env_hash, *values in connection.execute(CURRENT_VARIANTS)}
    latest = [row[7] for row in groups]
    args: dict[int, Any] = {}
    for start in range(0, len(latest), _IN_CHUNK):
        for report_id, engine_args in connection.execute(
                select(PodReport.id, cast(PodReport.engine_args, Text)).where(PodReport.id.in_(latest[start:start + _IN_CHUNK]))):
            args[report_id] = json.loads(engine_args) if engine_args is not None else None
    variants: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for key_hash, env_hash, variant, count, missing, pods, last, latest_id in groups:
        variants[key_hash].append({"variant": variant, "environment_hash": env_hash, "boots": count, "missing": missing,
                                   "pods": pods, "current_run_id": current.get((key_hash, env_hash, variant)),
                                   "engine_args": args.get(latest_id) or None, "last_report_at": last,
                                   "auto_tune_refused": refused.get((key_hash, variant), {})})
    for found in variants.values():
        found.sort(key=lambda v: (-v["boots"], -v["last_report_at"].timestamp(), v["variant"], v["environment_hash"]))
    return variants


#: The current tunings with what the matrix shows of each: ``(key id, environment id, run
#: id, created_at, entries, trigger)``; ``entries`` is the summary's ``entries`` as JSON text
#: (:func:`_entries`), read in the database (a tuner's summary is ~1 KB of JSON).
CURRENT_RUNS = (
    select(CurrentTuning.key_id, CurrentTuning.environment_id, TuningRun.id, TuningRun.created_at,
           cast(TuningRun.summary["entries"], Text), TuningRun.trigger,
           TuningRun.summary["vllm_compile"]["vllm_version"].as_string(),
           TuningRun.summary["dependencies"]["torch"].as_string())
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

#: Key hashes per ``IN (...)`` of :func:`report_keys`.
_IN_CHUNK = 500

#: The outcomes' values (an enum member's ``.value`` is a property call: the matrix reads three per key).
_INSTALLED, _MISS, _ERROR = ReportOutcome.INSTALLED.value, ReportOutcome.MISS.value, ReportOutcome.ERROR.value

#: :func:`report_counts` and :func:`wanted_rows` built once, the window's start a parameter.
_SINCE = bindparam("since")
_REPORT_COUNTS = report_counts(_SINCE)
_ATTESTATIONS = attestations(_SINCE)
_WANTED_ROWS = wanted_rows(_SINCE)


def _entries(text: str | None) -> int | None:
    """The summary's ``entries`` (its JSON text) when it is a JSON integer (or boolean, which
    Python counts as one: 1 or 0), else ``None``."""
    if text is None:
        return None
    if _JSON_INT.fullmatch(text):
        return int(text)
    return {"true": 1, "false": 0}.get(text)


def _key(values) -> TuningKey:
    """The key of a row's key columns (in :data:`~tunecache.contract.KEY_FIELDS` order)."""
    return TuningKey.model_validate(dict(zip(KEY_FIELDS, values)))


@dataclass(frozen=True)
class CurrentTunings:
    """What the fleet matrix shows of the current tunings, as read at tuning generation
    ``generation``. Shared between requests: never changed once built.

    * ``keys``: ``key_hash`` -> key, every key with a current tuning;
    * ``runs``: ``key_hash`` -> its current runs, newest first, each the fields of a
      :class:`~tunecache.contract.FleetRun` but ``age_s`` (which depends on the request's time);
    * ``pairs``: ``(key_hash, environment_hash)`` of every current tuning.
    """

    generation: int | None
    keys: dict[str, TuningKey]
    runs: dict[str, tuple[dict[str, Any], ...]]
    pairs: frozenset[tuple[str, str]]


def read_current_tunings(connection: Connection, generation: int | None) -> CurrentTunings:
    """Read the current tunings on ``connection``, labelled ``generation`` (read before them):
    :data:`CURRENT_RUNS` first, then :data:`CURRENT_KEYS` and :data:`CURRENT_ENVIRONMENTS`
    (rows never deleted: every key and environment of the runs read is there; ones that
    became current after that read are left out, as in one joined read)."""
    current_runs = connection.execute(CURRENT_RUNS).all()
    key_ids = {row[0] for row in current_runs}
    keys: dict[str, TuningKey] = {}
    hash_of_key_id: dict[int, str] = {}
    for key_id, *values in connection.execute(CURRENT_KEYS):
        if key_id in key_ids:
            key = _key(values)
            hash_of_key_id[key_id] = key_hash = key.key_hash()
            keys[key_hash] = key
    environments = {environment_id: (env_hash, flashinfer_version)
                    for environment_id, env_hash, flashinfer_version in connection.execute(CURRENT_ENVIRONMENTS)}
    runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    pairs: set[tuple[str, str]] = set()
    for key_id, environment_id, run_id, created_at, entries, trigger, vllm_version, torch_version in current_runs:
        key_hash = hash_of_key_id[key_id]
        env_hash, flashinfer_version = environments[environment_id]
        pairs.add((key_hash, env_hash))
        runs[key_hash].append({"run_id": run_id, "environment_hash": env_hash, "flashinfer_version": flashinfer_version,
                               "created_at": created_at, "entries": _entries(entries), "trigger": trigger,
                               "vllm_version": vllm_version, "torch_version": torch_version})
    return CurrentTunings(
        generation=generation, keys=keys,
        runs={h: tuple(sorted(r, key=lambda run: run["created_at"], reverse=True)) for h, r in runs.items()},
        pairs=frozenset(pairs))


#: The latest :class:`CurrentTunings` read per engine (see :func:`current_tunings`).
_current_by_engine: weakref.WeakKeyDictionary[Engine, CurrentTunings] = weakref.WeakKeyDictionary()
_current_lock = threading.Lock()


def current_tunings(session: Session) -> CurrentTunings:
    """The current tunings, read from the database once per tuning generation (per engine).

    Exact, not a time-limited cache: every change of ``current_tunings`` moves the
    generation in the same transaction (:func:`tunecache.service.publishing.record_run`),
    runs, keys and environments never change once recorded, and the generation is read
    first: a value read at generation ``g`` is one the tables held at ``g`` or later. Without
    a generation row nothing is kept.
    """
    connection = session.connection()
    generation = connection.scalar(repository.GENERATION)  # None without its row: nothing is kept
    engine = connection.engine
    with _current_lock:
        kept = _current_by_engine.get(engine)
    if kept is not None and generation is not None and kept.generation == generation:
        return kept
    current = read_current_tunings(connection, generation)
    if generation is not None:
        with _current_lock:
            _current_by_engine[engine] = current
    return current


def _holds(needle: str, model: str, gpu_name: str) -> bool:
    """Whether ``model`` or ``gpu_name`` holds ``needle`` (lower case; empty: always)."""
    return not needle or needle in model.lower() or needle in gpu_name.lower()


#: Where a :data:`_WANTED_ROWS` row holds the key's ``model`` and ``gpu_name``.
_WANTED_MODEL, _WANTED_GPU_NAME = (9 + KEY_FIELDS.index(f) for f in ("model", "gpu_name"))


def fleet_view(session: Session, hours: float, now: dt.datetime | None = None, *,
               limit: int = FLEET_PAGE_DEFAULT, offset: int = 0,
               wanted_limit: int = FLEET_PAGE_DEFAULT, wanted_offset: int = 0, contains: str = "") -> FleetView:
    """One page of the fleet matrix and one page of the wanted list over the last ``hours``
    before ``now`` (see the module): what ``GET /v1/fleet`` answers.

    Keys: every key with a current tuning, and every key pods reported in the window, most
    reports first, then ``model``, ``gpu_name``, ``max_num_batched_tokens``, key hash; each
    with its current runs (newest first, ``age_s`` in seconds before ``now``), its report
    counts in pod boots and ``hit_rate`` = installed / all. Wanted: each key and environment
    with miss reports in the window and no current tuning now, most distinct sources first,
    then most distinct pods, most boots, latest asked, key hash, environment hash; each with
    the latest report's closest run and differences. Both orders are total: the pages of one window neither
    overlap nor leave a row out.

    Every key and group is counted and ordered (the three reads of the module, then a sort
    in Python), but only the page's rows are built and validated: the cost grows with the
    page, not with the fleet.

    Args:
        session: the caller's session (not committed; reads only).
        hours: the window, hours (> 0; the route checks the range).
        now: the end of the window and the clock of ``age_s`` (timezone-aware); default now.
        limit, offset: at most ``limit`` (>= 1) keys, from position ``offset`` (>= 0, 0-based)
            of the order; past the end, none.
        wanted_limit, wanted_offset: the same for the wanted list.
        contains: keep only keys, and wanted tunings, whose ``model`` or ``gpu_name``
            holds it, ignoring case (blank: all); ``total_keys`` and ``total_wanted`` count
            those kept.

    Returns:
        :class:`~tunecache.contract.FleetView` with ``total_keys`` and ``total_wanted`` (rows
        in all) and the page asked for (``limit``, ``offset``, ``wanted_limit``,
        ``wanted_offset`` as given).

    Raises:
        ValueError: ``limit`` or ``wanted_limit`` under 1, or a negative offset.
    """
    if limit < 1 or wanted_limit < 1:
        raise ValueError(f"limit and wanted_limit must be at least 1, not {limit} and {wanted_limit}")
    if offset < 0 or wanted_offset < 0:
        raise ValueError(f"offset and wanted_offset must be at least 0, not {offset} and {wanted_offset}")
    now = now or utcnow()
    since = now - dt.timedelta(hours=hours)
    if session.autoflush:  # as session.execute would: rows added to the session count
        session.flush()
    current = current_tunings(session)
    connection = session.connection()
    keys = dict(current.keys)

    counts: dict[str, dict[str, int]] = defaultdict(dict)
    last_report: dict[str, dt.datetime] = {}
    for key_hash, outcome, count, latest in connection.execute(_REPORT_COUNTS, {"since": since}):
        counts[key_hash][outcome] = count
        last_report[key_hash] = max(latest, last_report.get(key_hash, latest))
    attested = {key_hash: (n, int(floor or 0)) for key_hash, n, floor in connection.execute(_ATTESTATIONS, {"since": since})}

    # Wanted: groups whose key and environment have no current tuning. Their rows also name
    # the reported keys without a current tuning; any others are read by key hash.
    needle = contains.strip().lower()
    groups = []
    for row in connection.execute(_WANTED_ROWS, {"since": since}):
        key_hash = row[0]
        if key_hash not in keys and key_hash in counts:
            keys[key_hash] = _key(row[9:])
        if (key_hash, row[1]) not in current.pairs and _holds(needle, row[_WANTED_MODEL], row[_WANTED_GPU_NAME]):
            groups.append(row)
    unnamed = [h for h in counts if h not in keys]
    for start in range(0, len(unnamed), _IN_CHUNK):
        for key_hash, *values in connection.execute(report_keys(since, unnamed[start:start + _IN_CHUNK])):
            keys[key_hash] = _key(values)

    order = []
    for key_hash, key in keys.items():
        if _holds(needle, key.model, key.gpu_name):
            by_outcome = counts.get(key_hash, {})
            order.append((-sum(by_outcome.values()), key.model, key.gpu_name, key.max_num_batched_tokens, key_hash))
    order.sort()
    page = [entry[-1] for entry in order[offset:offset + limit]]
    compiled: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for start in range(0, len(page), _IN_CHUNK):
        for key_hash, counted in connection.execute(still_compiling(since, page[start:start + _IN_CHUNK])):
            for kind, count in (json.loads(counted) if isinstance(counted, str) else counted or {}).items():
                compiled[key_hash][kind] += int(count)
    refused = auto_tune_refusals.refusals_since(connection, since)
    variants = _fleet_variants(connection, since, refused)
    missing = fleet_images.missing_kinds(connection, since, page)
    matrix = []
    for minus_total, _model, _gpu_name, _tokens, key_hash in order[offset:offset + limit]:
        by_outcome = counts.get(key_hash, {})
        total = -minus_total
        installed = by_outcome.get(_INSTALLED, 0)
        matrix.append({
            "key": keys[key_hash],
            "current": [{**run, "age_s": max(0.0, (now - run["created_at"]).total_seconds())}
                        for run in current.runs.get(key_hash, ())],
            "reports": total, "installed": installed, "missed": by_outcome.get(_MISS, 0),
            "errors": by_outcome.get(_ERROR, 0), "hit_rate": installed / total if total else None,
            "last_report_at": last_report.get(key_hash),
            "attested": attested.get(key_hash, (0, 0))[0], "at_floor": attested.get(key_hash, (0, 0))[1],
            "still_compiled": dict(compiled.get(key_hash, {})), "variants": variants.get(key_hash, []),
            **missing.get(key_hash, {})})

    groups.sort(key=lambda g: (-g[8], -g[2], -g[3], -g[4].timestamp(), g[0], g[1]))
    wanted = []
    for (key_hash, env_hash, pods, count, last, environment, closest_run_id, found, sources,
         *values) in groups[wanted_offset:wanted_offset + wanted_limit]:
        environment = json.loads(environment) if environment is not None else None
        found = json.loads(found) if found is not None else None
        wanted.append({
            "key": keys.get(key_hash) or _key(values), "environment_hash": env_hash,
            "environment": environment or None, "sources": sources, "pods": pods, "reports": count,
            "last_asked_at": last,
            "closest_run_id": closest_run_id, "differences": found or []})
    wanted_variants = sorted(
        ({**v, "key": keys[key_hash]} for key_hash, found in variants.items()
         if key_hash in keys and _holds(needle, keys[key_hash].model, keys[key_hash].gpu_name)
         for v in found if v["missing"] and v["current_run_id"] is None),
        key=lambda v: (-v["missing"], -v["boots"], -v["last_report_at"].timestamp(), v["variant"]))[:wanted_limit]
    # one validation of the page (pydantic's core): the same checks as building each
    # FleetKey, FleetRun and WantedTuning on its own, without a Python call per object
    return FleetView.model_validate({
        "hours": hours, "since": since, "generated_at": now,
        "total_keys": len(order), "limit": limit, "offset": offset, "keys": matrix,
        "total_wanted": len(groups), "wanted_limit": wanted_limit, "wanted_offset": wanted_offset, "wanted": wanted,
        "wanted_variants": wanted_variants,
        "auto_tune_refused": auto_tune_refusals.totals(refused)})
