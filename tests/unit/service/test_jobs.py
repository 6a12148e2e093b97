"""The tuning-job queue and the GPU worker, on SQLite and the real PostgreSQL.

The worker's tuner is the GPU edge: most tests give it a stand-in that returns the real
H200 FlashInfer file as its result; the failing-job test uses the real child process,
which fails on this CPU-only machine ("no CUDA device").
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support.paths import CUDNN_FILE, LLAMA_CONFIG
from tests.support.builders import file_environment, h200_key
from tunecache.service import db, jobs, repository
from tunecache.contract import (
    TunerStarted,
    TuningJobCreate,
    TuningRunQuery,
)
from tunecache.service.tuner.process import TunerFailed
from tunecache.service.worker import GpuIdentity, JobWorker
from tests.support.jobs import enqueue, stand_in_tuner
from tests.support.torch_tests import cuda_available

H200 = GpuIdentity("NVIDIA H200", "sm90")


@pytest.fixture
def sessions(engine):
    return db.session_factory(engine)


def test_enqueue_is_single_flight_per_key(sessions):
    first, created = enqueue(sessions)
    again, created_again = enqueue(sessions)
    other, created_other = enqueue(sessions, max_num_batched_tokens=4096)
    assert created and not created_again and created_other
    assert again.id == first.id and other.id != first.id
    assert first.status == "queued" and first.attempts == 0


def test_two_workers_race_and_each_job_runs_once(sessions):
    queued = [enqueue(sessions, model=f"model-{i}")[0].id for i in range(12)]
    workers = [JobWorker(sessions, H200, f"worker-{n}", tuner=stand_in_tuner(0.05), lease_s=30) for n in "ab"]

    def drain(worker):
        done = []
        while True:
            with sessions() as session:
                before = {j.id for j in jobs.list_jobs(session, status="succeeded", limit=500).items}
            if not worker.run_once():
                return done
            with sessions() as session:
                after = {j.id for j in jobs.list_jobs(session, status="succeeded", limit=500).items}
            done.extend(after - before)

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(drain, workers))
    with sessions() as session:
        finished = [jobs.get_job(session, job_id) for job_id in queued]
        runs = repository.list_runs(session, TuningRunQuery(limit=500))
    assert [j.status for j in finished] == ["succeeded"] * 12
    assert all(j.attempts == 1 for j in finished)  # nobody claimed a job twice
    assert len({j.run_id for j in finished}) == 12 and runs.total == 12
    assert set(Counter(j.worker for j in finished)) <= {"worker-a", "worker-b"}


def test_concurrent_claims_never_hand_out_a_job_twice(sessions):
    for i in range(20):
        enqueue(sessions, model=f"m{i}")
    claimed: list[int] = []
    lock = threading.Lock()

    def claimer(name):
        while True:
            try:
                with sessions.begin() as session:
                    job = jobs.claim(session, name, H200.gpu_name, H200.arch, lease_s=60)
            except Exception:  # SQLite may report "database is locked" under contention: retry
                continue
            if job is None:
                with sessions() as session:
                    if jobs.list_jobs(session, status="queued").total == 0:
                        return
                continue
            with lock:
                claimed.append(job.id)

    threads = [threading.Thread(target=claimer, args=(f"w{n}",)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(claimed) == sorted(set(claimed)) and len(claimed) == 20


def test_worker_takes_only_jobs_its_gpu_can_serve(sessions):
    enqueue(sessions, gpu_name="NVIDIA H100 80GB HBM3")
    worker = JobWorker(sessions, H200, "h200-worker", tuner=stand_in_tuner())
    assert worker.run_once() is False
    h100 = JobWorker(sessions, GpuIdentity("NVIDIA H100 80GB HBM3", "sm90"), "h100-worker", tuner=stand_in_tuner())
    assert h100.run_once() is True


def test_expired_lease_requeues_and_the_dead_worker_loses_the_job(sessions):
    job, _ = enqueue(sessions)
    with sessions.begin() as session:
        first = jobs.claim(session, "dies", H200.gpu_name, H200.arch, lease_s=0.2)
    assert first.id == job.id and first.attempts == 1
    with sessions.begin() as session:
        assert jobs.claim(session, "other", H200.gpu_name, H200.arch, lease_s=60) is None  # lease still held
    time.sleep(0.4)
    with sessions.begin() as session:
        second = jobs.claim(session, "other", H200.gpu_name, H200.arch, lease_s=60)
    assert second.id == job.id and second.worker == "other" and second.attempts == 2
    with sessions.begin() as session:
        assert jobs.heartbeat(session, job.id, "dies", 60) is False
        assert jobs.finish(session, job.id, "dies", run_id=None) is False
        assert jobs.heartbeat(session, job.id, "other", 60, {"stage": "gemm", "step": 1, "total": 8}) is True
    with sessions.begin() as session:
        assert jobs.get_job(session, job.id).step == 1


def test_job_whose_workers_keep_dying_fails_after_max_attempts(sessions):
    job, _ = enqueue(sessions)
    for attempt in (1, 2):
        with sessions.begin() as session:
            assert jobs.claim(session, f"w{attempt}", H200.gpu_name, H200.arch, lease_s=0.05, max_attempts=2).attempts == attempt
        time.sleep(0.1)
    with sessions.begin() as session:
        assert jobs.claim(session, "w3", H200.gpu_name, H200.arch, lease_s=60, max_attempts=2) is None
    with sessions.begin() as session:
        failed = jobs.get_job(session, job.id)
    assert failed.status == "failed" and "lost the job 2 times" in failed.error
    again, created = enqueue(sessions)  # a failed job frees the key
    assert created and again.id != job.id


def test_succeeded_job_makes_its_run_current_with_progress_recorded(sessions):
    job, _ = enqueue(sessions)
    assert JobWorker(sessions, H200, "w", tuner=stand_in_tuner()).run_once()
    with sessions() as session:
        done = jobs.get_job(session, job.id)
        current = repository.lookup(session, h200_key(), file_environment(CUDNN_FILE))
    assert done.status == "succeeded" and done.run_id == current.id
    assert current.trigger == "http" and current.node == "w"
    assert "gemm 2/2 shape 2" in done.log_tail
    assert done.duration_s is not None and done.finished_at >= done.started_at


@pytest.mark.skipif(cuda_available(), reason="relies on the child failing without a GPU")
def test_failure_after_the_child_started_is_kept_in_history(sessions):
    def crashing(spec, work_dir, timeout_s, on_event, cancel=None):
        started = TunerStarted(gpu_name=H200.gpu_name, arch=H200.arch, environment=file_environment(CUDNN_FILE).model_dump())
        on_event(started)
        raise TunerFailed("tuner process died with signal SIGSEGV", "Segmentation fault", started)

    job, _ = enqueue(sessions)
    JobWorker(sessions, H200, "w", tuner=crashing).run_once()
    with sessions() as session:
        failed = jobs.get_job(session, job.id)
        run = repository.get_run(session, failed.run_id)
    assert failed.status == "failed" and failed.error == "tuner process died with signal SIGSEGV"
    assert run.status == "failed" and not run.is_current and "Segmentation fault" in run.error


NO_CONFIG_DIR = ("the job carries no model config (hf_config) for 'meta-llama/Llama-3.1-8B' and this node has no model "
                 "config directory (TUNECACHE_MODEL_CONFIG_DIR); send the model's config.json with the job")


def test_a_job_without_hf_config_fails_on_a_node_without_a_model_config_dir(app_client, engine, tmp_path, caplog):
    """The model name is never read as a path of the node; the job's public error says why in one line."""
    assert app_client.post("/v1/tuning-jobs", json={"key": h200_key().model_dump()}).status_code == 202
    assert JobWorker(db.session_factory(engine), H200, "w", tuner=stand_in_tuner()).run_once()
    listed = app_client.get("/v1/tuning-jobs")
    [job] = listed.json()["items"]
    assert job["status"] == "failed" and job["error"] == NO_CONFIG_DIR
    assert str(tmp_path) not in listed.text and "Errno" not in listed.text


