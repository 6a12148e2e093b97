"""Storage of tunings: the only module (with :mod:`~tunecache.service.blobs` for bytes,
:mod:`~tunecache.service.jobs` for the queue and :mod:`~tunecache.service.reports` for pod
reports) that touches ORM rows. It reads and writes them and decides nothing: whether a
recorded run becomes current, and which pointers move, is
:mod:`tunecache.service.publishing`'s (the promotion policy), which calls these functions.

Every function takes a :class:`~sqlalchemy.orm.Session` whose transaction the caller
owns: the request's transaction (``tunecache.service.deps.SessionDep``) or one call of
:class:`tunecache.service.store.SqlTuningStore`. None commits or rolls back on its own.
Results are the contract's read models (:mod:`tunecache.contract`), ids or a
:class:`RunPlace`; only :func:`get_or_create_key` and :func:`get_or_create_environment`
return rows (the job queue and :mod:`~tunecache.service.publishing` take their ids).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import NamedTuple

from sqlalchemy import Connection, Select, func, or_, select, tuple_, update
from sqlalchemy.orm import Session

from tunecache.contract import (
    ENVIRONMENT_FIELDS,
    KEY_FIELDS,
    ArtifactRead,
    ClosestTuning,
    EnvironmentMetadata,
    LookupMiss,
    RunSignature,
    RunTrigger,
    RunVerification,
    TuningKey,
    TuningRunCreate,
    TuningRunPage,
    TuningRunQuery,
    TuningRunRead,
    differences,
    encode_run_cursor,
)
from tunecache.service import dialect, images
from tunecache.service.models import (
    ArtifactBlob,
    CurrentTuning,
    CurrentVariant,
    Environment,
    RunArtifact,
    TuningGeneration,
    TuningKeyRow,
    TuningRun,
    utcnow,
)

#: How many stored tunings a lookup miss reports.
CLOSEST_LIMIT = 3
#: How many current tunings a lookup miss compares against at most.
_CANDIDATE_LIMIT = 500


def _key_filter(key: TuningKey):
    return [getattr(TuningKeyRow, f) == v for f, v in key.model_dump().items()]


def _environment_of(row: Environment) -> EnvironmentMetadata:
    return EnvironmentMetadata(**{f: getattr(row, f) for f in ENVIRONMENT_FIELDS})


def key_of(row: TuningKeyRow) -> TuningKey:
    """The contract's key of a ``tuning_keys`` row."""
    return TuningKey.model_validate(row)


def get_or_create_environment(session: Session, environment: EnvironmentMetadata) -> Environment:
    """The ``environments`` row of ``environment``, inserted when there is none."""
    env_hash = environment.environment_hash()
    dialect.insert_or_ignore(
        session,
        Environment.__table__,
        {"env_hash": env_hash, "created_at": utcnow(), **environment.model_dump()},
        conflict=["env_hash"],
    )
    return session.scalars(select(Environment).where(Environment.env_hash == env_hash)).one()


def get_or_create_key(session: Session, key: TuningKey) -> TuningKeyRow:
    """The ``tuning_keys`` row of ``key``, inserted when there is none (on SQLite the insert
    takes the database's write lock, held to the commit)."""
    dialect.insert_or_ignore(
        session,
        TuningKeyRow.__table__,
        {"created_at": utcnow(), **key.model_dump()},
        conflict=list(KEY_FIELDS),
    )
    return session.scalars(select(TuningKeyRow).where(*_key_filter(key))).one()


def _current_run_ids(session: Session, run_ids: list[int]) -> set[int]:
    if not run_ids:
        return set()
    return set(session.scalars(select(CurrentTuning.run_id).where(CurrentTuning.run_id.in_(run_ids))))


