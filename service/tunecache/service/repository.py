"""Storage of tunings: the only module (with :mod:`~tunecache.service.blobs` for bytes,
:mod:`~tunecache.service.jobs` for the queue and :mod:`~tunecache.service.reports` for pod
reports) that touches ORM rows.

Every function takes a :class:`~sqlalchemy.orm.Session` whose transaction the caller
owns: the request's transaction (``tunecache.service.deps.SessionDep``) or one call of
:class:`tunecache.service.store.SqlTuningStore`. None commits or rolls back on its own.
Results are the contract's read models (:mod:`tunecache.contract`), never rows.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from sqlalchemy import Connection, Select, func, select, tuple_, update
from sqlalchemy.orm import Session

from tunecache.contract import (
    ArtifactKind,
    ENVIRONMENT_FIELDS,
    KEY_FIELDS,
    MAX_AUTOTUNE_FILE_BYTES,
    ArtifactRead,
    ClosestTuning,
    EnvironmentMetadata,
    LookupMiss,
    RunSignature,
    RunStatus,
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
from tunecache.formats.autotune_file import NotAnAutotuneFile, check_loadable
from tunecache.service import artifact_store, dialect
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
from tunecache.store import ArtifactsMissing

#: How many stored tunings a lookup miss reports.
CLOSEST_LIMIT = 3
#: How many current tunings a lookup miss compares against at most.
_CANDIDATE_LIMIT = 500


class IndeterminateEnvironment(ValueError):
    """A run's environment has fields FlashInfer could not detect; it could never be loaded."""


class NotAFlashInferFile(ValueError):
    """A run's ``flashinfer_autotune_v1`` artifact is not a FlashInfer autotune file (pods
    would install it where FlashInfer reads it)."""


def _key_filter(key: TuningKey):
    return [getattr(TuningKeyRow, f) == v for f, v in key.model_dump().items()]


def _environment_of(row: Environment) -> EnvironmentMetadata:
    return EnvironmentMetadata(**{f: getattr(row, f) for f in ENVIRONMENT_FIELDS})


def key_of(row: TuningKeyRow) -> TuningKey:
    """The contract's key of a ``tuning_keys`` row."""
    return TuningKey.model_validate(row)


def _get_or_create_environment(session: Session, environment: EnvironmentMetadata) -> Environment:
    env_hash = environment.environment_hash()
    dialect.insert_or_ignore(
        session,
        Environment.__table__,
        {"env_hash": env_hash, "created_at": utcnow(), **environment.model_dump()},
        conflict=["env_hash"],
    )
    return session.scalars(select(Environment).where(Environment.env_hash == env_hash)).one()


def get_or_create_key(session: Session, key: TuningKey) -> TuningKeyRow:
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


