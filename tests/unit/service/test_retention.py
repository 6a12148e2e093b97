"""Retention (issue row "months of data"): runs past ``TUNECACHE_RUN_RETENTION`` deleted,
unreferenced blobs collected, the artifact mirror capped in bytes; on SQLite and on the
real PostgreSQL, with the real H200 FlashInfer file as every run's autotune file."""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import os
import threading
import time

import pytest
from sqlalchemy import func, select

from tests.support.builders import file_environment, h200_key, run_payload, store_file
from tests.support.paths import CUDNN_FILE
from tunecache.contract import TuningRunCreate, TuningRunQuery
from tunecache.service import blobs, db, publishing, repository, retention
from tunecache.service.hot_path import ArtifactFiles
from tunecache.service.models import ArtifactBlob, ArtifactChunk, RunArtifact, TuningJob, TuningRun, utcnow
from tunecache.store import ArtifactsMissing

GRACE = dt.timedelta(hours=1)


def later() -> dt.datetime:
    """A moment past the grace of everything a test recorded just now."""
    return utcnow() + 2 * GRACE


@pytest.fixture
def sessions(engine):
    return db.session_factory(engine)


@pytest.fixture
def session(sessions):
    with sessions() as session:
        yield session


def store_bytes(session, data: bytes) -> str:
    return blobs.store_blob(session, io.BytesIO(data), hashlib.sha256(data).hexdigest()).sha256


def run_create(session, module: bytes, key=None, **overrides) -> TuningRunCreate:
    """A run of CUDNN_FILE with one JIT module of its own (both stored)."""
    store_file(session, CUDNN_FILE)
    sha = store_bytes(session, module)
    payload = run_payload(CUDNN_FILE, key=key, **overrides)
    payload["artifacts"].append({"kind": "flashinfer_jit_module", "name": "module.tar.gz",
                                 "media_type": "application/gzip", "sha256": sha})
    return TuningRunCreate.model_validate(payload)


def record(session, module: bytes, key=None, **overrides):
    run = publishing.record_run(session, run_create(session, module, key, **overrides))
    session.commit()
    return run


def ids(session, **filters) -> list[int]:
    return [r.id for r in repository.list_runs(session, TuningRunQuery(**filters)).items]


def test_runs_past_the_retention_are_deleted_keeping_current_last_n_and_pinned(session):
    runs = [record(session, b"module %d" % i) for i in range(6)]
    other = [record(session, b"other %d" % i, key=h200_key(model="other/model")) for i in range(3)]
    repository.pin_run(session, runs[0].id, True)
    publishing.promote_run(session, runs[1].id, None)  # an older run made current again
    session.commit()

    deleted = retention.prune_runs(session, keep=2, now=later(), grace=GRACE)
    session.commit()

    assert sorted(deleted) == sorted([runs[2].id, runs[3].id, other[0].id])
    assert ids(session, model="meta-llama/Llama-3.1-8B") == [runs[5].id, runs[4].id, runs[1].id, runs[0].id]
    assert ids(session, model="other/model") == [other[2].id, other[1].id]
    assert repository.get_run(session, runs[0].id).pinned
    assert repository.lookup(session, h200_key(), file_environment(CUDNN_FILE)).id == runs[1].id
    # their artifact rows went with them; the blobs are left to the collector
    assert session.scalar(select(func.count()).select_from(RunArtifact).where(RunArtifact.run_id.in_(deleted))) == 0
    assert repository.get_run(session, runs[2].id) is None


def test_off_keeps_every_run_and_a_dry_run_deletes_nothing(session):
    runs = [record(session, b"module %d" % i) for i in range(4)]
    assert retention.prune_runs(session, keep=None, now=later(), grace=GRACE) == []
    would = retention.prune_runs(session, keep=1, now=later(), grace=GRACE, dry_run=True)
    session.commit()
    assert sorted(would) == [r.id for r in runs[:3]]
    assert len(ids(session)) == 4


def test_a_run_a_job_points_at_or_one_just_recorded_is_kept(session):
    runs = [record(session, b"module %d" % i) for i in range(4)]
    row = session.get(TuningRun, runs[0].id)
    session.add(TuningJob(key_id=row.key_id, status="succeeded", run_id=runs[0].id, attempts=1))
    session.commit()

    assert retention.prune_runs(session, keep=1, now=utcnow(), grace=GRACE) == []  # all recorded within the grace
    deleted = retention.prune_runs(session, keep=1, now=later(), grace=GRACE)
    session.commit()
    assert sorted(deleted) == [runs[1].id, runs[2].id]
    assert ids(session) == [runs[3].id, runs[0].id]


