"""The promotion policy (tunecache.service.publishing): its rules in their order, and each rule
on its own, with the real H200 FlashInfer files and no database: a rule reads its proposal
alone, the database's part (the current run and its file) loaded before as its
:class:`~tunecache.service.publishing.PublishingContext`. ``record_run`` and ``promote_run``,
which load that context and store the verdict, are tested on the real stores in
test_publishing_records.py."""

from __future__ import annotations

import datetime as dt
import hashlib
import json

import pytest

from tests.support.builders import run_payload, signed
from tests.support.paths import CUDNN_FILE
from tunecache.contract import RunTrigger, TuningRunCreate, TuningRunRead
from tunecache.service import publishing
from tunecache.service.publishing import CURRENT, POD_RUN_HELD, Proposal, PublishingContext, Verdict
from tunecache.service.repository import RunPlace

VARIANT = "0123456789abcdef"
#: Where the proposed runs can be current (a key's and an environment's row ids; no database here).
PLACE = RunPlace(key_id=1, environment_id=1, variant=None)


@pytest.fixture
def keys(tmp_path):
    """A signing key and the trusted keys of its public half."""
    from tunecache.signing import generate_signing_key, load_signing_key, load_trusted_keys

    files = generate_signing_key(tmp_path / "node-key")
    return load_signing_key(files.private_path), load_trusted_keys(str(files.public_path))


def create(data: bytes | None = None, **overrides) -> TuningRunCreate:
    """A run of CUDNN_FILE's key and environment whose FlashInfer file is ``data`` (default:
    CUDNN_FILE's bytes)."""
    data = data if data is not None else CUDNN_FILE.read_bytes()
    payload = run_payload(CUDNN_FILE, **overrides)
    for artifact in payload["artifacts"]:
        artifact["sha256"] = hashlib.sha256(data).hexdigest()
    return TuningRunCreate.model_validate(payload)


def stored(run_id: int, run: TuningRunCreate | None = None, **fields) -> TuningRunRead:
    """``run`` (default: :func:`create`'s) as the service reads it back once stored as ``run_id``."""
    run = run or create()
    artifacts = [{**a.model_dump(mode="json"), "size_bytes": 1, "download_path": f"/v1/artifacts/{a.sha256}"}
                 for a in run.artifacts]
    values = {**run.model_dump(mode="json"), "id": run_id, "environment_hash": "0" * 16, "duration_s": None,
              "verified": run.trigger is not RunTrigger.POD, "is_current": True,
              "created_at": dt.datetime.now(dt.timezone.utc), "artifacts": artifacts, **fields}
    return TuningRunRead.model_validate(values)


def proposal(run: TuningRunCreate, data: bytes | None = None, *, current: TuningRunRead | None = None,
             current_file: bytes | None = None, **fields) -> Proposal:
    """A proposal of ``run`` to record, with the current run ``current`` (its file ``current_file``)."""
    return Proposal(run, PLACE, fields.pop("trusted_keys", None),
                    autotune_file=data if data is not None else CUDNN_FILE.read_bytes(),
                    context=PublishingContext(current, current_file), **fields)


def promotion(run: TuningRunRead, **fields) -> Proposal:
    return Proposal(run, PLACE, fields.pop("trusted_keys", None), run_id=run.id,
                    signature_verified=run.signature_verified, **fields)


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


def test_the_first_verdict_decides_and_a_proposal_none_decided_on_is_current():
    seen = []

    def note(name, verdict=None):
        def rule(_proposal):
            seen.append(name)
            return verdict
        return rule

    run = create()
    held = Verdict(current=False, reason="no")
    assert publishing.decide([note("a"), note("b", held), note("c")], proposal(run)) is held
    assert seen == ["a", "b"]
    assert publishing.decide([note("d")], proposal(run)) == CURRENT


def test_a_push_token_records_a_pods_run_whatever_the_body_says():
    run = create(trigger="cli")
    untrusted = proposal(run, trusted_recorder=False)
    publishing.push_tokens_record_pods_runs(untrusted)
    assert untrusted.trigger is RunTrigger.POD
    trusted = proposal(run)
    publishing.push_tokens_record_pods_runs(trusted)
    assert trusted.trigger is RunTrigger.CLI


def test_signatures_are_checked_only_against_trusted_keys(keys):
    signing_key, trusted_keys = keys
    run = create()
    signed_run = TuningRunCreate.model_validate(signed(run.model_dump(mode="json"), signing_key))
    for candidate, trusted, verified, why in ((signed_run, trusted_keys, True, None),
                                             (run, trusted_keys, None, "run is unsigned"),
                                             (signed_run, None, None, None)):
        checked = proposal(candidate, trusted_keys=trusted)
        assert publishing.signatures_checked_against_trusted_keys(checked) is None
        assert (checked.signature_verified, checked.unsigned_why) == (verified, why)