def _to_read(run: TuningRun, is_current: bool) -> TuningRunRead:
    return TuningRunRead(
        id=run.id,
        key=key_of(run.key),
        environment=_environment_of(run.environment),
        environment_hash=run.environment.env_hash,
        status=run.status,
        trigger=run.trigger,
        node=run.node,
        started_at=run.started_at,
        finished_at=run.finished_at,
        duration_s=run.duration_s,
        error=run.error,
        summary=run.summary or {},
        verified=run.verified,
        is_current=is_current,
        created_at=run.created_at,
        signature=(RunSignature(key_id=run.signing_key_id, signature=run.signature, manifest=run.signature_manifest or 1,
                                signed_at=run.signature_signed_at, expires_at=run.signature_expires_at)
                   if run.signature else None),
        recorded_by=run.recorded_by,
        held=run.held,
        signature_verified=run.signature_verified,
        verification=RunVerification.model_validate(run.verification) if run.verification else None,
        pinned=bool(run.pinned),
        variant=run.variant,
        retired_at=run.retired_at,
        artifacts=[
            ArtifactRead(
                kind=a.kind,
                name=a.name,
                media_type=a.media_type,
                sha256=a.sha256,
                size_bytes=a.size_bytes,
                download_path=f"/v1/artifacts/{a.sha256}",
            )
            for a in run.artifacts
        ],
    )


def held_blob_sizes(session: Session, shas: list[str]) -> dict[str, int]:
    """The size of each of the blobs ``shas`` that is stored (a missing one is absent), each
    held to the commit against the collector (:func:`tunecache.service.retention.collect_blobs`)
    deleting it: on PostgreSQL the read takes a share lock on each blob's row; on SQLite the
    caller took the database's write lock before (:func:`get_or_create_key`)."""
    return dict(
        session.execute(
            select(ArtifactBlob.sha256, ArtifactBlob.size_bytes).where(ArtifactBlob.sha256.in_(shas))
            .order_by(ArtifactBlob.sha256).with_for_update(read=True, key_share=True)
        ).all()
    )


class RunPlace(NamedTuple):
    """Where a run can be current: its key's and its environment's rows, its engine variant
    and its image (:func:`tunecache.formats.dependencies.image_of`; ``None``: none)."""

    key_id: int
    environment_id: int
    variant: str | None
    image: str | None = None


def insert_run(session: Session, run: TuningRunCreate, place: RunPlace, sizes: Mapping[str, int], *,
               trigger: RunTrigger, held: str | None, signature_verified: bool | None,
               recorded_by: str | None) -> int:
    """Insert ``run`` (its artifacts sized by ``sizes``) as recorded with ``trigger`` (a run
    with trigger ``pod`` is unverified), ``held`` (why it is not current, or ``None``),
    ``signature_verified`` and ``recorded_by``; its signature as sent. Moves no current
    pointer. Returns its id."""
    duration = (
        (run.finished_at - run.started_at).total_seconds()
        if run.started_at is not None and run.finished_at is not None
        else None
    )
    row = TuningRun(
        key_id=place.key_id,
        environment_id=place.environment_id,
        status=run.status.value,
        trigger=trigger.value,
        node=run.node,
        started_at=run.started_at,
        finished_at=run.finished_at,
        duration_s=duration,
        error=run.error,
        summary=run.summary,
        verified=trigger is not RunTrigger.POD,
        created_at=utcnow(),
        signing_key_id=run.signature.key_id if run.signature else None,
        signature=run.signature.signature if run.signature else None,
        signature_manifest=run.signature.manifest if run.signature else None,
        signature_signed_at=run.signature.signed_at if run.signature else None,
        signature_expires_at=run.signature.expires_at if run.signature else None,
        recorded_by=recorded_by,
        held=held,
        signature_verified=signature_verified,
        variant=run.variant,
        image=place.image,
        artifacts=[
            RunArtifact(kind=a.kind.value, name=a.name, media_type=a.media_type, sha256=a.sha256, size_bytes=sizes[a.sha256])
            for a in run.artifacts
        ],
    )
    session.add(row)
    session.flush()
    return row.id


def place_of(session: Session, run_id: int) -> RunPlace | None:
    """Where run ``run_id`` can be current, or ``None``: no such run."""
    row = session.get(TuningRun, run_id)
    return RunPlace(row.key_id, row.environment_id, row.variant, row.image) if row is not None else None


def move_generation(session: Session) -> None:
    """Move the current-run counter (``tuning_generation``): lookup caches of every process
    drop their answers when the transaction commits."""
    session.execute(update(TuningGeneration).where(TuningGeneration.id == 1).values(value=TuningGeneration.value + 1))


