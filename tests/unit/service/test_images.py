"""Images never displace each other (tunecache.service.images): runs of one key made on two
images (other torch or Triton, the same FlashInfer environment), the lookup of each image's pod,
the old answer without the pod's versions, promotion and retention; on SQLite and PostgreSQL."""

from __future__ import annotations

import datetime as dt

import pytest

from tests.support.builders import file_environment, h200_key, run_payload, store_file
from tests.support.paths import CUDNN_FILE
from tunecache.contract import LookupMiss, LookupRequest, TuningRunCreate, TuningRunRead
from tunecache.formats.dependencies import image_of
from tunecache.service import db, publishing, repository, retention

#: The package versions of two images of one fleet (an upgrade half done) and of a third with no run.
OLD = {"apache-tvm-ffi": "0.1.4", "torch": "2.9.0", "triton": "3.5.0"}
NEW = {"apache-tvm-ffi": "0.1.4", "torch": "2.10.0", "triton": "3.6.0"}
THIRD = {"apache-tvm-ffi": "0.1.4", "torch": "2.11.0", "triton": "3.7.0"}
VARIANT = "0123456789abcdef"


@pytest.fixture
def session(engine):
    with db.session_factory(engine)() as session:
        yield session


def record(session, dependencies: dict | None, **overrides) -> TuningRunRead:
    store_file(session, CUDNN_FILE)
    summary = {"entries": 43, **({"dependencies": dependencies} if dependencies is not None else {}),
               **overrides.pop("summary", {})}
    run = publishing.record_run(session, TuningRunCreate.model_validate(run_payload(CUDNN_FILE, summary=summary,
                                                                                    **overrides)))
    session.commit()
    return run


def lookup(session, dependencies: dict | None, variant: str | None = None) -> TuningRunRead | LookupMiss:
    return repository.lookup(session, h200_key(), file_environment(CUDNN_FILE), variant,
                             image_of(dependencies) if dependencies is not None else None)


def test_each_images_pods_get_their_own_images_run(session):
    old = record(session, OLD, variant=VARIANT)
    new = record(session, NEW, variant=VARIANT)  # the key's current run now, and its variant's
    assert lookup(session, NEW).id == new.id and lookup(session, NEW).is_current
    assert lookup(session, OLD).id == old.id and not lookup(session, OLD).is_current
    # the variant's current run is the new image's: the old image's pods pass it over
    assert lookup(session, OLD, VARIANT).id == old.id
    assert lookup(session, NEW, VARIANT).id == new.id
    # a pod that sends no versions is answered as before images: the key's current run
    assert lookup(session, None).id == new.id and lookup(session, None, VARIANT).id == new.id
    # a pod of an image with no run gets the key's current run (it leaves out what drifts)
    assert lookup(session, THIRD).id == new.id


def test_a_run_that_records_no_versions_is_every_images(session):
    record(session, OLD)
    record(session, NEW)
    unversioned = record(session, None)
    assert unversioned.is_current
    assert {lookup(session, image).id for image in (OLD, NEW, THIRD, None)} == {unversioned.id}


def test_the_images_run_moves_with_the_keys_and_a_roll_back_moves_only_its_own(session):
    old = record(session, OLD)
    newer_old = record(session, OLD)
    new = record(session, NEW)
    assert lookup(session, OLD).id == newer_old.id and lookup(session, NEW).id == new.id
    run, _ = publishing.promote_run(session, old.id, None)  # the old image's pods roll back
    session.commit()
    assert run.is_current and lookup(session, OLD).id == old.id
    assert lookup(session, NEW).id == new.id  # the new image's pods keep theirs


def test_a_variant_run_becomes_its_images_run_only_while_the_image_has_none(session):
    record(session, NEW)
    variant_run = record(session, OLD, variant=VARIANT, summary={"engine_args": {"max_model_len": 8192}})
    assert lookup(session, OLD).id == variant_run.id  # the old image had none
    own = record(session, OLD)
    assert lookup(session, OLD).id == own.id
    variant_again = record(session, OLD, variant=VARIANT, summary={"engine_args": {"max_model_len": 8192}})
    assert lookup(session, OLD).id == own.id and lookup(session, OLD, VARIANT).id == variant_again.id


def test_retention_keeps_each_images_current_run(session):
    old = record(session, OLD)
    record(session, NEW)
    record(session, NEW)
    later = dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=1)
    deleted = retention.prune_runs(session, keep=1, now=later, grace=dt.timedelta(0))
    session.commit()
    assert old.id not in deleted and lookup(session, OLD).id == old.id


def test_the_image_is_the_versions_of_the_packages_kinds_depend_on():
    assert image_of(OLD) == image_of({**OLD, "vllm": "0.26.0"}) != image_of(NEW)
    assert image_of(None) is None and image_of({"vllm": "0.26.0"}) is None and image_of("torch") is None
    assert len(image_of(OLD)) == 16


def test_a_package_a_later_kind_depends_on_changes_no_image():
    """A run recorded before the TileLang and CuTe DSL caches were kinds names only torch,
    Triton and TVM-FFI; a pod now also sends tilelang and nvidia-cutlass-dsl (installed or not):
    the same image, so the pod still gets its image's run (the new kinds' packages are compared
    kind by kind)."""
    from tunecache.formats.dependencies import NOT_INSTALLED, installed_versions

    assert {"tilelang", "nvidia-cutlass-dsl"} <= set(installed_versions())
    assert image_of({**OLD, "tilelang": NOT_INSTALLED, "nvidia-cutlass-dsl": "4.8.1"}) == image_of(OLD)


def test_a_lookups_versions_are_bounded():
    from pydantic import ValidationError

    body = {"key": h200_key().model_dump(), "environment": file_environment(CUDNN_FILE).model_dump()}
    assert LookupRequest.model_validate({**body, "dependencies": OLD}).dependencies == OLD
    for bad in ({"torch": "x" * 65}, {"no spaces": "1"}, {f"p{i}": "1" for i in range(17)}, {"torch": 2}):
        with pytest.raises(ValidationError):
            LookupRequest.model_validate({**body, "dependencies": bad})


def test_a_retired_run_is_no_images_current_run(session):
    """Retiring a run moves every pointer that names it, the images' too: the image falls back
    to its newest usable run, or has none (its pods get the key's current run)."""
    from tunecache.service import retiring

    old_first = record(session, OLD)
    old = record(session, OLD)
    new = record(session, NEW)  # the key's current run
    assert lookup(session, OLD).id == old.id
    retiring.retire_run(session, old.id, None)
    session.commit()
    assert lookup(session, OLD).id == old_first.id  # the image's newest usable run
    retiring.retire_run(session, old_first.id, None)
    session.commit()
    assert lookup(session, OLD).id == new.id  # no run of its own left: the key's current run
    retiring.retire_run(session, new.id, None)
    session.commit()
    assert isinstance(lookup(session, NEW), LookupMiss)  # nothing usable is left anywhere
    assert isinstance(lookup(session, OLD), LookupMiss)