def test_a_failed_run_is_not_current_and_not_held():
    failed = create(status="failed", error="CUDA error", artifacts=[])
    assert publishing.failed_runs_stay_out(proposal(failed)) == Verdict(current=False, reason=None)
    assert publishing.failed_runs_stay_out(proposal(create())) is None


def test_a_pods_run_is_held():
    pods = proposal(create(), trigger=RunTrigger.POD)
    assert publishing.pods_runs_are_held(pods) == Verdict(current=False, reason=POD_RUN_HELD)
    assert publishing.pods_runs_are_held(proposal(create(), trigger=RunTrigger.UPLOAD)) is None


def test_a_variant_run_moves_the_keys_pointer_only_while_the_key_has_none():
    variant_run = create(variant=VARIANT, summary={"entries": 42, "engine_args": {"max_model_len": 8192}})
    alone = proposal(variant_run)
    publishing.variant_runs_stay_with_their_variant(alone)
    assert alone.current_of_key  # the key has no current run yet
    current = stored(1)
    beside = proposal(variant_run, current=current)
    publishing.variant_runs_stay_with_their_variant(beside)
    assert not beside.current_of_key
    own_arguments = proposal(create(variant=VARIANT), current=current)  # a compile cache, no engine arguments of its own
    publishing.variant_runs_stay_with_their_variant(own_arguments)
    assert own_arguments.current_of_key


def test_a_forced_record_skips_the_checks_after_it():
    current = stored(1)
    assert publishing.forced_records_skip_the_checks(proposal(create(), current=current, forced=True)) == CURRENT
    assert publishing.forced_records_skip_the_checks(proposal(create(), current=current)) is None


def test_with_trusted_keys_an_unsigned_run_is_held(keys):
    _, trusted_keys = keys
    unsigned = proposal(create(), trusted_keys=trusted_keys, unsigned_why="run is unsigned")
    assert publishing.signed_by_a_trusted_key(unsigned) == Verdict(
        current=False, reason="not signed by a key this service trusts (TUNECACHE_TRUSTED_KEYS): run is unsigned")
    assert publishing.signed_by_a_trusted_key(proposal(create(), unsigned_why="run is unsigned")) is None


def test_a_run_emptier_than_the_current_run_is_held():
    assert publishing.not_emptier_than_the_current_run(proposal(create(emptier()), emptier())) is None
    current, its_file = stored(7), CUDNN_FILE.read_bytes()
    verdict = publishing.not_emptier_than_the_current_run(
        proposal(create(emptier()), emptier(), current=current, current_file=its_file))
    assert verdict == Verdict(current=False, reason=f"it has 0 FlashInfer entries, fewer than the 42 of current run "
                                                    f"{current.id}: an emptier run does not replace the current one "
                                                    "unless forced")
    assert publishing.not_emptier_than_the_current_run(proposal(create(), current=current, current_file=its_file)) is None


def test_a_run_the_diff_flags_a_regression_in_is_held():
    current, its_file = stored(7), CUDNN_FILE.read_bytes()
    verdict = publishing.no_regression_against_the_current_run(
        proposal(create(slower()), slower(), current=current, current_file=its_file))
    assert not verdict.current
    assert verdict.reason == (f"the run diff against current run {current.id} flags 1 regression "
                              f"(tunecache diff {current.id} <this run>)")
    assert publishing.no_regression_against_the_current_run(
        proposal(create(), current=current, current_file=its_file)) is None


def test_promotion_refuses_a_failed_run_and_a_pods():
    failed = stored(3, create(status="failed", error="x", artifacts=[]), is_current=False)
    assert publishing.only_succeeded_runs_are_promoted(promotion(failed)) == Verdict(
        current=False, reason=f"run {failed.id} failed: only a succeeded run can be current")
    pods = stored(4, create(trigger="pod"), is_current=False)
    assert publishing.pods_runs_are_never_promoted(promotion(pods)) == Verdict(
        current=False, reason=f"run {pods.id} is a pod's run (unverified): only a run a tuner or an admin recorded "
                              "can be current")


def test_promotion_with_a_new_signature_checks_that_one(keys):
    signing_key, trusted_keys = keys
    run = stored(5)
    unsigned = promotion(run, trusted_keys=trusted_keys)
    verdict = publishing.promoted_runs_are_signed_by_a_trusted_key(unsigned)
    assert verdict == Verdict(current=False, reason=f"run {run.id} is not signed by a key this service trusts: "
                                                    "run is unsigned")
    signature = TuningRunCreate.model_validate(signed(create().model_dump(mode="json"), signing_key)).signature
    resigned = promotion(run, trusted_keys=trusted_keys, new_signature=signature)
    assert publishing.a_new_signature_replaces_the_old(resigned) is None
    assert resigned.run.signature == signature and resigned.signature_verified is None
    assert publishing.promoted_runs_are_signed_by_a_trusted_key(resigned) is None
    assert resigned.signature_verified is True


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
