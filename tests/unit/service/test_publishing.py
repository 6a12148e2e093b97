"""The promotion policy (tunecache.service.publishing): its rules in their order, and each rule
on its own, against the real SQLite and PostgreSQL stores with the real H200 FlashInfer files."""

from __future__ import annotations

import hashlib
import io
import json

import pytest

from tests.support.builders import h200_key, run_payload, signed
from tests.support.paths import CUDNN_FILE
from tunecache.contract import RunTrigger, TuningRunCreate
from tunecache.service import blobs, db, publishing, repository
from tunecache.service.publishing import CURRENT, POD_RUN_HELD, Proposal, Verdict

VARIANT = "0123456789abcdef"


@pytest.fixture
def session(engine):
    with db.session_factory(engine)() as session:
        yield session


@pytest.fixture
def keys(tmp_path):
    """A signing key and the trusted keys of its public half."""
    from tunecache.signing import generate_signing_key, load_signing_key, load_trusted_keys

    files = generate_signing_key(tmp_path / "node-key")
    return load_signing_key(files.private_path), load_trusted_keys(str(files.public_path))


def store_bytes(session, data: bytes) -> str:
    return blobs.store_blob(session, io.BytesIO(data), hashlib.sha256(data).hexdigest()).sha256


def create(session, data: bytes | None = None, **overrides) -> TuningRunCreate:
    """A run of CUDNN_FILE's key and environment whose FlashInfer file is ``data`` (default:
    CUDNN_FILE's bytes), stored."""
    data = data if data is not None else CUDNN_FILE.read_bytes()
    payload = run_payload(CUDNN_FILE, **overrides)
    for artifact in payload["artifacts"]:
        artifact["sha256"] = store_bytes(session, data)
    return TuningRunCreate.model_validate(payload)


def record(session, run: TuningRunCreate, **options):
    recorded = publishing.record_run(session, run, **options)
    session.commit()
    return recorded


def proposal(session, run: TuningRunCreate, data: bytes | None = None, **fields) -> Proposal:
    """A proposal of ``run`` to record, placed as record_run places it."""
    key_row = repository.get_or_create_key(session, run.key)
    env_row = repository.get_or_create_environment(session, run.environment)
    place = repository.RunPlace(key_row.id, env_row.id, run.variant)
    return Proposal(session, run, place, fields.pop("trusted_keys", None),
                    autotune_file=data if data is not None else CUDNN_FILE.read_bytes(), **fields)


def promotion(session, run_id: int, **fields) -> Proposal:
    stored = repository.get_run(session, run_id)
    return Proposal(session, stored, repository.place_of(session, run_id), fields.pop("trusted_keys", None),
                    run_id=run_id, signature_verified=stored.signature_verified, **fields)


def emptier() -> bytes:
    return json.dumps({"_metadata": json.loads(CUDNN_FILE.read_text())["_metadata"]}).encode()


def slower() -> bytes:
    """CUDNN_FILE with one entry's tactic changed and 50 % slower: a regression the run diff flags."""
    doc = json.loads(CUDNN_FILE.read_text())
    key = next(k for k, v in doc.items() if not k.startswith("_") and isinstance(v, list) and len(v) > 3)
    runner, tactic, policy, selection = doc[key]
    doc[key] = [runner, [tactic, "other"] if not isinstance(tactic, int) else tactic + 1000, policy,
                {**selection, "time_ms": selection["time_ms"] * 1.5}]
    return json.dumps(doc).encode()


def test_the_rules_in_their_order():
    assert [rule.__name__ for rule in publishing.RECORD_POLICY] == [
        "push_tokens_record_pods_runs",
        "signatures_checked_against_trusted_keys",
        "failed_runs_stay_out",
        "pods_runs_are_held",
        "variant_runs_stay_with_their_variant",
        "forced_records_skip_the_checks",
        "signed_by_a_trusted_key",
        "not_emptier_than_the_current_run",
        "no_regression_against_the_current_run",
    ]
    assert [rule.__name__ for rule in publishing.PROMOTE_POLICY] == [
        "only_succeeded_runs_are_promoted",
        "retired_runs_are_never_promoted",
        "pods_runs_are_never_promoted",
        "a_new_signature_replaces_the_old",
        "promoted_runs_are_signed_by_a_trusted_key",
        "variant_runs_stay_with_their_variant",
    ]
    for rule in publishing.RECORD_POLICY + publishing.PROMOTE_POLICY:
        assert rule.__doc__ and len(rule.__doc__.split()) >= 8, rule.__name__  # each says its rule


def test_the_first_verdict_decides_and_a_proposal_none_decided_on_is_current(session):
    seen = []

    def note(name, verdict=None):
        def rule(_proposal):
            seen.append(name)
            return verdict
        return rule

    run = create(session)
    held = Verdict(current=False, reason="no")
    assert publishing.decide([note("a"), note("b", held), note("c")], proposal(session, run)) is held
    assert seen == ["a", "b"]
    assert publishing.decide([note("d")], proposal(session, run)) == CURRENT


