"""Publishing runs: recording a run, promoting one, storing its verification boot, and the
promotion policy that decides which run pods get.

The routes (``/v1/tunings``), the dashboard and :class:`~tunecache.service.store.SqlTuningStore`
call these functions; they check what is asked, let the policy decide, and have
:mod:`~tunecache.service.repository` read and write the rows. None commits: the caller owns
the transaction, as the repository's functions do.

The promotion policy is an ordered list of rules (:data:`RECORD_POLICY` when a run is
recorded, :data:`PROMOTE_POLICY` when an admin promotes one), in the manner of Prefect's
orchestration policies: each rule sees the :class:`Proposal` (a run proposed as the current
run of its key and environment) and may alter it (its trigger, whether the key's pointer
moves, what is stored of its signature), or decide (a :class:`Verdict`: current, or not
and why), which ends the evaluation. A proposal no rule decided on becomes current.

The rules are pure: what they read of the database (the run current now and its FlashInfer
file: a :class:`PublishingContext`) is loaded before they run (:func:`load_context`) and
travels with the proposal, so a rule is a function of its proposal alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from tunecache.contract import (
    MAX_AUTOTUNE_FILE_BYTES,
    ArtifactKind,
    RunSignature,
    RunStatus,
    RunTrigger,
    RunVerification,
    TuningRunCreate,
    TuningRunRead,
)
from tunecache.formats.autotune_file import NotAnAutotuneFile, check_loadable, parse_autotune_file
from tunecache.formats.dependencies import image_of
from tunecache.service import artifact_store, images, repository
from tunecache.service.repository import RunPlace
from tunecache.service.run_diff import diff_runs
from tunecache.store import ArtifactsMissing


class IndeterminateEnvironment(ValueError):
    """A run's environment has fields FlashInfer could not detect; it could never be loaded."""


class RunNotFound(LookupError):
    """No run has the id asked for (HTTP 404)."""


class PromotionRefused(ValueError):
    """:data:`PROMOTE_POLICY` refused the run (HTTP 409; the message says why)."""


class NotAFlashInferFile(ValueError):
    """A run's ``flashinfer_autotune_v1`` artifact is not a FlashInfer autotune file (pods
    would install it where FlashInfer reads it)."""


#: Why a run recorded with a ``push`` token (a pod's) is not current: it never becomes current.
POD_RUN_HELD = ("recorded with a push token, so it is stored as a pod's run: unverified, and never current "
                "(a run recorded with a tune or admin token can become current)")


def is_variant_tuning(run: TuningRunCreate | TuningRunRead) -> bool:
    """Whether ``run`` was tuned for an engine variant of its own (``tune --engine-args``, a
    variant job: ``summary.engine_args``), not with the node's own engine arguments."""
    return bool(run.variant and isinstance(run.summary.get("engine_args"), dict) and run.summary["engine_args"])


def signature_check(run: TuningRunCreate | TuningRunRead, trusted_keys: Mapping[str, Any]) -> str | None:
    """Why ``run``'s signature does not check against ``trusted_keys``
    (:func:`tunecache.signing.verify_run`, over the run's own key, environment, artifacts and
    summary), or ``None``: it does."""
    from tunecache.signing import UntrustedRun, verify_run

    try:
        verify_run(run.signature, run.key, run.environment, run.artifacts, trusted_keys, run.summary)
    except UntrustedRun as exc:
        return str(exc)
    return None


def untrusted_signature(run: TuningRunCreate, trusted_keys: Mapping[str, Any] | None) -> str | None:
    """Why ``run`` may not be recorded where a trusted signature is required (a run carried
    in from another service: ``POST /v1/tunings?trusted_signature=true``), or ``None``: its
    signature checks against ``trusted_keys`` (:func:`signature_check`)."""
    if not trusted_keys:
        return ("this service has no trusted keys (TUNECACHE_TRUSTED_KEYS) to check the run's signature against: "
                "give it the public key of the tuner node that signed it")
    why = signature_check(run, trusted_keys)
    return f"not signed by a key this service trusts (TUNECACHE_TRUSTED_KEYS): {why}" if why is not None else None


# ----------------------------------------------------------------------- the policy