def make_current(session: Session, run_id: int, place: RunPlace, newer: str | None) -> None:
    """Point the current run of ``place``'s key and environment at run ``run_id``, keeping the
    one before as ``previous_run_id``; ``newer``: as
    :func:`tunecache.service.dialect.upsert_if_newer` (``"run_id"``: only to a higher run id,
    so that the newest run stays current when several are recorded at once; ``None``: any)."""
    dialect.upsert_if_newer(
        session,
        CurrentTuning.__table__,
        {"key_id": place.key_id, "environment_id": place.environment_id, "run_id": run_id, "updated_at": utcnow()},
        conflict=["key_id", "environment_id"],
        newer=newer,
        keep_old={"previous_run_id": "run_id"},
    )


def make_current_variant(session: Session, run_id: int, place: RunPlace, newer: str | None) -> None:
    """Point the current run of ``place``'s engine variant at run ``run_id`` (a place without
    a variant has none); ``newer``: as :func:`make_current`."""
    if place.variant is None:
        return
    dialect.upsert_if_newer(
        session, CurrentVariant.__table__,
        {"key_id": place.key_id, "environment_id": place.environment_id, "variant": place.variant, "run_id": run_id,
         "updated_at": utcnow()},
        conflict=["key_id", "environment_id", "variant"], newer=newer, keep_old={"previous_run_id": "run_id"})


def current_run(session: Session, key_id: int, environment_id: int) -> TuningRunRead | None:
    """The current run of a key in an environment, or ``None``."""
    run_id = session.scalar(select(CurrentTuning.run_id).where(CurrentTuning.key_id == key_id,
                                                              CurrentTuning.environment_id == environment_id))
    run = session.get(TuningRun, run_id) if run_id is not None else None
    return _to_read(run, is_current=True) if run is not None else None


def current_variant_run_id(session: Session, place: RunPlace) -> int | None:
    """The id of the current run of ``place``'s engine variant, or ``None``."""
    return session.scalar(select(CurrentVariant.run_id).where(
        CurrentVariant.key_id == place.key_id, CurrentVariant.environment_id == place.environment_id,
        CurrentVariant.variant == place.variant))


def _row(session: Session, run_id: int) -> TuningRun:
    row = session.get(TuningRun, run_id)
    if row is None:
        raise LookupError(f"no tuning run {run_id}")
    return row


def set_held(session: Session, run_id: int, held: str | None) -> None:
    """Set why run ``run_id`` is kept from being current (``None``: it is not)."""
    _row(session, run_id).held = held


def replace_signature(session: Session, run_id: int, signature: RunSignature) -> None:
    """Store ``signature`` in place of run ``run_id``'s; whether it checks against the
    service's trusted keys is not known any more (``signature_verified`` ``None``)."""
    row = _row(session, run_id)
    row.signing_key_id, row.signature, row.signature_manifest = signature.key_id, signature.signature, signature.manifest
    row.signature_signed_at, row.signature_expires_at = signature.signed_at, signature.expires_at
    row.signature_verified = None


def set_signature_verified(session: Session, run_id: int, verified: bool | None) -> None:
    """Store whether run ``run_id``'s signature checks against the service's trusted keys."""
    _row(session, run_id).signature_verified = verified


def set_verification(session: Session, run_id: int, verification: RunVerification) -> None:
    """Store run ``run_id``'s verification boot (replacing an earlier one)."""
    _row(session, run_id).verification = verification.model_dump(mode="json")
    session.flush()


def pin_run(session: Session, run_id: int, pinned: bool) -> TuningRunRead:
    """Pin run ``run_id`` (``pinned``) so that retention never deletes it, or unpin it (it
    is then kept or deleted as any other run: :mod:`tunecache.service.retention`).

    Raises:
        LookupError: no such run.
    """
    row = session.get(TuningRun, run_id)
    if row is None:
        raise LookupError(f"no tuning run {run_id}")
    row.pinned = pinned
    session.flush()
    return _to_read(row, is_current=bool(_current_run_ids(session, [row.id])))


