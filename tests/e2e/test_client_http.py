"""The HTTP client against a live `tunecache serve`: streamed uploads, verified downloads."""

from __future__ import annotations

import hashlib

from tests.support.paths import CUDNN_FILE
from tests.support.serve import admin_token
from tunecache.store.http import TunecacheClient

# What this module tests is the client's HTTP: its server runs on SQLite only (tests/conftest.py).
SERVER_DATABASE_INCIDENTAL = True


def test_upload_file_streams_and_skips_what_is_stored(server, tmp_path):
    big = tmp_path / "module.tar.gz"
    big.write_bytes(hashlib.sha256(b"x").digest() * 200_000)  # 6.4 MB: two server chunks
    with TunecacheClient(server, token=admin_token()) as client:
        sha = client.upload_file(big)
        assert sha == hashlib.sha256(big.read_bytes()).hexdigest()
        assert client.download_artifact(sha) == big.read_bytes()
        assert client.upload_file(big) == sha  # HEAD says stored: nothing sent again
        assert client.upload_file(CUDNN_FILE) == client.upload_artifact(CUDNN_FILE.read_bytes()).sha256


def test_list_jobs_pages_the_services_jobs_newest_first(server):
    """``GET /v1/tuning-jobs`` through the HTTP store (:meth:`JobsClient.list_jobs`): the jobs
    queued, newest first, filtered by status."""
    from tunecache.contract import JobStatus, TuningJobCreate, TuningKey

    def job(model: str) -> TuningJobCreate:
        return TuningJobCreate(key=TuningKey(gpu_name="NVIDIA H200", arch="sm90", model=model,
                                             max_num_batched_tokens=8192))

    with TunecacheClient(server, token=admin_token()) as client:
        first, second = client.create_job(job("org/list-jobs-a")), client.create_job(job("org/list-jobs-b"))
        page = client.list_jobs(limit=500)
        ids = [j.id for j in page.items]
        assert ids.index(second.id) < ids.index(first.id)  # newest first
        queued = client.list_jobs(status=JobStatus.QUEUED, limit=500)
        assert {first.id, second.id} <= {j.id for j in queued.items}
        assert all(j.status is JobStatus.QUEUED for j in queued.items)
        assert not {first.id, second.id} & {j.id for j in client.list_jobs(status=JobStatus.SUCCEEDED).items}
        assert [j.id for j in client.list_jobs(limit=1).items] == ids[:1]
