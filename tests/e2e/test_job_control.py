"""Job control from a new user's trial (issue 10): a config the GPU node can find, a second
request with other options named instead of silently joined, cancelling queued and running
jobs, GPU worker heartbeats, and `tune` saying whether it recorded its failure.

Storage and queue tests run on SQLite and the real PostgreSQL (the ``database_url``
fixtures); CLI tests against a live `tunecache serve`. The running-job cancel runs the real
worker loop and the real tuner child process (``run_tuner``), with stand-in ``torch`` and
``flashinfer`` packages at the GPU edge: the child finds a "GPU", emits its started event and
then hangs inside ``flashinfer.autotune`` (writing its pid first), so the cancel has a real,
long-running child to terminate.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import httpx
import pytest
from sqlalchemy import text

from tests.support.cli import tunecache, tunecache_executable
from tests.support.paths import CUDNN_FILE, LLAMA_CONFIG, QWEN3_CONFIG
from tests.support.builders import file_environment, h200_key, run_payload, store_file
from tests.support.torch_tests import cuda_available
from tunecache.contract import JobConflict, TuningJobCreate, TuningJobRead, TuningRunCreate, TuningRunQuery, WorkerList
from tunecache.service import db, jobs, publishing, repository
from tunecache.service.tuner.stages import TuneSpec
from tunecache.service.worker import GpuIdentity, JobWorker

H200 = GpuIdentity("NVIDIA H200", "sm90")
H100 = GpuIdentity("NVIDIA H100 80GB HBM3", "sm90")
MODEL = "meta-llama/Llama-3.1-8B"
LLAMA = json.loads(LLAMA_CONFIG.read_text())


@pytest.fixture
def sessions(engine):
    return db.session_factory(engine)


def wait_for(condition, timeout_s: float = 60.0, interval_s: float = 0.1):
    """Poll ``condition()`` until it returns something true; that value, or fail at the timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval_s)
    pytest.fail(f"condition not met within {timeout_s} s")