def record_run(session: Session, run: TuningRunCreate, *, trusted: bool = True,
               recorded_by: str | None = None, trusted_keys: Mapping[str, Any] | None = None,
               force: bool = False) -> TuningRunRead:
    """Record a finished run; a succeeded, verified run becomes current for its key and environment
    (a run tuned for an engine variant of its own, :func:`is_variant_tuning`, for that variant:
    the key's current run moves to it only when the key has none).

    Earlier runs are kept (history, up to ``TUNECACHE_RUN_RETENTION``:
    :mod:`tunecache.service.retention`); only the ``current_tunings`` pointer moves, in the
    same transaction, and only forward (to a higher run id), so concurrent recordings
    leave the newest run current. A failed run never moves it, so the previous tuning
    stays current.

    ``trusted``: whether the recorder may make runs current (a ``tune`` or ``admin``
    token, or a node on the database itself). An untrusted run is stored with trigger
    ``pod``, whatever ``run.trigger`` says; runs with trigger ``pod`` are recorded
    unverified and never become current. ``recorded_by``: the token's name, kept with
    the run. The run's signature is stored as sent (pods check it).

    The promotion policy (:func:`hold_reason`) decides whether a succeeded, verified run
    becomes current: with ``trusted_keys`` (the service's ``TUNECACHE_TRUSTED_KEYS``) only a
    run signed by one of them; never one with fewer entries than the current run of its key
    and environment, nor one the run diff flags a regression in against it. A run held back
    is stored with the reason (``held``). ``force`` (an admin's, audited) skips the policy.

    Raises:
        ArtifactsMissing: an artifact's sha256 has no uploaded bytes.
        NotAFlashInferFile: a ``flashinfer_autotune_v1`` artifact that
            :func:`tunecache.formats.autotune_file.check_loadable` refuses (not JSON,
            no ``_metadata``, ...).
        IndeterminateEnvironment: a succeeded run whose environment has ``"unknown"``
            fields (FlashInfer's ``load_configs`` would reject its file everywhere).
    """
    unknown = run.environment.indeterminate_fields()
    if run.status is RunStatus.SUCCEEDED and unknown:
        raise IndeterminateEnvironment(
            "environment fields FlashInfer could not detect: "
            + ", ".join(unknown)
            + " (a tuning recorded so could never be loaded by AutoTuner.load_configs)"
        )
    shas = sorted({a.sha256 for a in run.artifacts})
    # The blobs are held from here to the commit, against the collector
    # (tunecache.service.retention.collect_blobs) deleting one that no run referred to: on
    # SQLite the key's upsert below, moved before this read, takes the database's write
    # lock; on PostgreSQL the read takes a share lock on each blob's row. A collector that
    # deleted a blob first makes the run ArtifactsMissing (422 naming it: upload it again).
    key_row = get_or_create_key(session, run.key)
    sizes: dict[str, int] = dict(
        session.execute(
            select(ArtifactBlob.sha256, ArtifactBlob.size_bytes).where(ArtifactBlob.sha256.in_(shas))
            .order_by(ArtifactBlob.sha256).with_for_update(read=True, key_share=True)
        ).all()
    )
    if missing := [s for s in shas if s not in sizes]:
        raise ArtifactsMissing(missing)
    autotune_file = b""
    for artifact in run.artifacts:
        if artifact.kind is ArtifactKind.FLASHINFER_AUTOTUNE:
            if sizes[artifact.sha256] > MAX_AUTOTUNE_FILE_BYTES:  # read whole and parsed below: bounded
                raise NotAFlashInferFile(f"artifact {artifact.name!r} is {sizes[artifact.sha256]:,} bytes; a FlashInfer "
                                         f"autotune file is at most {MAX_AUTOTUNE_FILE_BYTES:,} bytes here")
            autotune_file = artifact_store.read_blob(session, artifact.sha256) or b""
            try:
                check_loadable(autotune_file, f"artifact {artifact.name!r}")
            except NotAnAutotuneFile as exc:
                raise NotAFlashInferFile(f"{exc} (a {ArtifactKind.FLASHINFER_AUTOTUNE} artifact must be one)") from None

    env_row = _get_or_create_environment(session, run.environment)
    duration = (
        (run.finished_at - run.started_at).total_seconds()
        if run.started_at is not None and run.finished_at is not None
        else None
    )
    trigger = run.trigger if trusted else RunTrigger.POD
    verified = trigger is not RunTrigger.POD
    signed_by, unsigned_why = _server_verification(run, trusted_keys)
    held = None
    if run.status is RunStatus.SUCCEEDED and verified and not force:
        held = hold_reason(session, run, autotune_file, key_row, env_row, trusted_keys, unsigned_why)
    elif run.status is RunStatus.SUCCEEDED and not verified:
        held = POD_RUN_HELD
    row = TuningRun(
        key=key_row,
        environment=env_row,
        status=run.status.value,
        trigger=trigger.value,
        node=run.node,
        started_at=run.started_at,
        finished_at=run.finished_at,
        duration_s=duration,
        error=run.error,
        summary=run.summary,
        verified=verified,
        created_at=utcnow(),
        signing_key_id=run.signature.key_id if run.signature else None,
        signature=run.signature.signature if run.signature else None,
        signature_manifest=run.signature.manifest if run.signature else None,
        signature_signed_at=run.signature.signed_at if run.signature else None,
        signature_expires_at=run.signature.expires_at if run.signature else None,
        recorded_by=recorded_by,
        held=held,
        signature_verified=(signed_by is not None) if trusted_keys and run.signature else None,
        variant=run.variant,
        artifacts=[
            RunArtifact(kind=a.kind.value, name=a.name, media_type=a.media_type, sha256=a.sha256, size_bytes=sizes[a.sha256])
            for a in run.artifacts
        ],
    )
    session.add(row)
    session.flush()
    if run.status is RunStatus.SUCCEEDED and verified and held is None:
        # Lookup caches of every process drop their answers when this commits.
        session.execute(update(TuningGeneration).where(TuningGeneration.id == 1).values(value=TuningGeneration.value + 1))
        # A variant's run (tuned with engine arguments of its own) is current for its variant;
        # the key's current run stays the one tuned with the node's own engine arguments, unless
        # the key has none yet.
        if not is_variant_tuning(run) or current_run_of(session, key_row.id, env_row.id) is None:
            # The newest run (highest id) stays current when several are recorded at once.
            dialect.upsert_if_newer(
                session,
                CurrentTuning.__table__,
                {"key_id": key_row.id, "environment_id": env_row.id, "run_id": row.id, "updated_at": utcnow()},
                conflict=["key_id", "environment_id"],
                newer="run_id",
                keep_old={"previous_run_id": "run_id"},
            )
        _make_current_variant(session, row, newer="run_id")
    return _to_read(row, is_current=bool(_current_run_ids(session, [row.id])))


