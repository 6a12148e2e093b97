"""Opt-in: a tuning job for an engine variant that pods keep asking for.

A pod whose engine variant has no warm state (another ``max_model_len``, compilation setting,
...) installs the key's run without its compile cache, compiles, and reports the variant as
missing with the engine arguments it was booted with (:attr:`tunecache.contract.PodReportCreate.variant_missing`).
With ``TUNECACHE_AUTO_TUNE_VARIANTS=N`` (N > 0), once N pod boots reported a variant missing
within ``TUNECACHE_AUTO_TUNE_VARIANT_HOURS``, and the variant still has no current run, the
service queues a vLLM warmup of the key with those engine arguments
(:class:`tunecache.contract.TuningJobCreate`: ``warmup="vllm"``, ``engine_args``, no model
config: the GPU node reads it from its ``TUNECACHE_MODEL_CONFIG_DIR``), as ``tunecache retune
--warmup vllm --engine-args`` would. Not when a job for the key is queued or running (one job
per key), nor when one with the same arguments was queued within the window (a variant whose
tuning fails is not queued again and again). Runs on the report intake's thread, after a batch
is stored, in a transaction of its own.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from sqlalchemy import and_, case, func, select
from sqlalchemy.orm import Session

from tunecache.contract import KEY_FIELDS, TuningJobCreate, TuningKey
from tunecache.service import jobs
from tunecache.service.models import CurrentVariant, PodReport, TuningJob, TuningKeyRow, utcnow

log = logging.getLogger("tunecache")


def _missing_boots(session: Session, key_hash: str, variant: str, since: dt.datetime) -> int:
    """Pod boots that reported ``variant`` of the key missing since ``since`` (a report without
    a boot id counts as a boot of its own)."""
    return int(session.scalar(
        select(func.count(PodReport.boot_id.distinct())
               + func.coalesce(func.sum(case((PodReport.boot_id.is_(None), 1), else_=0)), 0))
        .where(PodReport.key_hash == key_hash, PodReport.variant == variant, PodReport.variant_missing.is_(True),
               PodReport.received_at >= since)) or 0)


def _has_current(session: Session, key: TuningKey, variant: str) -> bool:
    return session.scalar(
        select(func.count()).select_from(CurrentVariant).join(TuningKeyRow, TuningKeyRow.id == CurrentVariant.key_id)
        .where(CurrentVariant.variant == variant, *(getattr(TuningKeyRow, f) == getattr(key, f) for f in KEY_FIELDS))) > 0


def _queued_lately(session: Session, key: TuningKey, engine_args: dict[str, Any], since: dt.datetime) -> bool:
    """Whether a vLLM warmup job of the key with ``engine_args`` was queued since ``since``."""
    options = session.scalars(
        select(TuningJob.options).join(TuningKeyRow, TuningKeyRow.id == TuningJob.key_id)
        .where(TuningJob.created_at >= since, and_(*(getattr(TuningKeyRow, f) == getattr(key, f) for f in KEY_FIELDS))))
    return any((o or {}).get("warmup") == "vllm" and (o or {}).get("engine_args") == engine_args for o in options)


def queue_wanted_variants(session: Session, rows: list[dict[str, Any]], min_boots: int, hours: float,
                          now: dt.datetime | None = None) -> list[int]:
    """For each engine variant that ``rows`` (stored report rows) report missing: queue its
    vLLM warmup when ``min_boots`` boots reported it missing in the last ``hours`` (see the
    module). Returns the ids of the jobs queued. The caller commits."""
    if min_boots <= 0:
        return []
    since = (now or utcnow()) - dt.timedelta(hours=hours)
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        if row.get("variant_missing") and row.get("variant") and row.get("engine_args"):
            seen[(row["key_hash"], row["variant"])] = row
    queued = []
    for (key_hash, variant), row in seen.items():
        key = TuningKey.model_validate({f: row[f] for f in KEY_FIELDS})
        args = row["engine_args"]
        if (_missing_boots(session, key_hash, variant, since) < min_boots or _has_current(session, key, variant)
                or _queued_lately(session, key, args, since)):
            continue
        request = TuningJobCreate(key=key, warmup="vllm", engine_args=args)
        try:
            job, created = jobs.enqueue(session, request, requested_by=f"auto: engine variant {variant}")
        except jobs.JobOptionsConflict:  # the key's one job is another: this variant waits for a later batch
            continue
        if created:
            log.info("queued job %d: engine variant %s of %s, which %d+ pod boots found no warm state for "
                     "(engine arguments %s)", job.id, variant, key.model, min_boots, args)
            queued.append(job.id)
    return queued