@dataclass(frozen=True)
class Verdict:
    """A rule's decision: the run becomes ``current``, or not, with ``reason``: when recorded,
    what is stored as its ``held`` (``None``: it is not held, only not current: a failed
    run); when promoted, why it is refused."""

    current: bool
    reason: str | None = None


#: The verdict of a run that becomes current.
CURRENT = Verdict(current=True)


@dataclass(frozen=True)
class PublishingContext:
    """What the rules read of the database, loaded before they run (:func:`load_context`)."""

    #: The current run of the proposal's key and environment now (before it), or ``None``.
    current: TuningRunRead | None = None
    #: The bytes of that run's FlashInfer autotune file, or ``None`` (no current run, it has no
    #: such file stored, or they were not loaded: a promotion's rules read none).
    current_file: bytes | None = None


def load_context(session: Session, place: RunPlace, *, with_file: bool = True) -> PublishingContext:
    """The :class:`PublishingContext` of a run proposed at ``place``: its key and environment's
    current run, and (``with_file``) that run's FlashInfer file."""
    current = repository.current_run(session, place.key_id, place.environment_id)
    artifact = current.artifact(ArtifactKind.FLASHINFER_AUTOTUNE) if current is not None and with_file else None
    return PublishingContext(current, artifact_store.read_blob(session, artifact.sha256) if artifact is not None else None)


@dataclass(eq=False)
class Proposal:
    """A run proposed as the current run of its key and environment, as the rules read it.

    Rules may alter ``trigger``, ``current_of_key``, ``signature_verified`` and ``run`` (a
    new signature); the rest is what was asked, and what the database held
    (``context``)."""

    #: The run: as sent (recorded), or as stored (promoted).
    run: TuningRunCreate | TuningRunRead
    #: Where it can be current.
    place: RunPlace
    #: The service's ``TUNECACHE_TRUSTED_KEYS`` (``None``: unset).
    trusted_keys: Mapping[str, Any] | None
    #: The stored run's id (promoted; ``None``: being recorded).
    run_id: int | None = None
    #: The bytes of the run's FlashInfer autotune file (recorded; ``b""``: none).
    autotune_file: bytes = b""
    #: Whether the recorder may make runs current: a ``tune`` or ``admin`` token, or a node on the database itself.
    trusted_recorder: bool = True
    #: An admin's record with ``force=true`` (audited).
    forced: bool = False
    #: A signature to store in place of the run's (promoted with one).
    new_signature: RunSignature | None = None
    #: The trigger it is stored with (recorded).
    trigger: RunTrigger | None = None
    #: Whether the key's current run moves to it (else only its engine variant's).
    current_of_key: bool = True
    #: What is stored as its ``signature_verified`` (``None``: not checked).
    signature_verified: bool | None = None
    #: Why its signature does not check against the trusted keys (``None``: it does, or none were checked).
    unsigned_why: str | None = None
    #: What the database held when it was proposed.
    context: PublishingContext = field(default_factory=PublishingContext)

    @property
    def current(self) -> TuningRunRead | None:
        """The current run of its key and environment now (before this one), or ``None``."""
        return self.context.current

    @property
    def current_file(self) -> bytes | None:
        """The bytes of the current run's FlashInfer autotune file, or ``None``
        (:attr:`PublishingContext.current_file`)."""
        return self.context.current_file


#: A rule: alters the proposal, and returns a :class:`Verdict` when it decides (else ``None``).
Rule = Callable[[Proposal], Verdict | None]


def push_tokens_record_pods_runs(proposal: Proposal) -> None:
    """A run recorded by a caller that may not make runs current (a ``push`` token: a pod)
    is stored as a pod's run, with trigger ``pod``, whatever its body says; the token decides,
    never the body."""
    proposal.trigger = proposal.run.trigger if proposal.trusted_recorder else RunTrigger.POD


def signatures_checked_against_trusted_keys(proposal: Proposal) -> None:
    """With ``TUNECACHE_TRUSTED_KEYS``, a recorded run's signature is checked against them
    (:func:`signature_check`) and the outcome stored with the run (``signature_verified``;
    ``None`` for an unsigned run, and without trusted keys)."""
    if proposal.trusted_keys:
        proposal.unsigned_why = signature_check(proposal.run, proposal.trusted_keys)
        if proposal.run.signature:
            proposal.signature_verified = proposal.unsigned_why is None