def is_variant_tuning(run: TuningRunCreate | TuningRunRead) -> bool:
    """Whether ``run`` was tuned for an engine variant of its own (``tune --engine-args``, a
    variant job: ``summary.engine_args``), not with the node's own engine arguments."""
    return bool(run.variant and isinstance(run.summary.get("engine_args"), dict) and run.summary["engine_args"])


def _make_current_variant(session: Session, row: TuningRun, newer: str | None) -> None:
    """Point the current run of ``row``'s engine variant at it (a run without a variant has
    none); ``newer``: as :func:`tunecache.service.dialect.upsert_if_newer`."""
    if row.variant is None:
        return
    dialect.upsert_if_newer(
        session, CurrentVariant.__table__,
        {"key_id": row.key_id, "environment_id": row.environment_id, "variant": row.variant, "run_id": row.id,
         "updated_at": utcnow()},
        conflict=["key_id", "environment_id", "variant"], newer=newer, keep_old={"previous_run_id": "run_id"})


#: Why a run recorded with a ``push`` token (a pod's) is not current: it never becomes current.
POD_RUN_HELD = ("recorded with a push token, so it is stored as a pod's run: unverified, and never current "
                "(a run recorded with a tune or admin token can become current)")


def _server_verification(run: TuningRunCreate, trusted_keys: Mapping[str, Any] | None) -> tuple[str | None, str | None]:
    """``(signing key id, None)`` when the run's signature checks against ``trusted_keys``
    (:func:`tunecache.signing.verify_run`, over the run's own key and environment), else
    ``(None, why not)``; ``(None, None)`` without trusted keys."""
    if not trusted_keys:
        return None, None
    from tunecache.signing import UntrustedRun, verify_run

    try:
        return verify_run(run.signature, run.key, run.environment, run.artifacts, trusted_keys, run.summary), None
    except UntrustedRun as exc:
        return None, str(exc)


def current_run_of(session: Session, key_id: int, environment_id: int) -> TuningRun | None:
    """The current run of a key in an environment, or ``None``."""
    run_id = session.scalar(select(CurrentTuning.run_id).where(CurrentTuning.key_id == key_id,
                                                              CurrentTuning.environment_id == environment_id))
    return session.get(TuningRun, run_id) if run_id is not None else None


def hold_reason(session: Session, run: TuningRunCreate, autotune_file: bytes, key_row: TuningKeyRow, env_row: Environment,
                trusted_keys: Mapping[str, Any] | None, unsigned_why: str | None) -> str | None:
    """Why the promotion policy keeps a succeeded, verified run from becoming current, in one
    line; ``None``: it becomes current. In order: with trusted keys, a run not signed by one
    of them (``unsigned_why``); a run with fewer FlashInfer entries than the current run of
    its key and environment; a run the run diff (:func:`tunecache.service.run_diff.diff_runs`,
    current as ``a``) flags a regression in."""
    if trusted_keys and unsigned_why is not None:
        return f"not signed by a key this service trusts (TUNECACHE_TRUSTED_KEYS): {unsigned_why}"
    current = current_run_of(session, key_row.id, env_row.id)
    if current is None:
        return None
    current_read = _to_read(current, is_current=True)
    artifact = current_read.artifact(ArtifactKind.FLASHINFER_AUTOTUNE)
    current_file = artifact_store.read_blob(session, artifact.sha256) if artifact is not None else None
    if current_file is None:
        return None
    from tunecache.formats.autotune_file import parse_autotune_file
    from tunecache.service.run_diff import diff_runs

    entries, current_entries = parse_autotune_file(autotune_file).entries, parse_autotune_file(current_file).entries
    if entries < current_entries:
        return (f"it has {entries} FlashInfer entries, fewer than the {current_entries} of current run {current.id}: "
                "an emptier run does not replace the current one unless forced")
    new_read = current_read.model_copy(update={"id": 0, "environment": run.environment, "key": run.key})
    try:
        summary = diff_runs(current_read, current_file, new_read, autotune_file).summary
    except NotAnAutotuneFile:  # the current run's file cannot be read: nothing to compare with
        return None
    if summary.regressions:
        return (f"the run diff against current run {current.id} flags {summary.regressions} regression"
                f"{'s' if summary.regressions != 1 else ''} (tunecache diff {current.id} <this run>)")
    return None


def record_verification(session: Session, run_id: int, verification: RunVerification) -> TuningRunRead:
    """Store run ``run_id``'s verification boot (a later one replaces it). The generation
    moves, so that answers cached with the run carry it.

    Raises:
        LookupError: no such run.
        ValueError: the run did not succeed (there is nothing to boot).
    """
    row = session.get(TuningRun, run_id)
    if row is None:
        raise LookupError(f"no tuning run {run_id}")
    if row.status != RunStatus.SUCCEEDED.value:
        raise ValueError(f"run {run_id} {row.status}: only a succeeded run is booted to verify it")
    row.verification = verification.model_dump(mode="json")
    session.execute(update(TuningGeneration).where(TuningGeneration.id == 1).values(value=TuningGeneration.value + 1))
    session.flush()
    return _to_read(row, is_current=bool(_current_run_ids(session, [row.id])))