def test_jobs_read_configs_only_from_the_model_config_dir_and_show_no_node_path(app_client, engine, tmp_path, caplog):
    config_dir = tmp_path / "model-configs"
    (config_dir / "meta-llama" / "Llama-3.1-8B").mkdir(parents=True)
    shutil.copy(LLAMA_CONFIG, config_dir / "meta-llama" / "Llama-3.1-8B" / "config.json")
    (tmp_path / "outside" / "x").mkdir(parents=True)
    shutil.copy(LLAMA_CONFIG, tmp_path / "outside" / "x" / "config.json")
    (config_dir / "org").mkdir()
    (config_dir / "org" / "linked").symlink_to(tmp_path / "outside" / "x")
    models = ["meta-llama/Llama-3.1-8B", "org/absent", "../outside/x", str(tmp_path / "outside" / "x"), "org/linked"]
    for model in models:
        assert app_client.post("/v1/tuning-jobs", json={"key": h200_key(model=model).model_dump()}).status_code == 202
    tuned = []
    tuner = stand_in_tuner()

    def recording_tuner(spec, work_dir, timeout_s, on_event, cancel=None):
        tuned.append((spec.deployment.model, spec.hf_config))
        return tuner(spec, work_dir, timeout_s, on_event, cancel)

    worker = JobWorker(db.session_factory(engine), H200, "w", tuner=recording_tuner, model_config_dir=config_dir)
    with caplog.at_level("WARNING", logger="tunecache.worker"):
        for _ in models:
            assert worker.run_once()
    assert tuned == [("meta-llama/Llama-3.1-8B", json.loads(LLAMA_CONFIG.read_text()))]
    listed = app_client.get("/v1/tuning-jobs", params={"limit": 10})
    errors = {job["key"]["model"]: (job["status"], job["error"]) for job in listed.json()["items"]}
    assert errors["meta-llama/Llama-3.1-8B"] == ("succeeded", None)
    assert errors["org/absent"] == ("failed", "model config for 'org/absent' not found in the node's model config directory")
    assert errors["org/linked"] == ("failed", "model config for 'org/linked' not found in the node's model config directory")
    for model in ("../outside/x", str(tmp_path / "outside" / "x")):
        assert errors[model][0] == "failed" and "cannot name a config in the node's model config directory" in errors[model][1]
    shown = "".join(error or "" for _, error in errors.values())
    assert str(config_dir) not in shown and "Errno" not in shown and "config.json'" not in shown
    # the why, with the node's paths, is in the node's log only
    assert f"{config_dir / 'org' / 'absent' / 'config.json'}" in caplog.text and "outside" in caplog.text


