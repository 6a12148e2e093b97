"""The storage layer on SQLite and on the real PostgreSQL, with the real H200 FlashInfer files."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import io

import pytest

from tests.support.paths import CUBLASLT_FILE, CUDNN_FILE
from tests.support.builders import file_environment, h200_key, run_payload, store_file
from tunecache.service import blobs, db, publishing, repository
from tunecache.contract import LookupMiss, TuningRunCreate, TuningRunQuery, TuningRunRead


@pytest.fixture
def session(engine):
    with db.session_factory(engine)() as session:
        yield session


def record(session, path=CUDNN_FILE, **overrides) -> TuningRunRead:
    store_file(session, path)
    run = publishing.record_run(session, TuningRunCreate.model_validate(run_payload(path, **overrides)))
    session.commit()
    return run


def test_recorded_run_is_current_and_found_by_lookup(session):
    started = dt.datetime(2026, 11, 30, 2, 0, tzinfo=dt.timezone.utc)
    run = record(session, started_at=started.isoformat(), finished_at=(started + dt.timedelta(seconds=137)).isoformat(),
                 node="gpu-node-1", summary={"entries": 43, "tuning_seconds": 137.0})
    assert run.is_current and run.verified and run.status == "succeeded"
    assert run.duration_s == pytest.approx(137.0)
    assert [a.kind for a in run.artifacts] == ["flashinfer_autotune_v1"]
    assert run.artifacts[0].size_bytes == len(CUDNN_FILE.read_bytes())

    hit = repository.lookup(session, h200_key(), file_environment(CUDNN_FILE))
    assert isinstance(hit, TuningRunRead)
    assert hit.id == run.id and hit.summary["entries"] == 43
    assert blobs.read_blob(session, run.artifacts[0].sha256) == CUDNN_FILE.read_bytes()


def test_history_keeps_every_run_and_current_moves(session):
    first = record(session)
    second = record(session)
    assert first.id != second.id
    page = repository.list_runs(session, TuningRunQuery(model="meta-llama/Llama-3.1-8B"))
    assert page.total == 2
    assert [r.id for r in page.items] == [second.id, first.id]
    assert [r.is_current for r in page.items] == [True, False]
    hit = repository.lookup(session, h200_key(), file_environment(CUDNN_FILE))
    assert hit.id == second.id


def test_failed_run_keeps_previous_tuning_current(session):
    good = record(session)
    failed = publishing.record_run(
        session,
        TuningRunCreate.model_validate(run_payload(CUDNN_FILE, status="failed", error="CUDA error: illegal address", artifacts=[])),
    )
    session.commit()
    assert not failed.is_current
    assert repository.lookup(session, h200_key(), file_environment(CUDNN_FILE)).id == good.id
    assert repository.list_runs(session, TuningRunQuery(status="failed")).items[0].error == "CUDA error: illegal address"


def test_lookup_miss_names_each_differing_field(session):
    run = record(session)
    yours = file_environment(CUDNN_FILE).model_copy(update={"cudnn_version": "91700"})
    miss = repository.lookup(session, h200_key(), yours)
    assert isinstance(miss, LookupMiss)
    assert miss.closest[0].run_id == run.id
    assert [str(d) for d in miss.closest[0].differences] == ["cudnn_version: stored 91900, yours 91700"]
    assert "cudnn_version: stored 91900, yours 91700" in miss.detail


def test_lookup_miss_ranks_closest_and_reports_key_fields(session):
    near = record(session, key=h200_key(max_num_batched_tokens=4096))
    far = record(session, key=h200_key(max_num_batched_tokens=2048, tensor_parallel_size=2))
    other_gpu = file_environment(CUDNN_FILE).model_copy(update={"gpu": "NVIDIA H100 80GB HBM3"})
    miss = repository.lookup(session, h200_key(gpu_name="NVIDIA H100 80GB HBM3"), other_gpu)
    assert [c.run_id for c in miss.closest] == [near.id, far.id]
    assert [str(d) for d in miss.closest[0].differences] == [
        "gpu_name: stored NVIDIA H200, yours NVIDIA H100 80GB HBM3",
        "max_num_batched_tokens: stored 4096, yours 8192",
        "gpu: stored NVIDIA H200, yours NVIDIA H100 80GB HBM3",
    ]


def test_lookup_on_empty_store_says_so(session):
    miss = repository.lookup(session, h200_key(), file_environment(CUDNN_FILE))
    assert miss.closest == [] and miss.detail == "no tuning is stored yet"


def test_environments_are_distinct_per_file_metadata(session):
    # both real files share one environment: one row, two keys, both current
    a = record(session, CUDNN_FILE, key=h200_key(model="a"))
    b = record(session, CUBLASLT_FILE, key=h200_key(model="b"))
    assert a.environment_hash == b.environment_hash
    assert repository.list_runs(session, TuningRunQuery(current_only=True)).total == 2


def test_indeterminate_environment_is_refused_and_nothing_stored(session):
    store_file(session, CUDNN_FILE)
    payload = run_payload(CUDNN_FILE)
    payload["environment"]["cudnn_version"] = "unknown"
    with pytest.raises(publishing.IndeterminateEnvironment, match="cudnn_version"):
        publishing.record_run(session, TuningRunCreate.model_validate(payload))
    session.rollback()
    assert repository.list_runs(session).total == 0


def test_run_with_unuploaded_artifact_is_refused(session):
    payload = run_payload(CUDNN_FILE)
    with pytest.raises(publishing.ArtifactsMissing) as info:
        publishing.record_run(session, TuningRunCreate.model_validate(payload))
    assert info.value.missing == [payload["artifacts"][0]["sha256"]]
    session.rollback()
    assert repository.list_runs(session).total == 0


def test_a_flashinfer_artifact_that_is_not_a_flashinfer_file_is_refused(session, app_client):
    """A run whose flashinfer_autotune_v1 artifact is not FlashInfer's autotune file is
    refused (pods would install it where FlashInfer reads it); nothing is stored."""
    data = b"hello"
    digest = hashlib.sha256(data).hexdigest()
    blobs.store_blob(session, io.BytesIO(data), digest)
    session.commit()
    payload = run_payload(CUDNN_FILE)
    payload["artifacts"][0].update(sha256=digest)
    with pytest.raises(publishing.NotAFlashInferFile, match="is not JSON"):
        publishing.record_run(session, TuningRunCreate.model_validate(payload))
    session.rollback()
    answer = app_client.post("/v1/tunings", json=payload)
    assert answer.status_code == 422 and "flashinfer_autotune_v1 artifact must be one" in answer.json()["detail"]
    assert repository.list_runs(session).total == 0


def test_an_autotune_file_past_the_bound_is_refused_before_it_is_read(session, app_client):
    """A run's FlashInfer file is read whole and checked at record: past
    MAX_AUTOTUNE_FILE_BYTES it is refused on its stored size, unread (issue 21: one 128 MiB
    file took the service to 2.24 GB); a diff reads no more than that either."""
    from tunecache.contract import MAX_AUTOTUNE_FILE_BYTES

    doc = json.loads(CUDNN_FILE.read_text())
    data = json.dumps({**doc, "_padding": "x" * MAX_AUTOTUNE_FILE_BYTES}).encode()  # valid JSON, one byte too many at least
    digest = hashlib.sha256(data).hexdigest()
    blobs.store_blob(session, io.BytesIO(data), digest)
    session.commit()
    payload = run_payload(CUDNN_FILE)
    payload["artifacts"][0].update(sha256=digest)
    with pytest.raises(publishing.NotAFlashInferFile, match=f"is {len(data):,} bytes; a FlashInfer autotune file is at "
                                                            f"most {MAX_AUTOTUNE_FILE_BYTES:,} bytes here"):
        publishing.record_run(session, TuningRunCreate.model_validate(payload))
    session.rollback()
    answer = app_client.post("/v1/tunings", json=payload)
    assert answer.status_code == 422 and f"most {MAX_AUTOTUNE_FILE_BYTES:,} bytes" in answer.json()["detail"]
    assert repository.list_runs(session).total == 0


def test_blobs_are_content_addressed_chunked_and_checked(session, monkeypatch):
    monkeypatch.setattr(blobs, "CHUNK_BYTES", 4096)  # several chunks from a 19 kB file
    data = CUBLASLT_FILE.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    assert blobs.store_blob(session, io.BytesIO(data), digest).created
    session.commit()
    assert len(list(blobs.iter_blob(session, digest))) == -(-len(data) // 4096)
    assert blobs.read_blob(session, digest) == data
    assert not blobs.store_blob(session, io.BytesIO(data), digest).created
    other = data + b" "
    wrong = hashlib.sha256(b"something else").hexdigest()
    with pytest.raises(blobs.DigestMismatch):
        blobs.store_blob(session, io.BytesIO(other), wrong)
    session.rollback()
    assert blobs.blob_size(session, wrong) is None and blobs.read_blob(session, wrong) is None
    assert blobs.blob_size(session, digest) == len(data)
    assert blobs.read_blob(session, "0" * 64) is None


def test_pod_pushed_run_is_unverified_and_not_current(session):
    good = record(session)
    pod = record(session, trigger="pod", node="pod-7")
    assert not pod.verified and not pod.is_current
    assert repository.lookup(session, h200_key(), file_environment(CUDNN_FILE)).id == good.id


def test_current_pointer_only_moves_to_newer_runs(session):
    """Concurrent recordings may commit out of order; the newest run must stay current."""
    from tunecache.service import dialect
    from tunecache.service.models import CurrentTuning

    a, b, c = record(session), record(session), record(session)
    row = session.get(CurrentTuning, (1, 1))
    assert row.run_id == c.id

    def point(run_id):
        dialect.upsert_if_newer(session, CurrentTuning.__table__,
                                {"key_id": 1, "environment_id": 1, "run_id": run_id, "updated_at": c.created_at},
                                ["key_id", "environment_id"], newer="run_id")
        session.commit()
        return session.get(CurrentTuning, (1, 1), populate_existing=True).run_id

    assert point(a.id) == c.id  # an older run committing late does not take over
    assert point(b.id) == c.id
