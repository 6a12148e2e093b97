"""Recording and promoting runs (tunecache.service.publishing.record_run, promote_run) against
the real SQLite and PostgreSQL stores with the real H200 FlashInfer files: the publishing
context loaded from the database, the rules' verdict stored. The rules themselves, on their
own and without a database, are in test_publishing.py."""

from __future__ import annotations

import hashlib
import io

import pytest

from tests.support.builders import h200_key, run_payload, signed
from tests.support.paths import CUDNN_FILE
from tests.unit.service.test_publishing import emptier, slower  # the same two FlashInfer files
from tunecache.contract import TuningRunCreate
from tunecache.service import blobs, db, publishing, repository
from tunecache.service.publishing import POD_RUN_HELD, PublishingContext, load_context

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


def test_the_context_is_the_current_run_and_its_file_as_stored(session):
    run = create(session)
    key_row = repository.get_or_create_key(session, run.key)
    env_row = repository.get_or_create_environment(session, run.environment)
    place = repository.RunPlace(key_row.id, env_row.id, run.variant)
    assert load_context(session, place) == PublishingContext(None, None)  # nothing current yet
    current = record(session, run)
    assert load_context(session, place) == PublishingContext(current.model_copy(update={"is_current": True}),
                                                             CUDNN_FILE.read_bytes())
    assert load_context(session, place, with_file=False).current_file is None  # a promotion reads no file


def test_a_forced_record_skips_the_checks_after_it(session):
    record(session, create(session))
    forced = record(session, create(session, emptier()), force=True)
    assert forced.is_current and forced.held is None


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




def test_promotion_refuses_a_pods_run_and_a_run_that_is_not_there(session):
    pods = record(session, create(session), trusted=False)
    with pytest.raises(ValueError, match="is a pod's run"):
        publishing.promote_run(session, pods.id, None)
    with pytest.raises(LookupError, match="no tuning run 999999"):
        publishing.promote_run(session, 999_999, None)


def test_promotion_with_a_new_signature_stores_that_one_checked(session, keys):
    signing_key, trusted_keys = keys
    run = record(session, create(session))
    signature = TuningRunCreate.model_validate(signed(create(session).model_dump(mode="json"), signing_key)).signature
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