def test_a_variant_job_keeps_its_warmup_and_engine_args_and_another_variant_waits_its_turn(sessions):
    from tunecache.service.jobs import JobOptionsConflict

    request = TuningJobCreate(key=h200_key(), hf_config={"model_type": "llama"}, warmup="vllm",
                              engine_args={"max_model_len": 8192})
    with sessions.begin() as session:
        job, created = jobs.enqueue(session, request)
        joined, joined_created = jobs.enqueue(session, request)
    assert created and not joined_created and joined.id == job.id
    other = request.model_copy(update={"engine_args": {"max_model_len": 4096}})
    with pytest.raises(JobOptionsConflict) as conflict, sessions.begin() as session:
        jobs.enqueue(session, other)
    [difference] = conflict.value.conflict.differences
    assert difference.field == "engine_args" and str(difference) == (
        "engine_args: job {'max_model_len': 8192}, yours {'max_model_len': 4096}")
    seen = []
    tuner = stand_in_tuner()

    def recording(spec, work_dir, timeout_s, on_event, cancel=None):
        seen.append((spec.warmup, spec.engine_args))
        return tuner(spec, work_dir, timeout_s, on_event, cancel)

    assert JobWorker(sessions, H200, "w", tuner=recording).run_once()
    assert seen == [("vllm", {"max_model_len": 8192})]
    with sessions() as session:
        run = repository.get_run(session, jobs.get_job(session, job.id).run_id)
    assert run.summary["engine_args"] == {"max_model_len": 8192}