#: The generation's one row (``None`` where the row is missing).
GENERATION = select(TuningGeneration.value).where(TuningGeneration.id == 1)


def generation(session: Session | Connection) -> int:
    """The current generation of the current tunings: it moves (in the same transaction)
    whenever a run becomes current, so an answer computed at generation ``g`` is still
    right while this returns ``g``. Takes a session or a plain (autocommit) connection."""
    return session.scalar(GENERATION) or 0


def get_run(session: Session, run_id: int) -> TuningRunRead | None:
    """One run by id, or ``None``."""
    run = session.get(TuningRun, run_id)
    if run is None:
        return None
    return _to_read(run, is_current=bool(_current_run_ids(session, [run.id])))


#: The history's order: newest first, ``id`` deciding between runs recorded at the same
#: instant (the index ``ix_tuning_runs_created_id``, and ``ix_tuning_runs_key_created``
#: within a key, serve it).
NEWEST_FIRST = (TuningRun.created_at.desc(), TuningRun.id.desc())


def filtered_runs(filters: TuningRunQuery) -> Select:
    """``SELECT`` of the runs matching ``filters``' filters (no order, no page): key fields
    and environment fields pick key and environment ids from their (small) tables, so
    ``tuning_runs`` is read through its ``(key_id, created_at, id)`` or ``(created_at, id)``
    index; ``since``/``until`` bound ``created_at``."""
    query = select(TuningRun)
    given = filters.filters()
    key_fields = {f: v for f, v in given.items() if f in KEY_FIELDS}
    environment_fields = {f: v for f, v in given.items() if f in ENVIRONMENT_FIELDS}
    if key_fields:
        keys = select(TuningKeyRow.id).where(*(getattr(TuningKeyRow, f) == v for f, v in key_fields.items()))
        query = query.where(TuningRun.key_id.in_(keys))
    if environment_fields:
        environments = select(Environment.id).where(*(getattr(Environment, f) == v for f, v in environment_fields.items()))
        query = query.where(TuningRun.environment_id.in_(environments))
    if filters.status is not None:
        query = query.where(TuningRun.status == filters.status.value)
    if filters.trigger is not None:
        query = query.where(TuningRun.trigger == filters.trigger.value)
    if filters.since is not None:
        query = query.where(TuningRun.created_at >= filters.since)
    if filters.until is not None:
        query = query.where(TuningRun.created_at < filters.until)
    if filters.current_only:
        query = query.where(TuningRun.id.in_(select(CurrentTuning.run_id)))
    return query


def history_page_query(filters: TuningRunQuery, after: tuple[dt.datetime, int] | None, limit: int, offset: int = 0) -> Select:
    """``SELECT`` of one page of the history: runs matching ``filters`` that come after the
    run ``after`` (``(created_at, id)``) in :data:`NEWEST_FIRST` order, ``limit`` of them
    from ``offset``."""
    query = filtered_runs(filters)
    if after is not None:
        query = query.where(tuple_(TuningRun.created_at, TuningRun.id) < tuple_(after[0], after[1]))
    return query.order_by(*NEWEST_FIRST).limit(limit).offset(offset)


def runs_page(session: Session, filters: TuningRunQuery, after: tuple[dt.datetime, int] | None, limit: int,
              offset: int = 0) -> tuple[list[TuningRunRead], tuple[dt.datetime, int] | None]:
    """Up to ``limit`` runs of the history after the run ``after`` (see
    :func:`history_page_query`), and the position of the last one when more follow
    (``None`` on the last page)."""
    runs = list(session.scalars(history_page_query(filters, after, limit + 1, offset)).unique())
    more, runs = len(runs) > limit, runs[:limit]
    current = _current_run_ids(session, [r.id for r in runs])
    position = (runs[-1].created_at, runs[-1].id) if more and runs else None
    return [_to_read(r, r.id in current) for r in runs], position


