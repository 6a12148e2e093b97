"""Retention: what a year of nightly re-tunes leaves behind is deleted, never what a pod
may still install.

Three parts, each safe to run at any time and from several processes at once:

* :func:`prune_runs`: per key and environment, runs past the last ``keep``
  (``TUNECACHE_RUN_RETENTION``, newest first as the history orders them) are deleted with
  their ``run_artifacts`` rows, except the current run, pinned runs (``PUT
  /v1/tunings/{id}/pin``), a run a tuning job points at, and any run recorded within the
  grace (``TUNECACHE_RETENTION_GRACE_SECONDS``). Deleted runs no longer appear in the
  history; nothing refers to a run by a sequence of ids, so the gaps break nothing.
* :func:`collect_blobs`: blobs no run refers to any more, uploaded before the grace, are
  deleted with their chunks; the bytes of those in an object store are deleted from it
  once the rows' deletion committed (:func:`delete_collected_bytes`). A recording that refers to such a blob again holds it until
  it commits (:func:`tunecache.service.publishing.record_run`); each deletion re-checks,
  in its own statement, that no run refers to the blob, and a deletion that collides with
  a recording anyway (a foreign key violation, a lock timeout) is skipped until the next
  pass. A recording that comes after a committed deletion gets 422 naming the blob, which
  its uploader uploads again.
* :meth:`tunecache.service.artifact_files.ArtifactFiles.trim`: the node's artifact mirror loses
  the files of collected blobs, and past ``TUNECACHE_MIRROR_MAX_BYTES`` its least recently
  used files (a file used within the last minute stays: a download may be about to open
  it; one already open is read to its end, POSIX keeps an unlinked file's bytes while it
  is open). A file that is gone is mirrored again from the database on its next download.

:class:`Maintenance` runs :func:`run_pass` in a thread of each server process, at most once
per ``TUNECACHE_RETENTION_INTERVAL_SECONDS`` (never on a request); ``tunecache prune``
runs one pass on demand (``--dry-run``: says what it would delete, and why it keeps the
blobs it keeps: :class:`KeptBlobs`). Every pass logs what it deleted.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import delete, exists, func, select, text
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from tunecache.service import artifact_store
from tunecache.service.artifact_files import ArtifactFiles, Trimmed
from tunecache.service.models import (ArtifactBlob, CurrentImage, CurrentTuning, CurrentVariant, RunArtifact, TuningJob, TuningRun,
                                      utcnow)

log = logging.getLogger("tunecache")

#: Runs or blobs deleted per statement.
BATCH = 500
#: The PostgreSQL advisory lock a pass holds while it deletes: one replica's pass at a time
#: (combined with the schema's name, so that deployments in other schemas of one database do
#: not wait on each other).
ADVISORY_LOCK = 0x7475_6E65_6361_6368 & 0x7FFF_FFFF_FFFF_FFFF


@dataclass(frozen=True)
class RetentionPolicy:
    """What a pass keeps: ``keep`` runs per key and environment (``None``: every run),
    everything recorded or uploaded within ``grace``, at most ``mirror_max_bytes`` of
    mirrored files."""

    keep: int | None = 10
    grace: dt.timedelta = dt.timedelta(hours=1)
    mirror_max_bytes: int = 10 * 1024**3


@dataclass
class Collected:
    """Blobs a collection deleted (or, dry, would delete) and their bytes in all."""

    blobs: list[str] = field(default_factory=list)
    bytes: int = 0
    stored_elsewhere: dict[str, str] = field(default_factory=dict)
    """Of :attr:`blobs`, those whose bytes are in an object store: sha256 -> location
    (deleted from it once the rows' deletion committed: :func:`delete_collected_bytes`)."""


@dataclass
class KeptBlobs:
    """Why a pass keeps the blobs it keeps (counted in a dry run): referenced by a run
    (``pinned``: by a pinned run, else ``referenced``), or by none but uploaded within the
    grace (``in_grace``; the youngest of them deletable from ``youngest_deletable``)."""

    grace: dt.timedelta
    referenced: int = 0
    in_grace: int = 0
    pinned: int = 0
    youngest_deletable: dt.datetime | None = None

    @property
    def total(self) -> int:
        return self.referenced + self.in_grace + self.pinned

    def line(self) -> str:
        """``N blobs kept: M referenced by runs, K unreferenced within the grace of X h (the
        youngest deletable from ...), P referenced by pinned runs``."""
        when = ""
        if self.youngest_deletable is not None:
            moment = self.youngest_deletable
            moment = moment.replace(tzinfo=dt.timezone.utc) if moment.tzinfo is None else moment.astimezone(dt.timezone.utc)
            when = f" (the youngest deletable from {moment:%Y-%m-%d %H:%M:%S} UTC)"
        return (f"{self.total} blobs kept: {self.referenced} referenced by runs, {self.in_grace} unreferenced within "
                f"the grace of {self.grace.total_seconds() / 3600:g} h{when}, {self.pinned} referenced by pinned runs")


def kept_blobs(session: Session, now: dt.datetime, grace: dt.timedelta) -> KeptBlobs:
    """Count the blobs :func:`collect_blobs` keeps at ``now``, by reason (three counting
    queries; nothing is read of the blobs' bytes)."""
    cutoff = now - grace
    by_pinned = exists().where(RunArtifact.sha256 == ArtifactBlob.sha256, RunArtifact.run_id == TuningRun.id,
                               TuningRun.pinned.is_(True))
    by_any = exists().where(RunArtifact.sha256 == ArtifactBlob.sha256)
    kept = KeptBlobs(grace=grace)
    kept.pinned = session.scalar(select(func.count()).select_from(ArtifactBlob).where(by_pinned)) or 0
    kept.referenced = session.scalar(select(func.count()).select_from(ArtifactBlob).where(by_any, ~by_pinned)) or 0
    kept.in_grace, youngest = session.execute(
        select(func.count(), func.max(ArtifactBlob.created_at)).where(~by_any, ArtifactBlob.created_at >= cutoff)).one()
    kept.youngest_deletable = youngest + grace if youngest is not None else None
    return kept


@dataclass
class PassReport:
    """What one pass deleted (or, dry, would delete)."""

    runs: list[int] = field(default_factory=list)
    blobs: Collected = field(default_factory=Collected)
    mirror: Trimmed = field(default_factory=Trimmed)
    skipped: str | None = None
    """Why the database part did not run (another replica's pass held the lock)."""
    kept: KeptBlobs | None = None
    """A dry run's count of the blobs it keeps, by reason."""

    def line(self) -> str:
        """The pass in one line, for the log and ``tunecache prune``."""
        return (f"{len(self.runs)} runs, {len(self.blobs.blobs)} blobs ({self.blobs.bytes:,} bytes), "
                f"{self.mirror.files} mirrored files ({self.mirror.bytes:,} bytes)"
                + (f"; database part skipped: {self.skipped}" if self.skipped else ""))

    def details(self) -> list[str]:
        """The lines under :meth:`line` for ``tunecache prune``: the runs' ids (the first 50)
        and, when blobs are kept, why (:class:`KeptBlobs`)."""
        lines = []
        if self.runs:
            more = f" and {len(self.runs) - 50} more" if len(self.runs) > 50 else ""
            lines.append(f"runs: {', '.join(str(run_id) for run_id in self.runs[:50])}{more}")
        if self.kept is not None and self.kept.total:
            lines.append(self.kept.line())
        return lines


def _runs_past_retention(keep: int, cutoff: dt.datetime, now: dt.datetime | None = None):
    """``SELECT id`` of the runs that :func:`prune_runs` deletes."""
    ranked = select(
        TuningRun.id,
        func.row_number().over(partition_by=(TuningRun.key_id, TuningRun.environment_id),
                               order_by=(TuningRun.created_at.desc(), TuningRun.id.desc())).label("rank"),
    ).subquery()
    return select(TuningRun.id).where(TuningRun.id.in_(select(ranked.c.id).where(ranked.c.rank > keep)),
                                      *_deletable(cutoff, now))


#: The run that was current until the pointer moved (``previous_run_id``) is kept this long
#: after it moved: a pod that looked it up just before may still be downloading it (its install
#: deadline is 30 s by default, a lookup answered from memory up to a minute old), whatever the
#: grace. (With a grace of 0, a pass deleted the run a pod had just looked up, and the pod's
#: download got 404 mid-boot.)
RECENTLY_REPLACED = dt.timedelta(minutes=10)


def _deletable(cutoff: dt.datetime, now: dt.datetime | None = None) -> list:
    """Conditions on a run that retention may delete (checked again in each DELETE)."""
    replaced_since = (now or utcnow()) - RECENTLY_REPLACED
    return [
        TuningRun.pinned.is_(False),
        TuningRun.created_at < cutoff,
        ~exists().where(CurrentTuning.run_id == TuningRun.id),
        ~exists().where(CurrentVariant.run_id == TuningRun.id),
        ~exists().where(CurrentImage.run_id == TuningRun.id),
        ~exists().where(TuningJob.run_id == TuningRun.id),
        ~exists().where(CurrentTuning.previous_run_id == TuningRun.id, CurrentTuning.updated_at >= replaced_since),
        ~exists().where(CurrentVariant.previous_run_id == TuningRun.id, CurrentVariant.updated_at >= replaced_since),
        ~exists().where(CurrentImage.previous_run_id == TuningRun.id, CurrentImage.updated_at >= replaced_since),
    ]


def prune_runs(session: Session, keep: int | None, now: dt.datetime | None = None,
               grace: dt.timedelta = RetentionPolicy.grace, dry_run: bool = False) -> list[int]:
    """Delete, per key and environment, the runs past the newest ``keep`` (``None``: none),
    except current (of the key, of an engine variant or of an image), pinned and job runs, those recorded within ``grace`` of ``now``,
    and a run that stopped being current within :data:`RECENTLY_REPLACED`;
    their ``run_artifacts`` rows go with them (``ON DELETE CASCADE``). Returns the ids
    deleted (``dry_run``: those it would delete, deleting nothing). The caller commits.

    A batch whose deletion collides with a concurrent write (a promotion of one of its
    runs, a lock held past ``lock_timeout``) is left for the next pass.
    """
    if keep is None:
        return []
    now = now or utcnow()
    cutoff = now - grace
    candidates = list(session.scalars(_runs_past_retention(keep, cutoff, now).order_by(TuningRun.id)))
    if dry_run:
        return candidates
    deleted: list[int] = []
    for start in range(0, len(candidates), BATCH):
        batch = candidates[start:start + BATCH]
        try:
            with session.begin_nested():  # the session forgets the deleted runs (synchronize_session)
                deleted += session.scalars(
                    delete(TuningRun).where(TuningRun.id.in_(batch), *_deletable(cutoff, now)).returning(TuningRun.id),
                    execution_options={"synchronize_session": "fetch"}).all()
        except (IntegrityError, OperationalError) as exc:
            log.warning("retention: %d runs left for the next pass: %s", len(batch), str(exc).splitlines()[0])
    return sorted(deleted)


def _unreferenced(cutoff: dt.datetime) -> list:
    return [ArtifactBlob.created_at < cutoff, ~exists().where(RunArtifact.sha256 == ArtifactBlob.sha256)]


def collect_blobs(session: Session, now: dt.datetime | None = None, grace: dt.timedelta = RetentionPolicy.grace,
                  dry_run: bool = False) -> Collected:
    """Delete the blobs no run refers to that were uploaded before ``grace`` ago, with
    their chunks (``ON DELETE CASCADE``). Returns them (``dry_run``: those it would delete).
    The caller commits.

    Each DELETE re-checks that no run refers to the blob. On PostgreSQL a recording that
    referred to one after the statement's snapshot makes it fail on the foreign key (or
    wait past ``lock_timeout`` on the recording's share lock): the batch is retried blob by
    blob, and a blob that still collides is left for the next pass.
    """
    cutoff = (now or utcnow()) - grace
    candidates = session.execute(
        select(ArtifactBlob.sha256, ArtifactBlob.size_bytes, ArtifactBlob.location).where(*_unreferenced(cutoff))
        .order_by(ArtifactBlob.sha256)
    ).all()
    if dry_run:
        return Collected([sha for sha, _, _ in candidates], sum(size for _, size, _ in candidates),
                         {sha: where for sha, _, where in candidates if where != "database"})
    collected = Collected()
    for start in range(0, len(candidates), BATCH):
        batch = [sha for sha, _, _ in candidates[start:start + BATCH]]
        try:
            rows = _delete_blobs(session, batch, cutoff)
        except (IntegrityError, OperationalError):
            rows = []
            for sha in batch:
                try:
                    rows += _delete_blobs(session, [sha], cutoff)
                except (IntegrityError, OperationalError) as exc:
                    log.info("retention: blob %s referred to again meanwhile, kept: %s", sha, str(exc).splitlines()[0])
        for sha, size, where in rows:
            collected.blobs.append(sha)
            collected.bytes += size or 0
            if where != "database":
                collected.stored_elsewhere[sha] = where
    return collected


def _delete_blobs(session: Session, shas: list[str], cutoff: dt.datetime) -> list[tuple[str, int, str]]:
    blobs = ArtifactBlob.__table__
    with session.begin_nested():
        return [tuple(row) for row in session.execute(
            blobs.delete().where(blobs.c.sha256.in_(shas), *_unreferenced(cutoff))
            .returning(blobs.c.sha256, blobs.c.size_bytes, blobs.c.location)).all()]


def delete_collected_bytes(sessions: sessionmaker[Session], collected: Collected) -> int:
    """Delete from the object store the bytes of collected blobs (their rows' deletion has
    committed: no run can refer to them, no download find them). A blob uploaded again
    meanwhile (its row is back) keeps its object. A deletion that fails (the store is
    down) is logged and the object left: it is no blob any more, only bytes. Returns the
    objects deleted."""
    deleted = 0
    for sha, where in sorted(collected.stored_elsewhere.items()):
        with sessions.begin() as session:
            if stored_among(session, [sha]):
                continue
            stores = artifact_store.stores_of(session)
        try:
            artifact_store.delete_bytes(stores, None, sha, where)
            deleted += 1
        except (artifact_store.ArtifactStoreUnavailable, artifact_store.StoreNotConfigured) as exc:
            log.warning("retention: bytes of collected blob %s left in the %s store: %s", sha, where, exc)
    return deleted


def stored_among(session: Session, shas: list[str]) -> set[str]:
    """Which of ``shas`` are stored blobs."""
    found: set[str] = set()
    for start in range(0, len(shas), BATCH):
        found |= set(session.scalars(select(ArtifactBlob.sha256).where(ArtifactBlob.sha256.in_(shas[start:start + BATCH]))))
    return found


def _try_pass_lock(session: Session) -> bool:
    """On PostgreSQL, this transaction's hold on :data:`ADVISORY_LOCK` for the session's schema
    (``False``: another replica's pass holds it); elsewhere ``True``. Advisory locks are
    database-wide; the schema's hash (``hashtextextended(current_schema(), 0)``) keeps the
    deployments of one database in other schemas apart."""
    if session.get_bind().dialect.name != "postgresql":
        return True
    return bool(session.scalar(text("SELECT pg_try_advisory_xact_lock(:key # hashtextextended(current_schema(), 0))"),
                               {"key": ADVISORY_LOCK}))


def run_pass(sessions: sessionmaker[Session], files: ArtifactFiles | None, policy: RetentionPolicy,
             now: dt.datetime | None = None, dry_run: bool = False) -> PassReport:
    """One pass: :func:`prune_runs` and :func:`collect_blobs` (each in a transaction of its
    own), then the mirror's :meth:`~tunecache.service.artifact_files.ArtifactFiles.trim` (``files``
    ``None``: no mirror here). ``dry_run`` deletes nothing and reports what would go (the
    blobs of runs it would delete are not counted: they are collected a pass later)."""
    report = PassReport()
    now = now or utcnow()
    with sessions.begin() as session:
        if _try_pass_lock(session):
            report.runs = prune_runs(session, policy.keep, now, policy.grace, dry_run)
        else:
            report.skipped = "another replica's retention pass is running"
    if report.skipped is None:
        with sessions.begin() as session:
            if _try_pass_lock(session):
                report.blobs = collect_blobs(session, now, policy.grace, dry_run)
                if dry_run:
                    report.kept = kept_blobs(session, now, policy.grace)
        if not dry_run and report.blobs.stored_elsewhere:
            delete_collected_bytes(sessions, report.blobs)
    if files is not None:
        if not dry_run:
            for sha in report.blobs.blobs:
                files.remove(sha)

        def still_stored(shas: list[str]) -> set[str]:
            with sessions.begin() as session:
                return stored_among(session, shas)

        report.mirror = files.trim(policy.mirror_max_bytes, stored=still_stored, dry_run=dry_run)
    return report


class Maintenance:
    """The retention pass of one server process, in a daemon thread: the first about a
    minute after start (or ``interval_s``, when shorter), then every ``interval_s``. A
    pass that fails is logged and tried again an interval later.

    ``lock_path``: a file the pass holds an exclusive ``flock`` on, so that the processes
    of one node (which share its mirror) do not pass at the same time; a process that
    finds it held skips its turn.
    """

    def __init__(self, sessions: sessionmaker[Session], files: ArtifactFiles | None, policy: RetentionPolicy,
                 interval_s: float, lock_path: Path | None = None,
                 on_pass: Callable[[PassReport], None] | None = None):
        self.sessions, self.files, self.policy = sessions, files, policy
        self.interval_s = interval_s
        self.lock_path = lock_path
        self.on_pass = on_pass
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: The last pass's report (``None`` before the first).
        self.last: PassReport | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="tunecache-retention", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _loop(self) -> None:
        wait = min(60.0, self.interval_s)
        while not self._stop.wait(wait):
            wait = self.interval_s
            try:
                self.run_once()
            except Exception as exc:  # noqa: BLE001 - the database is down, the disk failed: next interval
                log.warning("retention pass failed: %s: %s", type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")

    def run_once(self) -> PassReport | None:
        """One pass now, unless another process of the node is in one (``None``)."""
        handle = None
        if self.lock_path is not None:
            self.lock_path.parent.mkdir(parents=True, exist_ok=True)
            handle = open(self.lock_path, "a")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                return None
        try:
            report = run_pass(self.sessions, self.files, self.policy)
        finally:
            if handle is not None:
                handle.close()
        self.last = report
        if report.runs or report.blobs.blobs or report.mirror.files or report.skipped:
            log.info("retention pass deleted %s", report.line())
        if self.on_pass is not None:
            self.on_pass(report)
        return report