def failed_runs_stay_out(proposal: Proposal) -> Verdict | None:
    """A failed run is stored and never current (the run current before stays so); it is
    not held either: there is nothing to take anyway."""
    return Verdict(current=False) if proposal.run.status is not RunStatus.SUCCEEDED else None


def pods_runs_are_held(proposal: Proposal) -> Verdict | None:
    """A pod's run (trigger ``pod``) is stored unverified and never current: held with
    :data:`POD_RUN_HELD`."""
    return Verdict(current=False, reason=POD_RUN_HELD) if proposal.trigger is RunTrigger.POD else None


def variant_runs_stay_with_their_variant(proposal: Proposal) -> None:
    """A run tuned for an engine variant of its own (:func:`is_variant_tuning`) is the current
    run of its variant; the key's current run stays the one tuned with the node's own engine
    arguments, and moves to the variant's run only while the key has none."""
    if is_variant_tuning(proposal.run) and proposal.current is not None:
        proposal.current_of_key = False


def forced_records_skip_the_checks(proposal: Proposal) -> Verdict | None:
    """An admin's forced record (``force=true``, audited) becomes current without the checks
    after this rule."""
    return CURRENT if proposal.forced else None


def signed_by_a_trusted_key(proposal: Proposal) -> Verdict | None:
    """With ``TUNECACHE_TRUSTED_KEYS``, only a run signed by one of those keys becomes current;
    another is held, saying why its signature does not check."""
    if proposal.trusted_keys and proposal.unsigned_why is not None:
        return Verdict(current=False, reason=f"not signed by a key this service trusts (TUNECACHE_TRUSTED_KEYS): "
                                             f"{proposal.unsigned_why}")
    return None


def not_emptier_than_the_current_run(proposal: Proposal) -> Verdict | None:
    """A run with fewer FlashInfer entries than the current run of its key and environment is
    held: an emptier run does not replace the current one (a run without a current one, or
    whose current run has no FlashInfer file stored, passes)."""
    if proposal.current_file is None:
        return None
    entries = parse_autotune_file(proposal.autotune_file).entries
    current_entries = parse_autotune_file(proposal.current_file).entries
    if entries < current_entries:
        return Verdict(current=False, reason=(
            f"it has {entries} FlashInfer entries, fewer than the {current_entries} of current run "
            f"{proposal.current.id}: an emptier run does not replace the current one unless forced"))
    return None


def no_regression_against_the_current_run(proposal: Proposal) -> Verdict | None:
    """A run in which the run diff (:func:`tunecache.service.run_diff.diff_runs`, the current
    run as ``a``) flags a regression is held (a current run whose file cannot be read leaves
    nothing to compare with: the run passes)."""
    current, current_file = proposal.current, proposal.current_file
    if current is None or current_file is None:
        return None
    proposed = current.model_copy(update={"id": 0, "environment": proposal.run.environment, "key": proposal.run.key})
    try:
        regressions = diff_runs(current, current_file, proposed, proposal.autotune_file).summary.regressions
    except NotAnAutotuneFile:
        return None
    if regressions:
        return Verdict(current=False, reason=(
            f"the run diff against current run {current.id} flags {regressions} regression"
            f"{'s' if regressions != 1 else ''} (tunecache diff {current.id} <this run>)"))
    return None


def only_succeeded_runs_are_promoted(proposal: Proposal) -> Verdict | None:
    """Only a succeeded run can be promoted: a failed run is refused, naming its status."""
    if proposal.run.status is not RunStatus.SUCCEEDED:
        return Verdict(current=False, reason=f"run {proposal.run_id} {proposal.run.status}: "
                                             "only a succeeded run can be current")
    return None


def retired_runs_are_never_promoted(proposal: Proposal) -> Verdict | None:
    """A retired run (:mod:`tunecache.service.retiring`) is out of use for good: refused."""
    if proposal.run.retired_at is not None:
        return Verdict(current=False, reason=f"run {proposal.run_id} was retired: it is never current again")
    return None


def pods_runs_are_never_promoted(proposal: Proposal) -> Verdict | None:
    """A pod's run (unverified) is never promoted: only a run a tuner or an admin recorded."""
    if not proposal.run.verified:
        return Verdict(current=False, reason=f"run {proposal.run_id} is a pod's run (unverified): only a run a tuner "
                                             "or an admin recorded can be current")
    return None