def test_unreferenced_blobs_and_their_chunks_are_collected_after_the_grace(session, monkeypatch):
    monkeypatch.setattr(blobs, "CHUNK_BYTES", 1024)  # several chunks per module
    modules = [os.urandom(3000) for _ in range(3)]
    runs = [record(session, module) for module in modules]
    retention.prune_runs(session, keep=1, now=later(), grace=GRACE)
    session.commit()
    fresh = store_bytes(session, b"uploaded just now for a run not yet recorded")
    session.commit()
    gone = [hashlib.sha256(m).hexdigest() for m in modules[:2]]

    assert retention.collect_blobs(session, now=utcnow(), grace=GRACE).blobs == []  # every blob is younger than the grace
    dry = retention.collect_blobs(session, now=later(), grace=GRACE, dry_run=True)
    session.commit()
    assert sorted(dry.blobs) == sorted(gone + [fresh]) and dry.bytes == 6000 + len(b"uploaded just now for a run not yet recorded")
    assert blobs.read_blob(session, gone[0]) == modules[0]

    collected = retention.collect_blobs(session, now=later(), grace=GRACE)
    session.commit()
    assert sorted(collected.blobs) == sorted(gone + [fresh])
    assert session.scalar(select(func.count()).select_from(ArtifactChunk).where(ArtifactChunk.sha256.in_(gone))) == 0
    assert session.scalar(select(func.count()).select_from(ArtifactBlob).where(ArtifactBlob.sha256.in_(gone))) == 0
    kept = repository.get_run(session, runs[2].id)
    assert [blobs.read_blob(session, a.sha256) for a in kept.artifacts] == [CUDNN_FILE.read_bytes(), modules[2]]


def _orphan(session) -> bytes:
    """A stored JIT module whose only run was deleted: collectable after the grace."""
    module = os.urandom(2000)
    record(session, module)
    record(session, b"the newer run's module")
    retention.prune_runs(session, keep=1, now=later(), grace=GRACE)
    session.commit()
    return module


def test_a_recording_that_references_a_blob_again_keeps_it_from_the_collector(sessions, session):
    """The recording holds its blobs (a share lock on PostgreSQL, the write lock on SQLite)
    until it commits; the collector, run meanwhile, waits and then finds the blob referenced."""
    module = _orphan(session)
    sha = hashlib.sha256(module).hexdigest()
    result = {}
    with sessions() as recorder:
        run = publishing.record_run(recorder, run_create(recorder, module))  # not committed yet

        def collect():
            with sessions() as collector:
                result["collected"] = retention.collect_blobs(collector, now=later(), grace=GRACE).blobs
                collector.commit()

        thread = threading.Thread(target=collect)
        thread.start()
        time.sleep(0.5)  # the collector is waiting on the recording now
        recorder.commit()
        thread.join(30)
    assert not thread.is_alive()
    assert sha not in result["collected"]
    assert blobs.read_blob(session, sha) == module
    assert [a.sha256 for a in repository.get_run(session, run.id).artifacts][1] == sha


def test_a_recording_after_the_collector_deleted_its_blob_is_refused_naming_it(sessions, session):
    """The collector's deletion, not committed yet, holds the blob; the recording meanwhile
    waits and then fails cleanly (422 ``missing``: the uploader uploads it again)."""
    module = _orphan(session)
    sha = hashlib.sha256(module).hexdigest()
    outcome = {}
    with sessions() as collector:
        assert sha in retention.collect_blobs(collector, now=later(), grace=GRACE).blobs  # not committed yet

        def record_again():
            with sessions() as recorder:
                store_file(recorder, CUDNN_FILE)
                payload = run_payload(CUDNN_FILE)
                payload["artifacts"].append({"kind": "flashinfer_jit_module", "name": "module.tar.gz",
                                             "media_type": "application/gzip", "sha256": sha})
                try:
                    publishing.record_run(recorder, TuningRunCreate.model_validate(payload))
                    recorder.commit()
                    outcome["run"] = True
                except ArtifactsMissing as exc:
                    outcome["missing"] = exc.missing

        thread = threading.Thread(target=record_again)
        thread.start()
        time.sleep(0.5)
        collector.commit()
        thread.join(30)
    assert not thread.is_alive()
    assert outcome == {"missing": [sha]}
    assert blobs.blob_size(session, sha) is None


def _mirror(session, files: ArtifactFiles, data: bytes) -> str:
    sha = store_bytes(session, data)
    session.commit()
    assert files.mirror(session, sha) is not None
    return sha