def test_a_push_token_records_a_pods_run_whatever_the_body_says(session):
    run = create(session, trigger="cli")
    untrusted = proposal(session, run, trusted_recorder=False)
    publishing.push_tokens_record_pods_runs(untrusted)
    assert untrusted.trigger is RunTrigger.POD
    trusted = proposal(session, run)
    publishing.push_tokens_record_pods_runs(trusted)
    assert trusted.trigger is RunTrigger.CLI


def test_signatures_are_checked_only_against_trusted_keys(session, keys):
    signing_key, trusted_keys = keys
    run = create(session)
    signed_run = TuningRunCreate.model_validate(signed(run.model_dump(mode="json"), signing_key))
    for candidate, trusted, verified, why in ((signed_run, trusted_keys, True, None),
                                             (run, trusted_keys, None, "run is unsigned"),
                                             (signed_run, None, None, None)):
        checked = proposal(session, candidate, trusted_keys=trusted)
        assert publishing.signatures_checked_against_trusted_keys(checked) is None
        assert (checked.signature_verified, checked.unsigned_why) == (verified, why)


def test_a_failed_run_is_not_current_and_not_held(session):
    failed = create(session, status="failed", error="CUDA error", artifacts=[])
    assert publishing.failed_runs_stay_out(proposal(session, failed)) == Verdict(current=False, reason=None)
    assert publishing.failed_runs_stay_out(proposal(session, create(session))) is None


def test_a_pods_run_is_held(session):
    pods = proposal(session, create(session), trigger=RunTrigger.POD)
    assert publishing.pods_runs_are_held(pods) == Verdict(current=False, reason=POD_RUN_HELD)
    assert publishing.pods_runs_are_held(proposal(session, create(session), trigger=RunTrigger.UPLOAD)) is None


def test_a_variant_run_moves_the_keys_pointer_only_while_the_key_has_none(session):
    variant_run = create(session, variant=VARIANT, summary={"entries": 42, "engine_args": {"max_model_len": 8192}})
    alone = proposal(session, variant_run)
    publishing.variant_runs_stay_with_their_variant(alone)
    assert alone.current_of_key  # the key has no current run yet
    record(session, create(session))
    beside = proposal(session, variant_run)
    publishing.variant_runs_stay_with_their_variant(beside)
    assert not beside.current_of_key
    own_arguments = proposal(session, create(session, variant=VARIANT))  # a compile cache, no engine arguments of its own
    publishing.variant_runs_stay_with_their_variant(own_arguments)
    assert own_arguments.current_of_key


def test_a_forced_record_skips_the_checks_after_it(session):
    record(session, create(session))
    assert publishing.forced_records_skip_the_checks(proposal(session, create(session), forced=True)) == CURRENT
    assert publishing.forced_records_skip_the_checks(proposal(session, create(session))) is None
    forced = record(session, create(session, emptier()), force=True)
    assert forced.is_current and forced.held is None


def test_with_trusted_keys_an_unsigned_run_is_held(session, keys):
    _, trusted_keys = keys
    unsigned = proposal(session, create(session), trusted_keys=trusted_keys, unsigned_why="run is unsigned")
    assert publishing.signed_by_a_trusted_key(unsigned) == Verdict(
        current=False, reason="not signed by a key this service trusts (TUNECACHE_TRUSTED_KEYS): run is unsigned")
    assert publishing.signed_by_a_trusted_key(proposal(session, create(session), unsigned_why="run is unsigned")) is None


def test_a_run_emptier_than_the_current_run_is_held(session):
    assert publishing.not_emptier_than_the_current_run(proposal(session, create(session, emptier()), emptier())) is None
    current = record(session, create(session))
    verdict = publishing.not_emptier_than_the_current_run(proposal(session, create(session, emptier()), emptier()))
    assert verdict == Verdict(current=False, reason=f"it has 0 FlashInfer entries, fewer than the 42 of current run "
                                                    f"{current.id}: an emptier run does not replace the current one "
                                                    "unless forced")
    assert publishing.not_emptier_than_the_current_run(proposal(session, create(session))) is None


def test_a_run_the_diff_flags_a_regression_in_is_held(session):
    current = record(session, create(session))
    verdict = publishing.no_regression_against_the_current_run(proposal(session, create(session, slower()), slower()))
    assert not verdict.current
    assert verdict.reason == (f"the run diff against current run {current.id} flags 1 regression "
                              f"(tunecache diff {current.id} <this run>)")
    assert publishing.no_regression_against_the_current_run(proposal(session, create(session))) is None