def a_new_signature_replaces_the_old(proposal: Proposal) -> None:
    """A promotion that brings a signature (the run's manifest signed anew) stores it in place
    of the run's, unchecked until the next rule checks it."""
    if proposal.new_signature is not None:
        proposal.run = proposal.run.model_copy(update={"signature": proposal.new_signature})
        proposal.signature_verified = None


def promoted_runs_are_signed_by_a_trusted_key(proposal: Proposal) -> Verdict | None:
    """With ``TUNECACHE_TRUSTED_KEYS``, only a run signed by one of those keys is promoted (its
    signature stored as checked); another is refused, saying why."""
    if not proposal.trusted_keys:
        return None
    why = signature_check(proposal.run, proposal.trusted_keys)
    if why is not None:
        return Verdict(current=False, reason=f"run {proposal.run_id} is not signed by a key this service trusts: {why}")
    proposal.signature_verified = True
    return None


#: The promotion policy of a recorded run, in order (the glossary's "promotion policy": the
#: checks after :func:`forced_records_skip_the_checks`).
RECORD_POLICY: tuple[Rule, ...] = (
    push_tokens_record_pods_runs,
    signatures_checked_against_trusted_keys,
    failed_runs_stay_out,
    pods_runs_are_held,
    variant_runs_stay_with_their_variant,
    forced_records_skip_the_checks,
    signed_by_a_trusted_key,
    not_emptier_than_the_current_run,
    no_regression_against_the_current_run,
)

#: The rules of an admin's promotion, in order: a run is promoted whatever its age, entries
#: or diff (a roll back, or a held run taken anyway).
PROMOTE_POLICY: tuple[Rule, ...] = (
    only_succeeded_runs_are_promoted,
    retired_runs_are_never_promoted,
    pods_runs_are_never_promoted,
    a_new_signature_replaces_the_old,
    promoted_runs_are_signed_by_a_trusted_key,
    variant_runs_stay_with_their_variant,
)


def decide(policy: Sequence[Rule], proposal: Proposal) -> Verdict:
    """Apply ``policy``'s rules to ``proposal`` in order: the first verdict decides;
    without one the run becomes current."""
    for rule in policy:
        verdict = rule(proposal)
        if verdict is not None:
            return verdict
    return CURRENT


# ------------------------------------------------------------------- what callers call


def _autotune_file(session: Session, run: TuningRunCreate, sizes: Mapping[str, int]) -> bytes:
    """The bytes of the run's ``flashinfer_autotune_v1`` artifact (``b""``: it has none),
    checked with :func:`tunecache.formats.autotune_file.check_loadable`.

    Raises:
        NotAFlashInferFile: over :data:`~tunecache.contract.MAX_AUTOTUNE_FILE_BYTES` (refused
            on its stored size, unread), or not a file FlashInfer loads.
    """
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
    return autotune_file