def test_the_mirror_is_capped_least_recently_used_first_and_drops_deleted_blobs(session, tmp_path):
    files = ArtifactFiles(tmp_path / "mirror")
    shas = [_mirror(session, files, bytes([i]) * 1000) for i in range(5)]
    for age, sha in zip((500, 400, 300, 200, 100), shas):  # used 500 s ago ... 100 s ago
        path = files.path(sha)
        os.utime(path, (time.time() - age, path.stat().st_mtime))
    files.get(shas[0])  # served now: the most recently used

    trimmed = files.trim(max_bytes=3000, stored=lambda found: set(found))
    assert trimmed.files == 2 and trimmed.bytes == 2000
    assert [files.get(sha) is not None for sha in shas] == [True, False, False, True, True]
    assert files.size() == 3000

    # a blob the collector deleted (here or on another node) loses its file, whatever the cap
    trimmed = files.trim(max_bytes=10**9, stored=lambda found: set(found) - {shas[3]})
    assert trimmed.files == 1 and files.get(shas[3]) is None and files.get(shas[4]) is not None


def test_a_file_being_served_survives_its_eviction_and_a_miss_is_mirrored_again(session, tmp_path):
    files = ArtifactFiles(tmp_path / "mirror")
    data = os.urandom(5000)
    sha = _mirror(session, files, data)
    path = files.path(sha)
    with open(path, "rb") as served:
        first = served.read(100)
        os.utime(path, (time.time() - 3600, path.stat().st_mtime))  # last used an hour ago (the read marked it)
        files.trim(max_bytes=1, stored=lambda found: set(found))
        assert files.get(sha) is None
        assert first + served.read() == data  # an open file outlives its unlink (POSIX)
    assert files.mirror(session, sha).read_bytes() == data


def test_a_file_used_within_the_last_minute_is_not_evicted(session, tmp_path):
    """A download found the file and is about to open it: it stays, past the cap for a while."""
    files = ArtifactFiles(tmp_path / "mirror")
    sha = _mirror(session, files, b"x" * 1000)
    assert files.trim(max_bytes=1, stored=lambda found: set(found)).files == 0
    assert files.get(sha) is not None


def test_the_settings_say_how_much_is_kept(monkeypatch):
    from pydantic import ValidationError

    from tunecache.service.settings import Settings

    settings = Settings()
    assert settings.run_retention == 10 and settings.mirror_max_bytes == 10 * 1024**3
    assert settings.retention_grace_seconds == 3600 and settings.retention_interval_seconds == 3600
    monkeypatch.setenv("TUNECACHE_RUN_RETENTION", "off")
    assert Settings().run_retention is None
    monkeypatch.setenv("TUNECACHE_RUN_RETENTION", "3")
    monkeypatch.setenv("TUNECACHE_MIRROR_MAX_BYTES", str(2**20))
    assert Settings().run_retention == 3 and Settings().mirror_max_bytes == 2**20
    monkeypatch.setenv("TUNECACHE_RUN_RETENTION", "0")  # ambiguous (nothing but current and pinned? everything?)
    with pytest.raises(ValidationError, match="off"):
        Settings()


def _app(engine, tmp_path, **settings):
    from fastapi.testclient import TestClient

    from tests.support.builders import make_token
    from tunecache.service.app import create_app
    from tunecache.service.settings import Settings

    client = TestClient(create_app(Settings(database_url=str(engine.url), worker="off", data_dir=tmp_path / "data",
                                            **settings), engine=engine))
    client.headers["Authorization"] = f"Bearer {make_token(engine, 'test-admin', 'admin')}"
    return client


def _record_over_http(client, module: bytes) -> dict:
    from tests.support.builders import upload

    upload(client, CUDNN_FILE)
    sha = hashlib.sha256(module).hexdigest()
    assert client.put(f"/v1/artifacts/{sha}", content=module).status_code in (200, 201)
    payload = run_payload(CUDNN_FILE)
    payload["artifacts"].append({"kind": "flashinfer_jit_module", "name": "module.tar.gz",
                                 "media_type": "application/gzip", "sha256": sha})
    answer = client.post("/v1/tunings", json=payload)
    assert answer.status_code == 201, answer.text
    return answer.json()


def test_an_admin_pins_and_unpins_a_run_and_a_pinned_run_outlives_the_retention(app_client, engine, session):
    from tests.support.builders import make_token

    runs = [_record_over_http(app_client, b"module %d" % i) for i in range(3)]
    pushing = {"Authorization": f"Bearer {make_token(engine, 'pusher', 'push')}"}
    assert app_client.put(f"/v1/tunings/{runs[0]['id']}/pin", headers=pushing).status_code == 403
    assert app_client.put("/v1/tunings/999999/pin").status_code == 404
    pinned = app_client.put(f"/v1/tunings/{runs[0]['id']}/pin")
    assert pinned.status_code == 200 and pinned.json()["pinned"] is True
    assert app_client.get(f"/v1/tunings/{runs[0]['id']}").json()["pinned"] is True
    assert app_client.put(f"/v1/tunings/{runs[1]['id']}/pin").json()["pinned"] is True
    unpinned = app_client.delete(f"/v1/tunings/{runs[1]['id']}/pin")
    assert unpinned.status_code == 200 and unpinned.json()["pinned"] is False
    details = [event["detail"] for event in app_client.get("/v1/audit").json()["events"]]
    assert any(f"pinned run {runs[0]['id']}" in (d or "") for d in details), details

    assert retention.prune_runs(session, keep=1, now=later(), grace=GRACE) == [runs[1]["id"]]
    session.commit()
    history = app_client.get("/v1/tunings").json()
    assert [r["id"] for r in history["items"]] == [runs[2]["id"], runs[0]["id"]] and history["total"] == 2
    # the dashboard's pages read the history with a gap in it
    assert app_client.get(f"/runs/{runs[2]['id']}").status_code == 200
    assert app_client.get("/history").status_code == 200