def list_runs(session: Session, filters: TuningRunQuery = TuningRunQuery()) -> TuningRunPage:
    """One page of the tuning history, newest first (:data:`NEWEST_FIRST`), filtered as
    :class:`~tunecache.contract.TuningRunQuery` says; from its ``cursor`` or ``offset``.
    ``total`` counts every run matching the filters; ``next_cursor`` continues after the
    page's last run (``None``: it was the last page)."""
    total = session.scalar(select(func.count()).select_from(filtered_runs(filters).subquery())) or 0
    items, position = runs_page(session, filters, filters.position(), filters.limit, filters.offset)
    return TuningRunPage(items=items, total=total, limit=filters.limit, offset=filters.offset,
                         next_cursor=encode_run_cursor(*position) if position else None)


def lookup(session: Session, key: TuningKey, environment: EnvironmentMetadata,
           variant: str | None = None, image: str | None = None) -> TuningRunRead | LookupMiss:
    """The current tuning for exactly this key and environment, or why there is none; with
    ``variant``, the current run of that engine variant where it has one (else the key's
    current run, whose ``variant`` tells the pod it is another's).

    With ``image`` (the pod's: :func:`tunecache.formats.dependencies.image_of`), a run made
    on another image never takes the place of the pod's own: a variant's current run of
    another image is passed over, and where the key's current run is of another image and
    the pod's image has a current run (``current_images``), the answer is that run. Still
    one query for the key's: the image's pointer is read by primary key in the same
    statement (an outer join), and the run it names by primary key.

    On a miss, the current tunings of the same model (of any model when that has none)
    are ranked by how many key and environment fields differ, and the closest
    :data:`CLOSEST_LIMIT` are returned with each differing field.
    """
    if variant is not None:
        of_variant = (
            select(TuningRun)
            .join(CurrentVariant, CurrentVariant.run_id == TuningRun.id)
            .join(TuningKeyRow, TuningKeyRow.id == CurrentVariant.key_id)
            .join(Environment, Environment.id == CurrentVariant.environment_id)
            .where(*_key_filter(key), Environment.env_hash == environment.environment_hash(),
                   CurrentVariant.variant == variant)
        )
        if image is not None:  # a variant's run made on another image is not this pod's
            of_variant = of_variant.where(or_(TuningRun.image.is_(None), TuningRun.image == image))
        found = session.scalars(of_variant).first()
        if found is not None:
            return _to_read(found, is_current=bool(_current_run_ids(session, [found.id])))
    if image is None:
        hit = session.scalars(
            select(TuningRun)
            .join(CurrentTuning, CurrentTuning.run_id == TuningRun.id)
            .join(TuningKeyRow, TuningKeyRow.id == CurrentTuning.key_id)
            .join(Environment, Environment.id == CurrentTuning.environment_id)
            .where(*_key_filter(key), Environment.env_hash == environment.environment_hash())
        ).first()
        if hit is not None:
            return _to_read(hit, is_current=True)
    else:
        of_image = session.execute(images.image_lookup(key, environment, image)).first()
        if of_image is not None:
            return _to_read(of_image[0], is_current=of_image[0].id == of_image[1])

    def current_runs(*where):
        return list(
            session.scalars(
                select(TuningRun)
                .join(CurrentTuning, CurrentTuning.run_id == TuningRun.id)
                .join(TuningKeyRow, TuningKeyRow.id == CurrentTuning.key_id)
                .where(*where)
                .order_by(TuningRun.id.desc())
                .limit(_CANDIDATE_LIMIT)
            ).unique()
        )

    candidates = current_runs(TuningKeyRow.model == key.model) or current_runs()
    ranked = sorted(
        (
            ClosestTuning(
                run_id=r.id,
                key=key_of(r.key),
                environment_hash=r.environment.env_hash,
                differences=differences(key_of(r.key), _environment_of(r.environment), key, environment),
            )
            for r in candidates
        ),
        key=lambda c: (len(c.differences), -c.run_id),
    )[:CLOSEST_LIMIT]
    if not ranked:
        detail = "no tuning is stored yet"
    else:
        best = ranked[0]
        detail = (
            f"no tuning for model {key.model!r} matches your GPU and environment; "
            f"closest is run {best.run_id}, differing in "
            + "; ".join(str(d) for d in best.differences)
        )
    unknown = environment.indeterminate_fields()
    if unknown:
        detail += f" (your environment has undetected fields: {', '.join(unknown)})"
    return LookupMiss(detail=detail, closest=ranked)
