"""Opt-in: a tuning job for an engine variant that the fleet's pods keep asking for.

A pod whose engine variant has no warm state (another ``max_model_len``, compilation setting,
...) installs the key's run without its compile cache, compiles, and reports the variant as
missing with the engine arguments it was booted with (:attr:`tunecache.contract.PodReportCreate.variant_missing`).
With ``TUNECACHE_AUTO_TUNE_VARIANTS=N`` (N > 0) the service queues a vLLM warmup of the key
with those engine arguments (:class:`tunecache.contract.TuningJobCreate`: ``warmup="vllm"``,
``engine_args``, no model config: the GPU node reads it from its ``TUNECACHE_MODEL_CONFIG_DIR``),
as ``tunecache retune --warmup vllm --engine-args`` would, when all of these hold:

* **N distinct tokens** reported the variant missing within ``TUNECACHE_AUTO_TUNE_VARIANT_HOURS``:
  reports sent with a live token of ``TUNECACHE_AUTO_TUNE_TOKEN_SCOPE`` or above
  (``pod_reports.token_name``; a revoked token no longer counts). A report is a claim
  anyone may make (the ``read`` policy), so a report without a token is stored for the
  fleet view and never counts, nor does a client address or a boot id: one token is one
  voice however many pods, boots or addresses send with it;
* **the engine arguments** are those the most of these tokens reported (arguments compared
  as JSON objects, whatever their order); a tie goes to the arguments reported first. The
  last report never chooses them: a token that reports other arguments is one voice more,
  for its own;
* the variant has no current run, and no job of the key with the same arguments was queued
  within the window (a variant whose tuning fails is not queued again and again), and the
  key has no other job queued or running (one job per key);
* **the budget** has room: at most ``TUNECACHE_AUTO_TUNE_JOBS_PER_KEY`` automatic jobs of the
  key and ``TUNECACHE_AUTO_TUNE_JOBS_PER_HOUR`` of the whole service were queued in the last
  hour, and fewer than ``TUNECACHE_AUTO_TUNE_JOBS_QUEUED`` are queued or running now. An
  automatic job is one whose ``requested_by`` begins with :data:`REQUESTED_BY_PREFIX`
  (a token's name cannot: :data:`tunecache.contract.TOKEN_NAME_PATTERN`); they are counted
  in the database, so the bounds are the service's, whatever its processes and replicas
  (on PostgreSQL the check and the insert of each process take turns: ``pg_advisory_xact_lock``).

Every variant looked at and not queued for one of these reasons is counted
(:mod:`tunecache.service.auto_tune_refusals`, reasons
:data:`tunecache.contract.AUTO_TUNE_REFUSALS`); a report without a token only in
``tunecache_auto_tune_refused_total{reason="anonymous"}``. Runs on the report intake's
thread, after a batch is stored, in a transaction of its own; only the variants that a
report of the batch sent with a token names are looked at.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Text, and_, cast, func, select
from sqlalchemy.orm import Session

from tunecache.contract import ACTIVE_JOB_STATUSES, KEY_FIELDS, Scope, TuningJobCreate, TuningKey
from tunecache.service import auto_tune_refusals, dialect, jobs, metrics
from tunecache.service.models import ApiToken, CurrentVariant, PodReport, TuningJob, TuningKeyRow, utcnow

log = logging.getLogger("tunecache")

#: ``tuning_jobs.requested_by`` of an automatic job begins with this.
REQUESTED_BY_PREFIX = "auto: "
#: The lock the budget's check and the job's insert hold on PostgreSQL (``pg_advisory_xact_lock``).
BUDGET_LOCK = 0x7475_6E65_0001  # "tune" 1


@dataclass(frozen=True)
class AutoTunePolicy:
    """When a variant is queued (see the module); from the ``TUNECACHE_AUTO_TUNE_*`` settings."""

    min_tokens: int
    """Distinct tokens that must have reported the variant missing (0: never queue)."""
    hours: float
    """The window of the reports counted, and of a repeat."""
    token_scope: Scope = Scope.READ
    """The least scope of a token whose reports count."""
    jobs_per_key_hour: int = 1
    jobs_per_hour: int = 10
    jobs_queued: int = 2


def _key_condition(key: TuningKey):
    return and_(*(getattr(TuningKeyRow, f) == getattr(key, f) for f in KEY_FIELDS))


def _counted_scopes(least: Scope) -> list[str]:
    return [scope.value for scope in Scope if scope.includes(least)]


def _voices(session: Session, key_hash: str, variant: str, since: dt.datetime,
            scope: Scope) -> list[tuple[str, dict[str, Any], int]]:
    """``(token name, engine arguments, first report id)`` of each distinct token (live, of
    ``scope`` or above) and arguments that reported ``variant`` of the key missing since ``since``."""
    args_text = cast(PodReport.engine_args, Text)
    rows = session.execute(
        select(PodReport.token_name, args_text, func.min(PodReport.id))
        .join(ApiToken, ApiToken.name == PodReport.token_name)
        .where(PodReport.key_hash == key_hash, PodReport.variant == variant, PodReport.token_name.is_not(None),
               PodReport.received_at >= since, PodReport.variant_missing.is_(True), PodReport.engine_args.is_not(None),
               ApiToken.revoked_at.is_(None), ApiToken.scope.in_(_counted_scopes(scope)))
        .group_by(PodReport.token_name, args_text))
    return [(token, json.loads(text), first) for token, text, first in rows if text is not None]


def chosen_arguments(voices: list[tuple[str, dict[str, Any], int]]) -> dict[str, Any] | None:
    """The engine arguments the most distinct tokens reported (compared as JSON objects), a
    tie going to those reported first; ``None`` without voices."""
    tokens: dict[str, set[str]] = {}
    first: dict[str, int] = {}
    args_of: dict[str, dict[str, Any]] = {}
    for token, args, report_id in voices:
        canonical = json.dumps(args, sort_keys=True)
        tokens.setdefault(canonical, set()).add(token)
        first[canonical] = min(report_id, first.get(canonical, report_id))
        args_of[canonical] = args
    if not tokens:
        return None
    best = min(tokens, key=lambda canonical: (-len(tokens[canonical]), first[canonical]))
    return args_of[best]


def _has_current(session: Session, key: TuningKey, variant: str) -> bool:
    return session.scalar(
        select(func.count()).select_from(CurrentVariant).join(TuningKeyRow, TuningKeyRow.id == CurrentVariant.key_id)
        .where(CurrentVariant.variant == variant, _key_condition(key))) > 0


def _queued_lately(session: Session, key: TuningKey, engine_args: dict[str, Any], since: dt.datetime) -> bool:
    """Whether a vLLM warmup job of the key with ``engine_args`` was queued since ``since``."""
    options = session.scalars(
        select(TuningJob.options).join(TuningKeyRow, TuningKeyRow.id == TuningJob.key_id)
        .where(TuningJob.created_at >= since, _key_condition(key)))
    return any((o or {}).get("warmup") == "vllm" and (o or {}).get("engine_args") == engine_args for o in options)


def _automatic_jobs(session: Session, *conditions) -> int:
    return int(session.scalar(select(func.count()).select_from(TuningJob).join(
        TuningKeyRow, TuningKeyRow.id == TuningJob.key_id).where(
        TuningJob.requested_by.startswith(REQUESTED_BY_PREFIX, autoescape=True), *conditions)) or 0)


def budget_refusal(session: Session, key: TuningKey, policy: AutoTunePolicy, now: dt.datetime) -> str | None:
    """Why the budget has no room for an automatic job of ``key`` now (a reason of
    :data:`~tunecache.contract.AUTO_TUNE_REFUSALS`), or ``None``."""
    hour_ago = now - dt.timedelta(hours=1)
    if _automatic_jobs(session, TuningJob.status.in_(ACTIVE_JOB_STATUSES)) >= policy.jobs_queued:
        return "budget_queued"
    if _automatic_jobs(session, TuningJob.created_at >= hour_ago, _key_condition(key)) >= policy.jobs_per_key_hour:
        return "budget_key"
    if _automatic_jobs(session, TuningJob.created_at >= hour_ago) >= policy.jobs_per_hour:
        return "budget_hour"
    return None


def queue_wanted_variants(session: Session, rows: list[dict[str, Any]], policy: AutoTunePolicy,
                          now: dt.datetime | None = None) -> list[int]:
    """For each engine variant that ``rows`` (stored report rows) report missing with a token:
    queue its vLLM warmup when the policy allows (see the module), else count why not.
    Returns the ids of the jobs queued. The caller commits."""
    if policy.min_tokens <= 0:
        return []
    now = now or utcnow()
    since = now - dt.timedelta(hours=policy.hours)
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        if row.get("variant_missing") and row.get("variant") and row.get("engine_args"):
            if row.get("token_name") is None:
                metrics.auto_tune_refused("anonymous")
            else:
                seen.setdefault((row["key_hash"], row["variant"]), row)
    if not seen:
        return []
    dialect.serialize(session, BUDGET_LOCK)
    queued = []
    for (key_hash, variant), row in seen.items():
        key = TuningKey.model_validate({f: row[f] for f in KEY_FIELDS})
        job_id, reason = _queue_one(session, key, key_hash, variant, policy, since, now)
        if reason is not None:
            auto_tune_refusals.record(session, key_hash, variant, reason, now)
        if job_id is not None:
            queued.append(job_id)
    return queued


def _queue_one(session: Session, key: TuningKey, key_hash: str, variant: str, policy: AutoTunePolicy,
               since: dt.datetime, now: dt.datetime) -> tuple[int | None, str | None]:
    """``(job id, None)`` when queued, ``(None, reason)`` when refused, ``(None, None)`` when
    nothing is to do (the variant has a current run, or its job is queued already)."""
    if _has_current(session, key, variant):
        return None, None
    voices = _voices(session, key_hash, variant, since, policy.token_scope)
    if len({token for token, _args, _first in voices}) < policy.min_tokens:
        return None, "tokens"
    args = chosen_arguments(voices)
    if _queued_lately(session, key, args, since):
        return None, "repeat"
    reason = budget_refusal(session, key, policy, now)
    if reason is not None:
        return None, reason
    request = TuningJobCreate(key=key, warmup="vllm", engine_args=args)
    try:
        job, created = jobs.enqueue(session, request, requested_by=f"{REQUESTED_BY_PREFIX}engine variant {variant}")
    except jobs.JobOptionsConflict:  # the key's one job is another: this variant waits for a later batch
        return None, "key_busy"
    if not created:
        return None, None
    log.info("queued job %d: engine variant %s of %s, which %d tokens' pods found no warm state for "
             "(engine arguments %s)", job.id, variant, key.model, len({t for t, _a, _f in voices}), args)
    return job.id, None
