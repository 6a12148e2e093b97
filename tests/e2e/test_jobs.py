"""The tuning-job queue against a live `tunecache serve`: concurrent posts make one job, and
`tunecache retune --wait` follows a job to its end (the in-process tests are in
tests/unit/service/test_jobs.py); a failing job with the real tuner child process."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.support.cli import tunecache
from tests.support.paths import CUDNN_FILE, LLAMA_CONFIG
from tests.support.serve import as_admin
from tests.support.builders import file_environment, h200_key, run_payload, store_file
from tests.support.jobs import H200, enqueue
from tunecache.service import db, jobs, publishing, repository
from tunecache.contract import TuningRunCreate
from tunecache.service.worker import JobWorker
from tests.support.jobs import stand_in_tuner


def test_fifty_concurrent_posts_make_one_job(server):
    body = {"key": h200_key().model_dump(), "hf_config": {"model_type": "llama", "hidden_size": 4096}}

    def post(_):
        return as_admin.post(f"{server}/v1/tuning-jobs", json=body, timeout=60)

    with ThreadPoolExecutor(16) as pool:
        responses = list(pool.map(post, range(50)))
    assert {r.status_code for r in responses} == {202}
    assert len({r.json()["id"] for r in responses}) == 1
    listed = httpx.get(f"{server}/v1/tuning-jobs").json()
    assert listed["total"] == 1 and listed["items"][0]["status"] == "queued"
    assert httpx.get(f"{server}/v1/tuning-jobs/999999").status_code == 404
    bad = as_admin.post(f"{server}/v1/tuning-jobs", json={"key": {"model": "m"}})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"][:2] == ["body", "key"]


def test_retune_wait_follows_the_job_to_its_end(server, database_url):
    engine = db.create_db_engine(database_url)
    worker = JobWorker(db.session_factory(engine), H200, "test-worker", tuner=stand_in_tuner(1.0), poll_s=0.2)
    worker.start()
    try:
        for _ in range(100):  # the worker's first heartbeat
            if httpx.get(f"{server}/v1/workers").json()["items"]:
                break
            time.sleep(0.1)
        result = tunecache("retune", "--server", server, "--model", "meta-llama/Llama-3.1-8B",
                           "--max-num-batched-tokens", "8192", "--gpu-name", "NVIDIA H200",
                           "--config", str(LLAMA_CONFIG), "--wait", "--poll", "0.2")
    finally:
        worker.stop()
        engine.dispose()
    assert result.returncode == 0, result.stderr
    assert "job 1: queued" in result.stdout and "succeeded" in result.stdout and "run 1 is current" in result.stdout
    assert "stage gemm" in result.stderr  # the progress lines (plain, no terminal here)
    assert "no GPU worker" not in result.stderr  # a live worker for the GPU beats


def test_retune_wait_timeout_exits_10(server):
    result = tunecache("retune", "--server", server, "--model", "m", "--max-num-batched-tokens", "8",
                       "--gpu-name", "NVIDIA H200", "--node-config", "--wait", "--wait-timeout", "0.5", "--poll", "0.2")
    assert result.returncode == 10 and "still queued" in result.stderr


@pytest.fixture
def sessions(engine):
    return db.session_factory(engine)


def test_failing_job_keeps_the_previous_tuning_current(sessions):
    with sessions() as session:
        store_file(session, CUDNN_FILE)
        good = publishing.record_run(session, TuningRunCreate.model_validate(run_payload(CUDNN_FILE)))
        session.commit()
    job, _ = enqueue(sessions)
    worker = JobWorker(sessions, H200, "w")  # the real tuner child: fails, no CUDA device here
    assert worker.run_once()
    with sessions() as session:
        failed = jobs.get_job(session, job.id)
        current = repository.lookup(session, h200_key(), file_environment(CUDNN_FILE))
    assert failed.status == "failed" and "no CUDA device" in failed.error
    assert current.id == good.id