def test_recording_applies_the_rules_in_order(session):
    """A failed pod's run is not held (failed comes first); a pod's emptier run is held as a
    pod's (before the entries); the policy's verdict is what is stored."""
    current = record(session, create(session))
    failed_pods = record(session, create(session, status="failed", error="x", artifacts=[]), trusted=False)
    assert (failed_pods.trigger, failed_pods.held, failed_pods.is_current) == ("pod", None, False)
    pods_emptier = record(session, create(session, emptier()), trusted=False)
    assert pods_emptier.held == POD_RUN_HELD and not pods_emptier.verified
    held = record(session, create(session, slower()))
    assert held.held.startswith("the run diff") and not held.is_current
    assert repository.lookup(session, h200_key(), run_payload_environment()).id == current.id


def run_payload_environment():
    return TuningRunCreate.model_validate(run_payload(CUDNN_FILE)).environment


def test_promotion_refuses_a_failed_run_and_a_pods(session):
    failed = record(session, create(session, status="failed", error="x", artifacts=[]))
    assert publishing.only_succeeded_runs_are_promoted(promotion(session, failed.id)) == Verdict(
        current=False, reason=f"run {failed.id} failed: only a succeeded run can be current")
    pods = record(session, create(session), trusted=False)
    assert publishing.pods_runs_are_never_promoted(promotion(session, pods.id)) == Verdict(
        current=False, reason=f"run {pods.id} is a pod's run (unverified): only a run a tuner or an admin recorded "
                              "can be current")
    with pytest.raises(ValueError, match="is a pod's run"):
        publishing.promote_run(session, pods.id, None)
    with pytest.raises(LookupError, match="no tuning run 999999"):
        publishing.promote_run(session, 999_999, None)


def test_promotion_with_a_new_signature_checks_that_one(session, keys):
    signing_key, trusted_keys = keys
    run = record(session, create(session))
    unsigned = promotion(session, run.id, trusted_keys=trusted_keys)
    verdict = publishing.promoted_runs_are_signed_by_a_trusted_key(unsigned)
    assert verdict == Verdict(current=False, reason=f"run {run.id} is not signed by a key this service trusts: "
                                                    "run is unsigned")
    signature = TuningRunCreate.model_validate(signed(create(session).model_dump(mode="json"), signing_key)).signature
    resigned = promotion(session, run.id, trusted_keys=trusted_keys, new_signature=signature)
    assert publishing.a_new_signature_replaces_the_old(resigned) is None
    assert resigned.run.signature == signature and resigned.signature_verified is None
    assert publishing.promoted_runs_are_signed_by_a_trusted_key(resigned) is None
    assert resigned.signature_verified is True
    promoted, previous = publishing.promote_run(session, run.id, trusted_keys, signature)
    assert promoted.is_current and promoted.signature == signature and promoted.signature_verified is True
    assert previous == run.id


def test_promoting_a_variant_run_moves_only_its_variants_pointer(session):
    key_run = record(session, create(session))
    variant_run = record(session, create(session, variant=VARIANT,
                                         summary={"entries": 42, "engine_args": {"max_model_len": 8192}}))
    assert not variant_run.is_current
    older_variant = record(session, create(session, variant=VARIANT,
                                           summary={"entries": 42, "engine_args": {"max_model_len": 8192}}))
    promoted, previous = publishing.promote_run(session, variant_run.id, None)
    session.commit()
    assert not promoted.is_current and previous == older_variant.id
    assert repository.lookup(session, h200_key(), run_payload_environment()).id == key_run.id
    assert repository.lookup(session, h200_key(), run_payload_environment(), VARIANT).id == variant_run.id
    newer = record(session, create(session))
    rolled_back, previous = publishing.promote_run(session, key_run.id, None)  # a roll back of the key's run
    assert rolled_back.is_current and previous == newer.id


def test_an_imported_run_needs_a_signature_the_service_trusts(keys, tmp_path):
    """``untrusted_signature`` (``POST /v1/tunings?trusted_signature=true``, ``tunecache import``):
    a run signed by a trusted key passes; unsigned, another key's, or a service with no trusted
    keys is refused, saying why."""
    from tunecache.service.publishing import untrusted_signature
    from tunecache.signing import generate_signing_key, load_signing_key

    signing_key, trusted_keys = keys
    stranger = load_signing_key(generate_signing_key(tmp_path / "stranger").private_path)
    run = TuningRunCreate.model_validate(run_payload(CUDNN_FILE))
    assert untrusted_signature(TuningRunCreate.model_validate(signed(run_payload(CUDNN_FILE), signing_key)),
                               trusted_keys) is None
    assert untrusted_signature(run, trusted_keys) == ("not signed by a key this service trusts "
                                                      "(TUNECACHE_TRUSTED_KEYS): run is unsigned")
    by_stranger = untrusted_signature(TuningRunCreate.model_validate(signed(run_payload(CUDNN_FILE), stranger)),
                                      trusted_keys)
    assert by_stranger.startswith("not signed by a key this service trusts (TUNECACHE_TRUSTED_KEYS): signed by key ")
    assert untrusted_signature(run, None).startswith("this service has no trusted keys (TUNECACHE_TRUSTED_KEYS)")