def promote_run(session: Session, run_id: int, trusted_keys: Mapping[str, Any] | None,
                signature: RunSignature | None = None) -> tuple[TuningRunRead, int | None]:
    """Make run ``run_id`` the current run of its key and environment (a run tuned for an
    engine variant of its own, :func:`is_variant_tuning`: of that variant), whatever its age,
    and clear its ``held``; with ``signature`` (its manifest signed anew), store that signature
    in place of the run's. Returns it and the run that was current before (``None``: none).

    Raises:
        LookupError: no such run.
        ValueError: it failed, is a pod's (unverified), or, with ``trusted_keys``, is not
            signed by one of them (the message says which).
    """
    row = session.get(TuningRun, run_id)
    if row is None:
        raise LookupError(f"no tuning run {run_id}")
    read = _to_read(row, is_current=False)
    if read.status is not RunStatus.SUCCEEDED:
        raise ValueError(f"run {run_id} {read.status}: only a succeeded run can be current")
    if not read.verified:
        raise ValueError(f"run {run_id} is a pod's run (unverified): only a run a tuner or an admin recorded can be current")
    if signature is not None:
        read = read.model_copy(update={"signature": signature})
        row.signing_key_id, row.signature, row.signature_manifest = signature.key_id, signature.signature, signature.manifest
        row.signature_signed_at, row.signature_expires_at = signature.signed_at, signature.expires_at
        row.signature_verified = None
    if trusted_keys:
        from tunecache.signing import UntrustedRun, verify_run

        try:
            verify_run(read.signature, read.key, read.environment, read.artifacts, trusted_keys, read.summary)
        except UntrustedRun as exc:
            raise ValueError(f"run {run_id} is not signed by a key this service trusts: {exc}") from None
        row.signature_verified = True
    previous = current_run_of(session, row.key_id, row.environment_id)
    row.held = None
    session.execute(update(TuningGeneration).where(TuningGeneration.id == 1).values(value=TuningGeneration.value + 1))
    variant_only = is_variant_tuning(read) and previous is not None  # a variant's run: current for its variant
    if variant_only:
        previous = session.get(TuningRun, session.scalar(select(CurrentVariant.run_id).where(
            CurrentVariant.key_id == row.key_id, CurrentVariant.environment_id == row.environment_id,
            CurrentVariant.variant == row.variant)) or -1)
    else:
        dialect.upsert_if_newer(  # any run id: the pointer moves to this run, older or not
            session, CurrentTuning.__table__,
            {"key_id": row.key_id, "environment_id": row.environment_id, "run_id": row.id, "updated_at": utcnow()},
            conflict=["key_id", "environment_id"], newer=None, keep_old={"previous_run_id": "run_id"})
    _make_current_variant(session, row, newer=None)
    session.flush()
    return _to_read(row, is_current=not variant_only), previous.id if previous is not None else None


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
           variant: str | None = None) -> TuningRunRead | LookupMiss:
    """The current tuning for exactly this key and environment, or why there is none; with
    ``variant``, the current run of that engine variant where it has one (else the key's
    current run, whose ``variant`` tells the pod it is another's).

    On a miss, the current tunings of the same model (of any model when that has none)
    are ranked by how many key and environment fields differ, and the closest
    :data:`CLOSEST_LIMIT` are returned with each differing field.
    """
    if variant is not None:
        of_variant = session.scalars(
            select(TuningRun)
            .join(CurrentVariant, CurrentVariant.run_id == TuningRun.id)
            .join(TuningKeyRow, TuningKeyRow.id == CurrentVariant.key_id)
            .join(Environment, Environment.id == CurrentVariant.environment_id)
            .where(*_key_filter(key), Environment.env_hash == environment.environment_hash(),
                   CurrentVariant.variant == variant)
        ).first()
        if of_variant is not None:
            return _to_read(of_variant, is_current=bool(_current_run_ids(session, [of_variant.id])))
    hit = session.scalars(
        select(TuningRun)
        .join(CurrentTuning, CurrentTuning.run_id == TuningRun.id)
        .join(TuningKeyRow, TuningKeyRow.id == CurrentTuning.key_id)
        .join(Environment, Environment.id == CurrentTuning.environment_id)
        .where(*_key_filter(key), Environment.env_hash == environment.environment_hash())
    ).first()
    if hit is not None:
        return _to_read(hit, is_current=True)

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