def record_run(session: Session, run: TuningRunCreate, *, trusted: bool = True,
               recorded_by: str | None = None, trusted_keys: Mapping[str, Any] | None = None,
               force: bool = False) -> TuningRunRead:
    """Record a finished run; :data:`RECORD_POLICY` decides whether it becomes the current run
    of its key and environment (or of its engine variant only), or is held (stored, not
    current, with the reason in ``held``).

    Earlier runs are kept (history, up to ``TUNECACHE_RUN_RETENTION``:
    :mod:`tunecache.service.retention`); only the current pointers move, in the same
    transaction, and only forward (to a higher run id), so concurrent recordings leave the
    newest run current. A failed run never moves them, so the previous run stays current.
    Its image's pointer (:mod:`tunecache.service.images`) moves with the key's (a variant run's
    only while its image has none), so the pods of other images keep theirs.

    ``trusted``: whether the recorder may make runs current (a ``tune`` or ``admin`` token, or
    a node on the database itself); ``recorded_by``: the token's name, kept with the run;
    ``trusted_keys``: the service's ``TUNECACHE_TRUSTED_KEYS``; ``force`` (an admin's,
    audited): skip the policy's checks. The run's signature is stored as sent (pods check it).

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
    # The blobs are held from here to the commit, against the collector
    # (tunecache.service.retention.collect_blobs) deleting one that no run referred to: on
    # SQLite the key's upsert, before the read, takes the database's write lock; on
    # PostgreSQL the read takes a share lock on each blob's row. A collector that deleted a
    # blob first makes the run ArtifactsMissing (422 naming it: upload it again).
    key_row = repository.get_or_create_key(session, run.key)
    shas = sorted({a.sha256 for a in run.artifacts})
    sizes = repository.held_blob_sizes(session, shas)
    if missing := [s for s in shas if s not in sizes]:
        raise ArtifactsMissing(missing)
    autotune_file = _autotune_file(session, run, sizes)
    env_row = repository.get_or_create_environment(session, run.environment)
    place = RunPlace(key_row.id, env_row.id, run.variant, image_of(run.summary.get("dependencies")))
    proposal = Proposal(run, place, trusted_keys, autotune_file=autotune_file, trusted_recorder=trusted,
                        forced=force, context=load_context(session, place))
    verdict = decide(RECORD_POLICY, proposal)
    run_id = repository.insert_run(session, run, place, sizes, trigger=proposal.trigger, held=verdict.reason,
                                   signature_verified=proposal.signature_verified, recorded_by=recorded_by)
    if verdict.current:
        repository.move_generation(session)
        if proposal.current_of_key:
            repository.make_current(session, run_id, place, newer="run_id")
        images.make_current_image(session, run_id, place, newer="run_id", unless_set=not proposal.current_of_key)
        repository.make_current_variant(session, run_id, place, newer="run_id")
    return repository.get_run(session, run_id)


def promote_run(session: Session, run_id: int, trusted_keys: Mapping[str, Any] | None,
                signature: RunSignature | None = None) -> tuple[TuningRunRead, int | None]:
    """Make run ``run_id`` the current run of its key and environment (a run tuned for an
    engine variant of its own, :func:`is_variant_tuning`: of that variant), whatever its age,
    as :data:`PROMOTE_POLICY` lets it, and clear its ``held``; with ``signature`` (its manifest
    signed anew), store that signature in place of the run's. Returns it and the run that was
    current before (``None``: none).

    Raises:
        RunNotFound: no such run.
        PromotionRefused: the policy refused it (it failed, is a pod's (unverified), or, with
            ``trusted_keys``, is not signed by one of them): the message says which.
    """
    place = repository.place_of(session, run_id)
    if place is None:
        raise RunNotFound(f"no tuning run {run_id}")
    stored = repository.get_run(session, run_id)
    proposal = Proposal(stored, place, trusted_keys, run_id=run_id, new_signature=signature,
                        signature_verified=stored.signature_verified, context=load_context(session, place, with_file=False))
    verdict = decide(PROMOTE_POLICY, proposal)
    if not verdict.current:
        raise PromotionRefused(verdict.reason)
    if signature is not None:
        repository.replace_signature(session, run_id, signature)
    repository.set_signature_verified(session, run_id, proposal.signature_verified)
    repository.set_held(session, run_id, None)
    repository.move_generation(session)
    if proposal.current_of_key:
        previous = proposal.current.id if proposal.current is not None else None
        repository.make_current(session, run_id, place, newer=None)  # any run id: the pointer moves to this run
    else:
        previous = repository.current_variant_run_id(session, place)
    images.make_current_image(session, run_id, place, newer=None, unless_set=not proposal.current_of_key)
    repository.make_current_variant(session, run_id, place, newer=None)
    session.flush()
    return repository.get_run(session, run_id).model_copy(update={"is_current": proposal.current_of_key}), previous


def record_verification(session: Session, run_id: int, verification: RunVerification) -> TuningRunRead:
    """Store run ``run_id``'s verification boot (a later one replaces it). The current-run
    counter moves, so that answers cached with the run carry it.

    Raises:
        LookupError: no such run.
        ValueError: the run did not succeed (there is nothing to boot).
    """
    run = repository.get_run(session, run_id)
    if run is None:
        raise LookupError(f"no tuning run {run_id}")
    if run.status is not RunStatus.SUCCEEDED:
        raise ValueError(f"run {run_id} {run.status}: only a succeeded run is booted to verify it")
    repository.set_verification(session, run_id, verification)
    repository.move_generation(session)
    return repository.get_run(session, run_id)