def test_the_service_runs_the_retention_pass_by_itself(engine, tmp_path):
    # a grace of 3 s: a module uploaded is not collected before its run is recorded
    with _app(engine, tmp_path, run_retention=1, retention_grace_seconds=3, retention_interval_seconds=0.2,
              mirror_max_bytes=1) as client:
        runs = [_record_over_http(client, os.urandom(2000)) for _ in range(3)]
        old_module = runs[0]["artifacts"][1]["sha256"]
        assert client.get(f"/v1/artifacts/{old_module}").status_code == 200  # mirrored on this node
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            history = client.get("/v1/tunings").json()
            if history["total"] == 2 and client.head(f"/v1/artifacts/{old_module}").status_code == 404:
                break
            time.sleep(0.1)
        # the run current until the last one came is kept a while (a pod may be downloading it)
        assert [r["id"] for r in history["items"]] == [runs[2]["id"], runs[1]["id"]]
        assert client.head(f"/v1/artifacts/{old_module}").status_code == 404  # blob collected, its file removed
        assert client.get(f"/v1/artifacts/{runs[2]['artifacts'][1]['sha256']}").status_code == 200
        maintenance = client.app.state.tunecache.maintenance
        assert maintenance.last is not None


def test_the_run_current_until_just_now_is_kept_a_while_whatever_the_grace(session):
    """With --keep 1 and a grace of 0, a pass deleted the run a pod had just looked up: its
    download got 404 mid-boot. The run that was current until the pointer moved is kept for
    RECENTLY_REPLACED after it moved; the runs before it go."""
    first, looked_up, current = (record(session, b"module %d" % i) for i in range(3))
    now = utcnow()
    deleted = retention.prune_runs(session, keep=1, now=now, grace=dt.timedelta(0))
    session.commit()
    assert deleted == [first.id] and ids(session) == [current.id, looked_up.id]
    later_on = now + retention.RECENTLY_REPLACED + dt.timedelta(seconds=1)
    assert retention.prune_runs(session, keep=1, now=later_on, grace=dt.timedelta(0)) == [looked_up.id]


@pytest.mark.postgres
def test_one_pass_per_schema_at_a_time(postgres_schema_url, tmp_path):
    """On PostgreSQL the pass lock is the schema's: a second pass in the schema whose lock is
    held skips its database part; a pass in another schema of the same database does not wait
    (two deployments, or two test workers, sharing one database)."""
    from tests.conftest import POSTGRES_URL

    policy = retention.RetentionPolicy(keep=1, grace=dt.timedelta(0))
    holder_engine = db.create_db_engine(postgres_schema_url)
    db.upgrade(holder_engine)
    engines = [holder_engine]
    try:
        with holder_engine.connect() as holder:
            with holder.begin():
                assert retention._try_pass_lock(db.session_factory(holder_engine)(bind=holder))
                same = retention.run_pass(db.session_factory(holder_engine), None, policy)
                assert same.skipped == "another replica's retention pass is running"
                schema = f"tunecache_test_other_{os.getpid()}_{threading.get_ident() % 10_000}"
                admin = db.create_db_engine(POSTGRES_URL)
                engines.append(admin)
                with admin.begin() as connection:
                    connection.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
                try:
                    sep = "&" if "?" in POSTGRES_URL else "?"
                    elsewhere_engine = db.create_db_engine(f"{POSTGRES_URL}{sep}options=-csearch_path%3D{schema}")
                    engines.append(elsewhere_engine)
                    db.upgrade(elsewhere_engine)
                    elsewhere = retention.run_pass(db.session_factory(elsewhere_engine), None, policy)
                    assert elsewhere.skipped is None
                finally:
                    with admin.begin() as connection:
                        connection.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')
        after = retention.run_pass(db.session_factory(holder_engine), None, policy)  # the lock went with the transaction
        assert after.skipped is None
    finally:
        for engine in engines:
            engine.dispose()


