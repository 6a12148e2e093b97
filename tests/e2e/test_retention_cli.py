"""Retention through its commands and a server (`tunecache prune` as a process, an uploader
against `tunecache serve`); the retention pass itself is tested in process in
tests/unit/service/test_retention.py, whose records and fixtures these use."""

from __future__ import annotations

import datetime as dt
import hashlib
import os

from sqlalchemy import select

from tests.support.builders import run_payload
from tests.support.paths import CUDNN_FILE
from tests.unit.service.test_retention import GRACE, ids, later, record, session, sessions, store_bytes  # noqa: F401, F811 - fixtures
from tunecache.contract import TuningRunCreate
from tunecache.service import blobs, db, repository, retention
from tunecache.service.models import ArtifactBlob


def test_tunecache_prune_says_what_it_would_delete_then_deletes_it(engine, session, monkeypatch, tmp_path):
    from tests.support.cli import tunecache

    runs = [record(session, b"module %d" % i) for i in range(4)]
    monkeypatch.setenv("TUNECACHE_RETENTION_GRACE_SECONDS", "0")
    monkeypatch.setenv("TUNECACHE_RUN_RETENTION", "2")
    url = engine.url.render_as_string(hide_password=False)

    dry = tunecache("prune", "--database", url, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "would delete 2 runs" in dry.stdout, dry.stdout
    assert len(ids(session)) == 4

    done = tunecache("prune", "--database", url)
    assert done.returncode == 0, done.stderr
    assert "deleted 2 runs, 2 blobs" in done.stdout, done.stdout  # their modules, with no grace
    session.rollback()
    assert ids(session) == [runs[3].id, runs[2].id]
    again = tunecache("prune", "--database", url, "--keep", "off")
    assert again.returncode == 0 and "deleted 0 runs, 0 blobs" in again.stdout, again.stdout
    zero = tunecache("prune", "--database", url, "--keep", "0")  # one line naming the flag (exit 2)
    assert zero.returncode == 2 and zero.stderr.splitlines() == [
        "tunecache: error: invalid --keep: 0 would keep only the current and pinned runs: say off to keep every run, "
        "or at least 1"], zero.stderr


def test_an_uploader_whose_bytes_were_collected_meanwhile_uploads_them_again(server, database_url, tmp_path):
    """A node's mirror still answers HEAD for bytes another node's pass deleted: the upload
    is skipped, the record answers 422 ``missing``, and the uploader uploads those bytes
    again and records once more (what a tuner node does: TunerResult.record)."""
    import httpx

    from tunecache.cli.client import client_for
    from tunecache.store import record_uploaded

    module = tmp_path / "module.tar.gz"
    module.write_bytes(os.urandom(3000))
    client = client_for(server)
    sha = client.upload_file(module)
    assert httpx.get(f"{server}/v1/artifacts/{sha}").status_code == 200  # a pod downloaded it: mirrored here
    engine = db.create_db_engine(database_url)
    with db.session_factory(engine).begin() as session:  # another node's pass: no run refers to it
        assert sha in retention.collect_blobs(session, now=later(), grace=GRACE).blobs
    assert httpx.head(f"{server}/v1/artifacts/{sha}").status_code == 200  # this node's file, until its own pass

    payload = run_payload(CUDNN_FILE)
    payload["artifacts"].append({"kind": "flashinfer_jit_module", "name": "module.tar.gz",
                                 "media_type": "application/gzip", "sha256": sha})
    run = record_uploaded(client, TuningRunCreate.model_validate(payload), [CUDNN_FILE, module])
    assert [a.sha256 for a in run.artifacts][1] == sha
    with db.session_factory(engine).begin() as session:
        assert blobs.read_blob(session, sha) == module.read_bytes()
    engine.dispose()
    client.close()


def test_a_dry_run_that_would_delete_fewer_blobs_than_exist_says_why_each_is_kept(engine, session, monkeypatch):
    """``prune --dry-run`` said "0 blobs" and no more while a refused upload stayed in the
    database (issue 39, Why 8): it now counts the blobs it keeps by reason."""
    from tests.support.cli import tunecache

    pinned = record(session, b"module of the pinned run")
    record(session, b"module of the current run")
    repository.pin_run(session, pinned.id, True)
    session.commit()
    orphan = b"uploaded, never recorded"
    store_bytes(session, orphan)
    session.commit()
    uploaded_at = session.scalar(select(ArtifactBlob.created_at).where(
        ArtifactBlob.sha256 == hashlib.sha256(orphan).hexdigest()))
    monkeypatch.setenv("TUNECACHE_RETENTION_GRACE_SECONDS", "3600")
    url = engine.url.render_as_string(hide_password=False)

    dry = tunecache("prune", "--database", url, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    deletable = (uploaded_at + dt.timedelta(hours=1)).astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    assert dry.stdout.splitlines()[1:] == [
        # the FlashInfer file (both runs') and the pinned run's module; the current run's module; the upload
        f"4 blobs kept: 1 referenced by runs, 1 unreferenced within the grace of 1 h (the youngest deletable "
        f"from {deletable}), 2 referenced by pinned runs"], dry.stdout
    assert "0 blobs" in dry.stdout.splitlines()[0]

    monkeypatch.setenv("TUNECACHE_RETENTION_GRACE_SECONDS", "0")
    clean = tunecache("prune", "--database", url, "--dry-run")  # the upload would go: 3 of 4 kept
    assert clean.stdout.splitlines()[1:] == [
        "3 blobs kept: 1 referenced by runs, 0 unreferenced within the grace of 0 h, 2 referenced by pinned runs"], \
        clean.stdout