def retune(server: str, *extra: str, model: str = MODEL) -> subprocess.CompletedProcess:
    return tunecache("retune", "--server", server, "--model", model, "--max-num-batched-tokens", "8192",
                     "--gpu-name", "NVIDIA H200", *extra)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped by its new parent, does not)."""
    try:
        os.kill(pid, 0)
        state = open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()[0]
    except (ProcessLookupError, FileNotFoundError):
        return False
    return state != "Z"


# --------------------------------------------------------------------- the GPU edge

STANDIN_TORCH = '''
"""Stand-in torch for the tuner child: one "NVIDIA H200" (sm90)."""
class cuda:
    @staticmethod
    def is_available():
        return True

    @staticmethod
    def get_device_name(index=0):
        return "NVIDIA H200"

    @staticmethod
    def get_device_capability(index=0):
        return (9, 0)
'''

STANDIN_FLASHINFER = '''
"""Stand-in flashinfer for the tuner child: ``autotune`` writes this process's pid to
$STANDIN_PID_FILE, then hangs (STANDIN_FLASHINFER=hang) or raises a CUDA error (=fail)."""
import contextlib
import os
import time


@contextlib.contextmanager
def autotune(tune_mode=True, cache=None, **kwargs):
    path = os.environ["STANDIN_PID_FILE"]
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(path + ".tmp", path)
    if os.environ.get("STANDIN_FLASHINFER") == "fail":
        raise RuntimeError("CUDA error: an illegal memory access was encountered (stand-in)")
    time.sleep(3600)
    yield
'''

STANDIN_AUTOTUNER = '''
import json
import os


def _collect_metadata():
    return json.load(open(os.environ["STANDIN_METADATA_FILE"]))["_metadata"]
'''

STANDIN_FUSED_MOE_UTILS = '''
def get_hybrid_num_tokens_buckets(max_num_tokens):
    return [1, max_num_tokens]
'''


@pytest.fixture
def standin_gpu(tmp_path, monkeypatch):
    """``torch`` and ``flashinfer`` stand-ins first on the PYTHONPATH of every process this
    test starts (the tuner child inherits it). Returns the file the child writes its pid to;
    ``STANDIN_FLASHINFER`` is ``hang`` unless the test sets ``fail``."""
    root = tmp_path / "standin-gpu"
    files = {
        "torch/__init__.py": STANDIN_TORCH,
        "flashinfer/__init__.py": STANDIN_FLASHINFER,
        "flashinfer/autotuner.py": STANDIN_AUTOTUNER,
        "flashinfer/fused_moe/__init__.py": "",
        "flashinfer/fused_moe/utils.py": STANDIN_FUSED_MOE_UTILS,
    }
    for name, source in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(source))
    pid_file = tmp_path / "tuner-child.pid"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("STANDIN_PID_FILE", str(pid_file))
    monkeypatch.setenv("STANDIN_METADATA_FILE", str(CUDNN_FILE))
    monkeypatch.setenv("STANDIN_FLASHINFER", "hang")
    return pid_file


# ------------------------------------------------------------ 1. a config the node can find

def test_retune_needs_a_config_or_the_word_that_the_node_has_it(server, tmp_path):
    missing = retune(server)
    assert missing.returncode == 2, missing.stderr
    assert missing.stderr.strip().splitlines() == [
        f"tunecache: error: the GPU node needs the config.json of '{MODEL}': give --config FILE|DIR to send it with the job, "
        f"or --node-config if the node has it in its TUNECACHE_MODEL_CONFIG_DIR (<dir>/{MODEL}/config.json)"]
    both = retune(server, "--config", str(LLAMA_CONFIG), "--node-config")
    assert both.returncode == 2 and "give one" in both.stderr
    assert httpx.get(f"{server}/v1/tuning-jobs").json()["total"] == 0  # nothing was queued
    said = retune(server, "--node-config")
    assert said.returncode == 0, said.stderr
    assert said.stdout.startswith("job 1: queued")
    assert "--node-config" in tunecache("retune", "--help").stdout


# ------------------------------------------------------ 2. other options are named, not joined

def _enqueue(sessions, **request):
    with sessions.begin() as session:
        return jobs.enqueue(session, TuningJobCreate(key=h200_key(), **request))


def test_a_request_with_other_options_is_refused_naming_the_job_and_what_differs(sessions):
    first, created = _enqueue(sessions, hf_config=LLAMA, stages=["gemm", "attention"], gemm_backends=["cudnn", "cublaslt"])
    # the same options (config keys in another order, lists in another order): the same job
    reordered = dict(reversed(list(LLAMA.items())))
    same, created_again = _enqueue(sessions, hf_config=reordered, stages=["attention", "gemm"],
                                   gemm_backends=["cublaslt", "cudnn"])
    assert created and not created_again and same.id == first.id

    with pytest.raises(jobs.JobOptionsConflict) as stages:
        _enqueue(sessions, hf_config=LLAMA, stages=["gemm"], gemm_backends=["cudnn", "cublaslt"])
    conflict = stages.value.conflict
    assert (conflict.job_id, conflict.job_status) == (first.id, "queued")
    assert [d.model_dump() for d in conflict.differences] == [
        {"field": "stages", "active": ["attention", "gemm"], "requested": ["gemm"]}]
    assert "stages: job attention,gemm, yours gemm" in conflict.detail

    qwen = json.loads(QWEN3_CONFIG.read_text())
    with pytest.raises(jobs.JobOptionsConflict) as config:
        _enqueue(sessions, hf_config=qwen)
    fields = {d.field: d for d in config.value.conflict.differences}
    assert set(fields) == {"hf_config", "stages", "gemm_backends"}
    assert fields["hf_config"].active == jobs.config_digest(LLAMA) != fields["hf_config"].requested
    assert fields["hf_config"].requested.startswith("sha256:") and "hidden_size" not in config.value.conflict.detail
    with pytest.raises(jobs.JobOptionsConflict) as node_config:
        _enqueue(sessions, stages=["gemm", "attention"], gemm_backends=["cudnn", "cublaslt"])
    assert [(d.field, d.requested) for d in node_config.value.conflict.differences] == [("hf_config", None)]

    with sessions() as session:
        assert jobs.list_jobs(session).total == 1  # nothing queued by the refused requests
    with sessions.begin() as session:
        jobs.cancel(session, first.id)
    other, created_other = _enqueue(sessions, hf_config=LLAMA, stages=["gemm"])  # the key is free again
    assert created_other and other.id != first.id


def test_the_api_answers_409_with_the_job_and_the_differences(app_client):
    body = {"key": h200_key().model_dump(), "hf_config": LLAMA, "stages": ["gemm"]}
    first = app_client.post("/v1/tuning-jobs", json=body)
    assert first.status_code == 202
    assert app_client.post("/v1/tuning-jobs", json=body).json()["id"] == first.json()["id"]
    refused = app_client.post("/v1/tuning-jobs", json=body | {"stages": ["attention"], "gemm_backends": ["cudnn"]})
    assert refused.status_code == 409
    conflict = JobConflict.model_validate(refused.json())
    assert conflict.job_id == first.json()["id"] and conflict.job_status == "queued"
    assert {d.field: (d.active, d.requested) for d in conflict.differences} == {
        "stages": (["gemm"], ["attention"]), "gemm_backends": (None, ["cudnn"])}
    assert f"DELETE /v1/tuning-jobs/{conflict.job_id}" in conflict.detail
    events = app_client.get("/v1/audit").json()["events"]
    assert [e["detail"] for e in events] == [f"job {conflict.job_id} for {MODEL} (already queued)",
                                             f"job {conflict.job_id} for {MODEL} (queued)"]  # the 409 wrote nothing


def test_retune_with_other_options_prints_one_line_and_exits_15(server):
    assert retune(server, "--config", str(LLAMA_CONFIG), "--stages", "gemm").returncode == 0
    joined = retune(server, "--config", str(LLAMA_CONFIG), "--stages", "gemm")
    assert joined.returncode == 0 and joined.stdout.startswith("job 1: queued")
    refused = retune(server, "--config", str(LLAMA_CONFIG), "--stages", "gemm,attention")
    assert refused.returncode == 15, refused.stderr
    assert refused.stderr.strip().splitlines() == [
        "tunecache: error: job 1 is already queued for this key with other options (stages: job gemm, yours "
        "attention,gemm); wait for it, or cancel it (tunecache job cancel 1) and ask again"]
    assert httpx.get(f"{server}/v1/tuning-jobs").json()["total"] == 1


# ------------------------------------------------------------------------ 3. cancel

def test_cancelling_a_queued_job_frees_its_key_and_is_audited(app_client, engine):
    body = {"key": h200_key().model_dump(), "hf_config": LLAMA}
    job = app_client.post("/v1/tuning-jobs", json=body).json()
    cancelled = app_client.delete(f"/v1/tuning-jobs/{job['id']}")
    assert cancelled.status_code == 200
    read = TuningJobRead.model_validate(cancelled.json())
    assert read.status == "cancelled" and read.cancelled_by == "test-admin" and read.finished_at is not None
    again = app_client.delete(f"/v1/tuning-jobs/{job['id']}")
    assert again.status_code == 200 and again.json()["finished_at"] == cancelled.json()["finished_at"]
    listed = app_client.get("/v1/tuning-jobs", params={"status": "cancelled"}).json()
    assert [j["id"] for j in listed["items"]] == [job["id"]]
    # a cancelled job is not active: the key takes a new job, and no worker ever claims the old one
    new = app_client.post("/v1/tuning-jobs", json=body).json()
    assert new["id"] != job["id"] and new["status"] == "queued"
    with db.session_factory(engine).begin() as session:
        claimed = jobs.claim(session, "w", H200.gpu_name, H200.arch, lease_s=60)
    assert claimed.id == new["id"]

    missing = app_client.delete("/v1/tuning-jobs/999999")
    assert missing.status_code == 404 and missing.json()["detail"] == "no tuning job 999999"
    with db.session_factory(engine).begin() as session:
        jobs.finish(session, new["id"], "w", error="tuner process died with signal SIGSEGV")
    finished = app_client.delete(f"/v1/tuning-jobs/{new['id']}")
    assert finished.status_code == 409
    assert finished.json()["detail"] == f"job {new['id']} already failed; there is nothing to cancel"
    events = [(e["method"], e["path"], e["detail"]) for e in app_client.get("/v1/audit").json()["events"]]
    assert ("DELETE", f"/v1/tuning-jobs/{job['id']}", f"job {job['id']} for {MODEL}: cancelled") in events
    assert ("DELETE", f"/v1/tuning-jobs/{job['id']}", f"job {job['id']} for {MODEL}: cancelled, already") in events
    assert not [e for e in events if e[1] in (f"/v1/tuning-jobs/{new['id']}", "/v1/tuning-jobs/999999")]


def test_a_marked_job_whose_worker_died_is_settled_cancelled_never_reclaimed(sessions):
    job, _ = _enqueue(sessions, hf_config=LLAMA)
    with sessions.begin() as session:
        jobs.claim(session, "dies", H200.gpu_name, H200.arch, lease_s=0.3)
    with sessions.begin() as session:
        marked, changed = jobs.cancel(session, job.id, cancelled_by="ops")
    assert changed and marked.status == "running" and marked.cancel_requested_at is not None
    with sessions.begin() as session:
        assert jobs.cancel(session, job.id)[1] is False  # asking twice changes nothing
    time.sleep(0.5)  # the lease expires: the worker is gone
    with sessions.begin() as session:
        assert jobs.claim(session, "other", H200.gpu_name, H200.arch, lease_s=60) is None
    with sessions() as session:
        settled = jobs.get_job(session, job.id)
    assert settled.status == "cancelled" and settled.worker == "dies" and settled.run_id is None


def test_cancelling_a_running_job_terminates_the_tuner_child_and_records_no_run(app_client, engine, standin_gpu):
    sessions = db.session_factory(engine)
    with sessions() as session:
        store_file(session, CUDNN_FILE)
        previous = publishing.record_run(session, TuningRunCreate.model_validate(run_payload(CUDNN_FILE)))
        session.commit()
    job = app_client.post("/v1/tuning-jobs", json={"key": h200_key().model_dump(), "hf_config": LLAMA}).json()
    worker = JobWorker(sessions, H200, "gpu-node-1", poll_s=0.1, heartbeat_s=0.5)  # the real run_tuner
    worker.start()
    try:
        pid = int(wait_for(lambda: standin_gpu.is_file() and standin_gpu.read_text(), timeout_s=120))
        assert _alive(pid)  # the tuner child is in the middle of its tuning
        assert app_client.get(f"/v1/tuning-jobs/{job['id']}").json()["status"] == "running"
        asked = time.monotonic()
        answer = app_client.delete(f"/v1/tuning-jobs/{job['id']}")
        assert answer.status_code == 202
        assert answer.json()["status"] == "running" and answer.json()["cancel_requested_at"] is not None
        done = wait_for(lambda: (j := app_client.get(f"/v1/tuning-jobs/{job['id']}").json())["status"] != "running" and j,
                        timeout_s=30)
        took = time.monotonic() - asked
        wait_for(lambda: not _alive(pid), timeout_s=10)
    finally:
        worker.stop()
    assert done["status"] == "cancelled" and done["cancelled_by"] == "test-admin" and done["run_id"] is None
    assert done["error"] is None and took < 10  # SIGTERM ended it: no 5 s grace, no job timeout
    with sessions() as session:
        assert repository.list_runs(session, TuningRunQuery()).total == 1  # no run recorded
        current = repository.lookup(session, h200_key(), file_environment(CUDNN_FILE))
    assert current.id == previous.id  # the previous tuning stays current
    # a cancelled job frees its key
    assert app_client.post("/v1/tuning-jobs", json={"key": h200_key().model_dump(), "hf_config": LLAMA}).json()["id"] != job["id"]


# ------------------------------------------------- 4. a worker process that dies (issue 21)

#: A service's job worker in a process of its own (named ``<host>:<pid>`` as serve names it),
#: running one job with the real tuner child.
WORKER_PROCESS = """
import os, socket, sys
from pathlib import Path
from tunecache.service import db
from tunecache.service.worker import GpuIdentity, JobWorker
sessions = db.session_factory(db.create_db_engine(sys.argv[1]))
name = f"{socket.gethostname()}:{os.getpid()}"
JobWorker(sessions, GpuIdentity("NVIDIA H200", "sm90"), name, work_root=Path(sys.argv[2]), lease_s=60).run_once()
"""

#: A process that runs one tuner child (run_tuner) for the spec in argv[1], in work dir argv[2].
TUNER_PARENT = """
import sys
from pathlib import Path
from tunecache.service.tuner.process import run_tuner
from tunecache.service.tuner.stages import TuneSpec
run_tuner(TuneSpec.model_validate_json(Path(sys.argv[1]).read_text()), Path(sys.argv[2]), 600)
"""


def _pid_in(path):
    return path.is_file() and path.read_text() and int(path.read_text())


def test_a_worker_killed_mid_job_takes_its_tuner_with_it_and_its_job_is_taken_back_at_once(
        sessions, database_url, standin_gpu, tmp_path):
    job, _ = _enqueue(sessions, hf_config=LLAMA)
    work_root = tmp_path / "work"
    work_root.mkdir()
    worker = subprocess.Popen([sys.executable, "-c", WORKER_PROCESS, database_url, str(work_root)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    tuner = None
    try:
        tuner = wait_for(lambda: _pid_in(standin_gpu), timeout_s=120)  # the tuner child is tuning
        [work_dir] = list(work_root.glob("tunecache-job-*"))
        worker.kill()  # kill -9 of the service process mid-job
        worker.wait(timeout=10)
        wait_for(lambda: not _alive(tuner), timeout_s=15)  # the tuner died with it, not left on the GPU
    finally:
        if worker.poll() is None:
            worker.kill()
        if tuner and _alive(tuner):
            os.kill(tuner, signal.SIGKILL)
    with sessions() as session:
        assert jobs.get_job(session, job.id).status == "running"  # its lease has a minute to go
    from tests.support.jobs import stand_in_tuner

    # the service started again on this host takes the job back at its first claim, not in a minute
    again = JobWorker(sessions, H200, f"{socket.gethostname()}:{os.getpid()}", work_root=work_root,
                      tuner=stand_in_tuner())
    assert again.run_once()
    with sessions() as session:
        done = jobs.get_job(session, job.id)
    assert (done.status, done.attempts, done.worker) == ("succeeded", 2, again.name)
    assert not work_dir.exists()  # the dead worker's work directory is removed
    assert list(work_root.iterdir()) == []


def test_one_gpu_never_runs_two_tuners(standin_gpu, tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text(TuneSpec(deployment=h200_key().deployment(), hf_config=LLAMA).model_dump_json())
    parents, children = {}, {}
    try:
        for name in ("first", "second"):
            pid_file = tmp_path / f"{name}.pid"
            parents[name] = subprocess.Popen(
                [sys.executable, "-c", TUNER_PARENT, str(spec), str(tmp_path / name)],
                env={**os.environ, "STANDIN_PID_FILE": str(pid_file)}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if name == "first":
                children[name] = wait_for(lambda: _pid_in(pid_file), timeout_s=120)  # tuning, holding the GPU
        log = tmp_path / "second" / "tuner.log"
        said = wait_for(lambda: log.is_file() and "waiting for the GPU" in log.read_text() and log.read_text(),
                        timeout_s=120)
        assert f"another tuner (pid {children['first']}) holds" in said
        assert not (tmp_path / "second.pid").exists()  # it has not touched the GPU
        parents["first"].kill()  # the first one's service dies: its tuner goes with it, and the lock
        children["second"] = wait_for(lambda: _pid_in(tmp_path / "second.pid"), timeout_s=60)
        wait_for(lambda: not _alive(children["first"]), timeout_s=15)
    finally:
        for process in parents.values():
            if process.poll() is None:
                process.kill()
        for pid in children.values():
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_job_cancel_cli_and_retune_wait_on_a_cancelled_job(server, database_url):
    waiting = subprocess.Popen(
        [tunecache_executable(), "retune", "--server", server, "--model", MODEL, "--max-num-batched-tokens", "8192",
         "--gpu-name", "NVIDIA H200", "--node-config", "--wait", "--poll", "0.2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: httpx.get(f"{server}/v1/tuning-jobs").json()["total"] == 1, timeout_s=60)
        cancelled = tunecache("job", "cancel", "--server", server, "1")
        assert cancelled.returncode == 0, cancelled.stderr
        assert cancelled.stdout.strip() == "job 1: cancelled"
        out, err = waiting.communicate(timeout=60)
    finally:
        if waiting.poll() is None:
            waiting.kill()
    assert waiting.returncode == 16, err
    assert err.strip().splitlines()[-1] == ("tunecache: error: job 1 was cancelled by admin before it finished; "
                                            "the previous tuning stays current")
    assert tunecache("job", "cancel", "--server", server, "1").stdout.strip() == "job 1: cancelled"
    unknown = tunecache("job", "cancel", "--server", server, "77")
    assert unknown.returncode == 5 and "no tuning job 77" in unknown.stderr

    # a finished job cannot be cancelled: exit 15 naming its state
    assert retune(server, "--config", str(LLAMA_CONFIG)).stdout.startswith("job 2: queued")
    from tests.support.jobs import stand_in_tuner

    engine = db.create_db_engine(database_url)
    try:
        assert JobWorker(db.session_factory(engine), H200, "w", tuner=stand_in_tuner()).run_once()
    finally:
        engine.dispose()
    done = tunecache("job", "cancel", "--server", server, "2")
    assert done.returncode == 15
    assert done.stderr.strip() == "tunecache: error: job 2 already succeeded (run 1); there is nothing to cancel"
    anonymous = subprocess.run([tunecache_executable(), "job", "cancel", "--server", server, "2"], capture_output=True,
                               text=True, env={**os.environ, "TUNECACHE_TOKEN_FILE": "/nonexistent"})
    assert anonymous.returncode == 13


# ----------------------------------------------------------------- 4. worker heartbeats

def test_workers_beat_and_say_which_are_live(sessions, tmp_path):
    node = JobWorker(sessions, H200, "node-a:1", heartbeat_s=0.2, poll_s=0.1, model_config_dir=tmp_path)
    node.start()
    try:
        JobWorker(sessions, H100, "node-b:2", heartbeat_s=15).announce()
        with sessions() as session:
            first = jobs.list_workers(session)
        assert {w.name: (w.gpu_name, w.arch, w.live, w.model_config_dir, w.heartbeat_s) for w in first.items} == {
            "node-a:1": ("NVIDIA H200", "sm90", True, True, 0.2),
            "node-b:2": ("NVIDIA H100 80GB HBM3", "sm90", True, False, 15)}
        assert [w.last_seen for w in first.items] == sorted((w.last_seen for w in first.items), reverse=True)
        time.sleep(0.6)
        with sessions() as session:
            later = jobs.list_workers(session, gpu_name="NVIDIA H200", arch="sm90")
        [a] = later.items
        assert a.name == "node-a:1" and a.last_seen > next(w for w in first.items if w.name == "node-a:1").last_seen
        assert later.live_for("NVIDIA H200", "sm90") == [a] and later.live_for("NVIDIA H200", "sm100") == []
    finally:
        node.stop()
    with sessions() as session:
        [stopped] = jobs.list_workers(session, gpu_name="NVIDIA H200").items
    assert not stopped.live and stopped.stopped_at is not None
    with sessions.begin() as session:  # node-b's last heartbeat two minutes ago, then two days ago
        session.execute(text("UPDATE workers SET last_seen = :t WHERE name = 'node-b:2'"),
                        {"t": dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=120)})
    with sessions() as session:
        [b] = jobs.list_workers(session, gpu_name=H100.gpu_name).items
    assert not b.live and b.seen_s_ago >= 120
    with sessions.begin() as session:
        session.execute(text("UPDATE workers SET last_seen = :t WHERE name = 'node-b:2'"),
                        {"t": dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=2)})
    with sessions() as session:
        assert jobs.list_workers(session, gpu_name=H100.gpu_name).items == []


def test_get_workers_answers_the_heartbeats(app_client, engine):
    JobWorker(db.session_factory(engine), H200, "gpu-node-1:7", heartbeat_s=15).announce()
    answer = app_client.get("/v1/workers", params={"gpu_name": "NVIDIA H200", "arch": "sm90"}, headers={"Authorization": ""})
    assert answer.status_code == 200  # a read: open unless reads need a token
    listed = WorkerList.model_validate(answer.json())
    assert listed.live_window_s == 60 and [(w.name, w.live, w.model_config_dir) for w in listed.items] == [
        ("(hidden)", True, False)]  # its host's name: an admin's to see
    assert [w.name for w in WorkerList.model_validate(app_client.get("/v1/workers").json()).items] == ["gpu-node-1:7"]
    assert app_client.get("/v1/workers", params={"arch": "sm100"}).json()["items"] == []
    assert app_client.get("/v1/workers", params={"gpu_name": ""}).status_code == 422


def test_retune_says_when_no_worker_will_take_the_job_and_keeps_waiting(server):
    alone = retune(server, "--node-config", "--wait", "--wait-timeout", "1", "--poll", "0.2")
    assert alone.returncode == 10, alone.stderr  # it waited on to --wait-timeout
    lines = alone.stderr.strip().splitlines()
    said = ("tunecache: no GPU worker for NVIDIA H200 (sm90) has been seen in the last 60 s; the job stays queued")
    assert lines.count(said) == 1 and lines[-1] == "tunecache: error: job 1 still queued after 1 s"
    refused = retune(server, "--node-config", "--require-worker", model="org/other")
    assert refused.returncode == 17
    assert refused.stderr.strip() == ("tunecache: error: no GPU worker for NVIDIA H200 (sm90) has been seen in the last "
                                      "60 s; nothing was queued")
    assert httpx.get(f"{server}/v1/tuning-jobs").json()["total"] == 1


def test_retune_says_when_no_live_worker_has_the_model_config_dir(server, database_url):
    engine = db.create_db_engine(database_url)
    try:
        JobWorker(db.session_factory(engine), H200, "gpu-node-1", heartbeat_s=15).announce()  # no model config dir
        with_node_config = retune(server, "--node-config")
        with_config = retune(server, "--config", str(LLAMA_CONFIG), model="org/other")
        required = retune(server, "--config", str(LLAMA_CONFIG), "--require-worker", model="org/third")
    finally:
        engine.dispose()
    assert with_node_config.returncode == 0 and "no GPU worker" not in with_node_config.stderr
    assert with_node_config.stderr.strip() == (
        "tunecache: warning: no live GPU worker for NVIDIA H200 (sm90) has a model config directory "
        f"(TUNECACHE_MODEL_CONFIG_DIR): the job fails unless one with the config.json of '{MODEL}' takes it")
    assert with_config.returncode == 0 and with_config.stderr == ""
    assert required.returncode == 0 and required.stdout.startswith("job 3: queued")


# ------------------------------------------------ 5. `tune` says whether it recorded its failure

@pytest.mark.skipif(cuda_available(), reason="checks the no-GPU path")
def test_tune_without_cuda_says_no_run_was_recorded(engine, database_url):
    result = subprocess.run(
        [tunecache_executable(), "tune", "--model", MODEL, "--config", str(LLAMA_CONFIG), "--max-num-batched-tokens",
         "8192", "--database", database_url], capture_output=True, text=True, timeout=300)
    assert result.returncode == 8, result.stderr
    [said] = [line for line in result.stderr.splitlines() if line.startswith("tunecache: error:")]
    assert said == ("tunecache: error: RuntimeError: no CUDA device: this node cannot tune (it can still serve "
                     "lookups) (no run recorded: the tuner failed before it found its GPU, so there is no key to "
                     "file it under)")
    with db.session_factory(engine)() as session:
        assert repository.list_runs(session, TuningRunQuery()).total == 0
    assert "a failure is stored as a failed run" not in tunecache("tune", "--help").stdout


def test_tune_records_a_failure_after_the_tuner_found_its_gpu(engine, database_url, standin_gpu, monkeypatch):
    monkeypatch.setenv("STANDIN_FLASHINFER", "fail")
    result = subprocess.run(
        [tunecache_executable(), "tune", "--model", MODEL, "--config", str(LLAMA_CONFIG), "--max-num-batched-tokens",
         "8192", "--database", database_url], capture_output=True, text=True, timeout=300)
    assert result.returncode == 8, result.stderr
    [said] = [line for line in result.stderr.splitlines() if line.startswith("tunecache: error:")]
    assert said == (
        "tunecache: error: RuntimeError: CUDA error: an illegal memory access was encountered (stand-in) "
        "(recorded as failed run 1)")
    with db.session_factory(engine)() as session:
        [run] = repository.list_runs(session, TuningRunQuery()).items
    assert (run.id, run.status, run.trigger, run.is_current) == (1, "failed", "cli", False)
    assert run.key == h200_key() and "illegal memory access" in run.error
