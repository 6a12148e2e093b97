"""A bundle's OCI image layout (:mod:`tunecache.client.oci_bundle`): what ``tunecache export``
writes reads back as the same signed record, and a layout that lies (a link, other bytes, past
a bound) is refused whole before anything is sent."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os

import pytest

pytest.importorskip("oras", reason="the client's oci extra (oras-py) is not installed")

from oras.layout.layout import Layout  # noqa: E402

from tests.support.builders import run_payload, signed  # noqa: E402
from tests.support.paths import CUDNN_FILE  # noqa: E402
from tunecache.client import oci_bundle  # noqa: E402
from tunecache.client.oci_bundle import BadBundle, LayoutWriter, read_layout, run_record  # noqa: E402
from tunecache.contract import TuningRunRead  # noqa: E402
from tunecache.signing import generate_signing_key, load_signing_key  # noqa: E402

NOW = dt.datetime(2026, 12, 6, 3, 0, tzinfo=dt.timezone.utc)


@pytest.fixture
def stored_run(tmp_path) -> TuningRunRead:
    """A signed run as a service answers it (``GET /v1/tunings/{id}``)."""
    key = load_signing_key(generate_signing_key(tmp_path / "key").private_path)
    body = signed(run_payload(CUDNN_FILE), key)
    artifacts = [{**a, "size_bytes": CUDNN_FILE.stat().st_size, "download_path": f"/v1/artifacts/{a['sha256']}"}
                 for a in body["artifacts"]]
    return TuningRunRead.model_validate({
        **body, "id": 7, "environment_hash": "0" * 64, "status": "succeeded", "node": "gpu-node-1",
        "started_at": None, "finished_at": None, "duration_s": None, "error": None, "verified": True,
        "is_current": True, "created_at": NOW, "artifacts": artifacts})


@pytest.fixture
def layout(tmp_path, stored_run):
    root = tmp_path / "bundle"
    writer = LayoutWriter(root)
    written = writer.add_run(stored_run, lambda sha: CUDNN_FILE.read_bytes(), NOW)
    assert written == CUDNN_FILE.stat().st_size
    writer.finish()
    return root


def _artifact_blob(layout, stored_run):
    return layout / "blobs" / "sha256" / stored_run.artifacts[0].sha256


def test_a_written_bundle_is_an_oci_layout_and_reads_back_as_the_signed_record(layout, stored_run):
    assert Layout(str(layout)).validate()  # oras-py's own check of the layout
    [entry] = read_layout(layout)
    assert entry.record.source_run_id == 7 and entry.record.exported_at == NOW
    assert entry.record.run == run_record(stored_run)
    assert entry.record.run.signature == stored_run.signature
    assert entry.files[stored_run.artifacts[0].sha256].read_bytes() == CUDNN_FILE.read_bytes()
    assert read_layout(layout, "latest")[0].record == entry.record
    with pytest.raises(BadBundle, match="names no bundle tagged 'other'"):
        read_layout(layout, "other")


def test_a_bundle_is_written_only_into_a_new_directory(tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    with pytest.raises(BadBundle, match="exists and is not an empty directory"):
        LayoutWriter(tmp_path / "full")
    assert (tmp_path / "full" / "keep.txt").read_text() == "mine"


def test_an_artifact_that_is_a_link_is_refused(layout, stored_run, tmp_path):
    blob = _artifact_blob(layout, stored_run)
    (tmp_path / "elsewhere").write_bytes(blob.read_bytes())
    blob.unlink()
    blob.symlink_to(tmp_path / "elsewhere")  # even to the right bytes: a layout's files are its own
    with pytest.raises(BadBundle, match="a link is refused"):
        read_layout(layout)


def test_blobs_that_are_a_link_are_refused(layout, tmp_path):
    (layout / "blobs").rename(tmp_path / "blobs-elsewhere")
    (layout / "blobs").symlink_to(tmp_path / "blobs-elsewhere")
    with pytest.raises(BadBundle, match="blobs is not a directory"):
        read_layout(layout)


def test_other_bytes_under_an_artifacts_digest_are_refused(layout, stored_run):
    blob = _artifact_blob(layout, stored_run)
    data = bytearray(blob.read_bytes())
    data[10] ^= 1
    blob.write_bytes(bytes(data))
    with pytest.raises(BadBundle, match="hash to"):
        read_layout(layout)
    blob.write_bytes(bytes(data) + b" ")
    with pytest.raises(BadBundle, match="its descriptor says"):
        read_layout(layout)


def test_an_artifact_over_the_unpack_bound_is_refused_unread(layout, monkeypatch):
    monkeypatch.setenv("TUNECACHE_MAX_UNPACK_BYTES", "1000")
    with pytest.raises(BadBundle, match=r"over TUNECACHE_MAX_UNPACK_BYTES \(1,000\)"):
        read_layout(layout)


def test_bounds_on_files_runs_and_manifests(layout, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(oci_bundle, "MAX_LAYOUT_FILES", 3)  # the layout has 4: artifact, record, manifest, index
        with pytest.raises(BadBundle, match="holds over 3 blobs"):
            read_layout(layout)
    with monkeypatch.context() as m:
        m.setattr(oci_bundle, "MAX_BUNDLE_RUNS", 0)
        with pytest.raises(BadBundle, match="lists 1 runs; a bundle holds at most 0"):
            read_layout(layout)
    with monkeypatch.context() as m:
        m.setattr(oci_bundle, "MAX_MANIFEST_BYTES", 100)
        with pytest.raises(BadBundle, match="index.json is .* over the 100 a bundle allows"):
            read_layout(layout)


def test_a_record_that_is_not_a_run_is_refused(layout):
    """The record blob replaced, and every digest up to index.json made to match: the content
    itself is checked (as a :class:`TuningRunCreate`), not only its hashes."""
    blobs = layout / "blobs" / "sha256"
    index_entry = json.loads((layout / "index.json").read_text())["manifests"][0]
    index = json.loads((blobs / index_entry["digest"][7:]).read_bytes())
    manifest = json.loads((blobs / index["manifests"][0]["digest"][7:]).read_bytes())
    record = json.loads((blobs / manifest["config"]["digest"][7:]).read_bytes())
    record["run"]["key"]["max_num_batched_tokens"] = -1

    def put(document) -> dict:
        data = json.dumps(document).encode()
        sha = hashlib.sha256(data).hexdigest()
        (blobs / sha).write_bytes(data)
        return {"digest": f"sha256:{sha}", "size": len(data)}

    manifest["config"].update(put(record))
    index["manifests"][0].update(put(manifest))
    index_entry.update(put(index))
    (layout / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [index_entry]}))
    with pytest.raises(BadBundle, match=r"record: run\.key\.max_num_batched_tokens: "):
        read_layout(layout)
    assert os.path.exists(layout / "index.json")


def test_a_registry_that_cannot_be_reached_is_said_at_once(tmp_path):
    """oras-py retries a failed request five times over about two minutes; the commands ask
    once, and say in one line that the registry is unreachable (exit 4)."""
    import socket
    import time

    from tunecache.client.oci_registry import pull_layout
    from tunecache.store import ServerUnreachable

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(ServerUnreachable, match=rf"registry of 127.0.0.1:{port}/tunecache/runs:1 unreachable"):
        pull_layout(f"127.0.0.1:{port}/tunecache/runs:1", tmp_path / "layout", plain_http=True)
    assert time.monotonic() - started < 30  # not the retries' 3 + 5 + 11 + 29 + 83 seconds
    assert not (tmp_path / "layout").exists()
