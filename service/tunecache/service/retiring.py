"""Retiring a run: an admin takes it out of use (``POST /v1/tunings/{id}/retire``,
``tunecache retire RUN``). A retired run is never current again and never served (no lookup
answers it; :data:`tunecache.service.publishing.PROMOTE_POLICY` refuses to promote it), and
stays in the history with its ``retired_at``.

Where it was current, its place falls back as a rollback does (``promote`` of an earlier
run), without anyone choosing: to the newest *usable* run of the same key and environment
(and engine variant, for a variant's pointer; and image, for an image's pointer:
:mod:`tunecache.service.images`): succeeded, recorded by a tuner or an admin (not
a pod's), not held by the promotion policy, not retired, and, with ``TUNECACHE_TRUSTED_KEYS``,
signed by one of them as last checked. Where there is none, the key has no current run: pods
miss (``pull`` exits 3) until a run is recorded or promoted. The tuning generation moves, so
every process's lookup cache drops what it held of the retired run at once.

Like :mod:`tunecache.service.publishing` this commits nothing: the caller owns the transaction.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from tunecache.contract import RunRetired, RunStatus, RunTrigger
from tunecache.service import repository
from tunecache.service.models import CurrentImage, CurrentTuning, CurrentVariant, TuningRun, utcnow
from tunecache.service.publishing import RunNotFound

#: Candidates read for a fallback: the newest usable runs of the place.
_FALLBACK_CANDIDATES = 50


def _fallback(session: Session, retired: TuningRun, variant: str | None,
              trusted_keys: Mapping[str, Any] | None, image: str | None = None) -> int | None:
    """The newest usable run to take ``retired``'s place (of ``variant`` for a variant's
    pointer, of ``image`` for an image's; for the key's pointer one tuned with the node's own
    engine arguments first, as :func:`tunecache.service.publishing.variant_runs_stay_with_their_variant`
    keeps it), or ``None``."""
    query = select(TuningRun).where(
        TuningRun.key_id == retired.key_id, TuningRun.environment_id == retired.environment_id,
        TuningRun.id != retired.id, TuningRun.status == RunStatus.SUCCEEDED.value, TuningRun.verified.is_(True),
        TuningRun.trigger != RunTrigger.POD.value, TuningRun.held.is_(None), TuningRun.retired_at.is_(None))
    if trusted_keys:
        query = query.where(TuningRun.signature_verified.is_(True))
    if variant is not None:
        query = query.where(TuningRun.variant == variant)
    if image is not None:
        query = query.where(TuningRun.image == image)
    candidates = list(session.scalars(query.order_by(TuningRun.id.desc()).limit(_FALLBACK_CANDIDATES)).unique())
    if variant is None:
        own = [run for run in candidates if not (run.variant and (run.summary or {}).get("engine_args"))]
        candidates = own or candidates
    return candidates[0].id if candidates else None


def retire_run(session: Session, run_id: int, trusted_keys: Mapping[str, Any] | None) -> RunRetired:
    """Retire run ``run_id`` (idempotent: a retired run stays as it is) and move every pointer
    that named it to its fallback (:func:`_fallback`) or remove it. Returns the run and what is
    current for its key and environment now.

    Raises:
        RunNotFound: no such run (HTTP 404).
    """
    row = session.get(TuningRun, run_id)
    if row is None:
        raise RunNotFound(f"no tuning run {run_id}")
    if row.retired_at is None:
        row.retired_at = utcnow()
    pointer = session.scalars(select(CurrentTuning).where(
        CurrentTuning.key_id == row.key_id, CurrentTuning.environment_id == row.environment_id).with_for_update()).first()
    moved = False
    if pointer is not None and pointer.run_id == run_id:
        moved = True
        fallback = _fallback(session, row, None, trusted_keys)
        if fallback is None:
            session.delete(pointer)
        else:
            pointer.run_id, pointer.previous_run_id, pointer.updated_at = fallback, run_id, utcnow()
    for variant_pointer in session.scalars(select(CurrentVariant).where(CurrentVariant.run_id == run_id)
                                           .with_for_update()).all():
        moved = True
        fallback = _fallback(session, row, variant_pointer.variant, trusted_keys)
        if fallback is None:
            session.execute(delete(CurrentVariant).where(
                CurrentVariant.key_id == variant_pointer.key_id,
                CurrentVariant.environment_id == variant_pointer.environment_id,
                CurrentVariant.variant == variant_pointer.variant))
        else:
            variant_pointer.run_id, variant_pointer.previous_run_id = fallback, run_id
            variant_pointer.updated_at = utcnow()
    for image_pointer in session.scalars(select(CurrentImage).where(CurrentImage.run_id == run_id)
                                         .with_for_update()).all():
        moved = True
        fallback = _fallback(session, row, None, trusted_keys, image_pointer.image)
        if fallback is None:
            session.delete(image_pointer)
        else:
            image_pointer.run_id, image_pointer.previous_run_id = fallback, run_id
            image_pointer.updated_at = utcnow()
    if moved:
        repository.move_generation(session)
    session.flush()
    current = repository.current_run(session, row.key_id, row.environment_id)
    return RunRetired(run=repository.get_run(session, run_id), current_run_id=current.id if current else None)