@pytest.mark.parametrize("fields, message", [
    ({"engine_args": {"max_model_len": 8192}}, "engine_args name an engine variant, which only warmup 'vllm' tunes"),
    ({"warmup": "vllm", "engine_args": {"max_num_batched_tokens": 1}},
     "engine_args.max_num_batched_tokens is not an allowed engine argument: the tuning key's or the vLLM warmup's"),
    ({"warmup": "vllm", "engine_args": {"not an identifier": 1}},
     "engine_args.not an identifier is not an allowed engine argument: not one tunecache knows"),
    ({"warmup": "vllm", "engine_args": {"cudagraph_capture_sizes": list(range(1, 129))}},
     "engine_args.cudagraph_capture_sizes's value is over 256 characters as JSON"),
])
def test_a_variant_job_is_refused_with_the_reason(fields, message):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=message):
        TuningJobCreate(key=h200_key(), **fields)


def test_a_job_stored_with_an_engine_argument_that_is_not_allowed_fails_naming_it_and_runs_nothing(sessions):
    """A job row from before the allow-list (or written past the API) holding an argument the
    contract refuses: the worker fails the job with the reason, its tuner never starts."""
    from sqlalchemy import update

    from tunecache.service.models import TuningJob

    with sessions.begin() as session:
        job, _ = jobs.enqueue(session, TuningJobCreate(key=h200_key(), hf_config={"model_type": "llama"}, warmup="vllm",
                                                       engine_args={"max_model_len": 8192}))
        options = session.get(TuningJob, job.id).options
        options = {**options, "engine_args": {"max_model_len": 8192, "worker_extension_cls": "evil.Extension"}}
        session.execute(update(TuningJob).where(TuningJob.id == job.id).values(options=options))
    started = []
    assert JobWorker(sessions, H200, "w", tuner=lambda *args, **kw: started.append(args)).run_once()
    with sessions() as session:
        failed = jobs.get_job(session, job.id)
    assert started == [] and failed.status == "failed", failed
    assert failed.error.startswith("engine_args.worker_extension_cls is not an allowed engine argument: "), failed.error


def test_a_vllm_warmup_job_is_verified_after_it_finished_and_the_verification_kept_with_its_run(sessions):
    from tunecache.contract import RunVerification

    verified = []

    def verify(spec, scratch):  # the GPU boot's edge: what tunecache.service.tuner.verification.verify_run returns
        verified.append((spec.warmup, spec.engine_args, scratch.name))
        return RunVerification(compiled={}, ready_s=20.5)

    with sessions.begin() as session:
        job, _ = jobs.enqueue(session, TuningJobCreate(key=h200_key(), hf_config={"model_type": "llama"}, warmup="vllm",
                                                       engine_args={"max_model_len": 8192}))
        stages_job, _ = jobs.enqueue(session, TuningJobCreate(key=h200_key(max_num_batched_tokens=1024),
                                                              hf_config={"model_type": "llama"}))
    worker = JobWorker(sessions, H200, "w", tuner=stand_in_tuner(), verify=verify)
    assert worker.run_once() and worker.run_once()
    assert verified == [("vllm", {"max_model_len": 8192}, "verification")]  # the stages job is not booted
    with sessions() as session:
        run = repository.get_run(session, jobs.get_job(session, job.id).run_id)
        done = jobs.get_job(session, job.id)
    assert done.status == "succeeded" and run.verification == RunVerification(compiled={}, ready_s=20.5)


def test_a_job_for_a_new_image_is_taken_only_by_a_worker_of_that_vllm(sessions):
    """An upgrade tuned before its first pod boots: retune --vllm-version 0.26.0 waits for a
    job worker whose image has that vLLM; a worker of the old image leaves it."""
    with sessions.begin() as session:
        job, _ = jobs.enqueue(session, TuningJobCreate(key=h200_key(), hf_config={"model_type": "llama"}, warmup="vllm",
                                                       vllm_version="0.26.0"))
    old, new = JobWorker(sessions, H200, "old", tuner=stand_in_tuner()), JobWorker(sessions, H200, "new",
                                                                                     tuner=stand_in_tuner())
    old.vllm_version, new.vllm_version = "0.25.0", "0.26.0"
    assert not old.run_once()
    assert new.run_once()
    with sessions() as session:
        done = jobs.get_job(session, job.id)
    assert (done.status, done.worker, done.vllm_version) == ("succeeded", "new", "0.26.0")
    new.announce()
    with sessions() as session:
        [worker] = jobs.list_workers(session).items
    assert worker.vllm_version == "0.26.0"
