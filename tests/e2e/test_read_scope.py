"""Reads say no more than a fleet view needs, against a live ``tunecache serve`` (SQLite and
PostgreSQL): token names and the host names of pods, tuner nodes and job workers that runs,
jobs and reports carried are shown only to an ``admin`` token (or to everyone with
``TUNECACHE_READS_SHOW_IDENTITIES``), on every read route and dashboard page that shows such
rows; engine arguments are shown to every reader only as
:func:`tunecache.service.redaction.engine_args_for_readers` lets them through.

What the rows carry is sent as nodes, pods and admins send it: runs recorded with a ``tune``
and a ``push`` token, a pod's report, a job queued and cancelled through the API. The job is
claimed, and its worker heartbeats, by the job worker's own functions on the database (no
GPU here). Engine arguments that no door would take any more are written into the rows
directly, as rows stored before the doors checked them would hold them.
"""

from __future__ import annotations

import hashlib

import httpx
from sqlalchemy import update

from tests.support.builders import file_environment, h200_key, lookup_body, run_payload, stored_reports
from tests.support.paths import CUDNN_FILE
from tests.support.serve import admin_headers, as_admin, start_server, stop_server
from tunecache.service import db, jobs
from tunecache.service.models import PodReport, TuningJob, TuningRun, utcnow

TUNER_TOKEN, TUNER_NODE = "gpu-node-7", "tuner-host-7.internal"
POD_TOKEN, POD_RUN_NODE = "pods-east", "pod-host-a1"
REPORTING_POD = "pod-host-b2"
CANCELLING_ADMIN = "ops-alice"
WORKER = "gpu-host-9:4242"
#: What a reader below admin must not find anywhere in an answer.
IDENTITIES = (TUNER_TOKEN, "tuner-host-7", POD_TOKEN, POD_RUN_NODE, REPORTING_POD, CANCELLING_ADMIN, "gpu-host-9")

#: Engine arguments no reader is shown: an object (code to load on a node) and a long path.
FORGED_ARGS = {"max_model_len": 4096, "hf_overrides": {"auto_map": {"AutoConfig": "evil_module.Config"}},
               "download_dir": "/srv/" + "deep/" * 30 + "weights", "hf_token": "hf_forgedSecret"}
FORGED_MARKS = ("evil_module", "deep/deep/", "hf_forgedSecret")
#: The key's re-tune page (it lists the live workers of its GPU).
KEY_QUERY = "&".join(f"{k}={v}" for k, v in h200_key().model_dump().items())


def _token(server: str, name: str, scope: str) -> str:
    answer = as_admin.post(f"{server}/v1/tokens", json={"name": name, "scope": scope}, timeout=30)
    assert answer.status_code == 201, answer.text
    return answer.json()["token"]


def _seed(server: str, database_url: str) -> dict[str, int]:
    """Runs, a report and a job carrying every identity of :data:`IDENTITIES`."""
    tune = {"Authorization": f"Bearer {_token(server, TUNER_TOKEN, 'tune')}"}
    push = {"Authorization": f"Bearer {_token(server, POD_TOKEN, 'push')}"}
    canceller = {"Authorization": f"Bearer {_token(server, CANCELLING_ADMIN, 'admin')}"}
    data = CUDNN_FILE.read_bytes()
    assert httpx.put(f"{server}/v1/artifacts/{hashlib.sha256(data).hexdigest()}", content=data, headers=tune,
                     timeout=30).status_code in (200, 201)
    payload = run_payload(CUDNN_FILE, node=TUNER_NODE)
    payload["summary"]["engine_args"] = {"max_model_len": 4096}
    tuner_run = httpx.post(f"{server}/v1/tunings", json=payload, headers=tune, timeout=30)
    assert tuner_run.status_code == 201 and tuner_run.json()["is_current"], tuner_run.text
    pod_run = httpx.post(f"{server}/v1/tunings", json=run_payload(CUDNN_FILE, node=POD_RUN_NODE, trigger="pod"),
                         headers=push, timeout=30)
    assert pod_run.status_code == 201, pod_run.text

    report = {"key": h200_key().model_dump(), "environment_hash": file_environment(CUDNN_FILE).environment_hash(),
              "outcome": "installed", "run_id": tuner_run.json()["id"], "install_seconds": 0.5, "pod": REPORTING_POD,
              "source": "plugin", "boot_id": "boot-read-scope-1", "variant": "0123456789abcdef", "variant_missing": True,
              "engine_args": {"max_model_len": 4096}}
    assert httpx.post(f"{server}/v1/reports", json=report, timeout=30).status_code == 202
    stored_reports(database_url, 1)

    job = as_admin.post(f"{server}/v1/tuning-jobs", json={"key": h200_key().model_dump(), "hf_config": {"model_type": "llama"},
                                                          "warmup": "vllm", "engine_args": {"max_model_len": 4096}},
                        timeout=30)
    assert job.status_code == 202, job.text
    job_id = job.json()["id"]
    engine = db.create_db_engine(database_url)
    try:
        sessions = db.session_factory(engine)
        with sessions.begin() as session:  # the job worker's steps, on the database
            jobs.announce_worker(session, WORKER, "NVIDIA H200", "sm90", model_config_dir=False, heartbeat_s=5,
                                 started_at=utcnow())
            assert jobs.claim(session, WORKER, "NVIDIA H200", "sm90", lease_s=600).id == job_id
        with sessions.begin() as session:
            assert jobs.heartbeat(session, job_id, WORKER, 600, {"log_tail": f"INFO init on {WORKER} via tcp://10.0.0.9"})
        cancelled = httpx.delete(f"{server}/v1/tuning-jobs/{job_id}", headers=canceller, timeout=30)
        assert cancelled.status_code == 202, cancelled.text
        with sessions.begin() as session:  # rows stored before any door checked their engine arguments
            session.execute(update(PodReport).values(engine_args=FORGED_ARGS))
            session.execute(update(TuningJob).where(TuningJob.id == job_id).values(
                options={"warmup": "vllm", "engine_args": FORGED_ARGS}))
            run = session.get(TuningRun, tuner_run.json()["id"])
            run.summary = {**run.summary, "engine_args": FORGED_ARGS}
    finally:
        engine.dispose()
    return {"tuner_run": tuner_run.json()["id"], "pod_run": pod_run.json()["id"], "job": job_id}


def _reads(server: str, ids: dict[str, int], headers: dict[str, str]) -> dict[str, str]:
    """Every read route and dashboard page that shows runs, jobs, workers or reports: its text."""
    gets = ["/v1/fleet", "/v1/tunings", "/v1/tunings?format=csv", f"/v1/tunings/{ids['tuner_run']}",
            f"/v1/tunings/{ids['pod_run']}", "/v1/tuning-jobs", f"/v1/tuning-jobs/{ids['job']}", "/v1/workers",
            "/", "/history", "/reports", "/jobs", f"/runs/{ids['tuner_run']}", f"/runs/{ids['pod_run']}", f"/retune?{KEY_QUERY}"]
    texts = {}
    for path in gets:
        answer = httpx.get(f"{server}{path}", headers=headers, timeout=30)
        assert answer.status_code == 200, (path, answer.text)
        texts[path] = answer.text
    lookup = httpx.post(f"{server}/v1/tunings/lookup", json=lookup_body(), headers=headers, timeout=30)
    assert lookup.status_code == 200, lookup.text
    texts["POST /v1/tunings/lookup"] = lookup.text
    return texts


def _shown(texts: dict[str, str], marks) -> list[tuple[str, str]]:
    return [(where, mark) for where, text in texts.items() for mark in marks if mark in text]


def test_identities_are_shown_to_admins_only_and_engine_args_as_readers_may_see_them(server, database_url, tmp_path):
    ids = _seed(server, database_url)
    reader = {"Authorization": f"Bearer {_token(server, 'dashboard-reader', 'read')}"}

    for headers in ({}, reader):  # anonymous, and a read token
        texts = _reads(server, ids, headers)
        assert _shown(texts, IDENTITIES) == []
        assert _shown(texts, FORGED_MARKS) == []
        # what the rows are stays: the run, its variant's arguments, the job and its worker, the report
        run = httpx.get(f"{server}/v1/tunings/{ids['tuner_run']}", headers=headers).json()
        assert (run["node"], run["recorded_by"]) == ("(hidden)", "(hidden)")
        assert run["summary"]["engine_args"] == {"max_model_len": 4096}
        job = httpx.get(f"{server}/v1/tuning-jobs/{ids['job']}", headers=headers).json()
        assert (job["status"], job["worker"], job["cancelled_by"], job["log_tail"]) == ("running", "(hidden)", "(hidden)",
                                                                                        None)
        assert job["cancel_requested_at"] is not None and job["engine_args"] == {"max_model_len": 4096}
        assert [w["name"] for w in httpx.get(f"{server}/v1/workers", headers=headers).json()["items"]] == ["(hidden)"]
        variants = httpx.get(f"{server}/v1/fleet", headers=headers).json()["wanted_variants"]
        assert [v["engine_args"] for v in variants] == [{"max_model_len": 4096}]
        assert "4096" in texts["/v1/fleet"] and "(hidden)" in texts["/reports"]

    admin = _reads(server, ids, admin_headers())
    assert _shown(admin, FORGED_MARKS) == []  # engine arguments: the same for every reader
    run = httpx.get(f"{server}/v1/tunings/{ids['tuner_run']}", headers=admin_headers()).json()
    assert (run["node"], run["recorded_by"]) == (TUNER_NODE, TUNER_TOKEN)
    pod_run = httpx.get(f"{server}/v1/tunings/{ids['pod_run']}", headers=admin_headers()).json()
    assert (pod_run["node"], pod_run["recorded_by"]) == (POD_RUN_NODE, POD_TOKEN)
    job = httpx.get(f"{server}/v1/tuning-jobs/{ids['job']}", headers=admin_headers()).json()
    assert (job["worker"], job["cancelled_by"]) == (WORKER, CANCELLING_ADMIN) and WORKER in job["log_tail"]
    assert WORKER in admin["/v1/workers"] and REPORTING_POD in admin["/reports"]
    assert TUNER_NODE in admin["/history"] and TUNER_TOKEN in admin["/v1/tunings?format=csv"]
    assert WORKER in admin["/jobs"] and WORKER in admin[f"/retune?{KEY_QUERY}"]
    # a lookup is a pod's answer: alike for every caller, without identities
    assert _shown({"lookup": admin["POST /v1/tunings/lookup"]}, IDENTITIES) == []

    # the setting opens them to every reader (a second replica on the same database)
    process, open_server = start_server(database_url, tmp_path, "identities-open", TUNECACHE_READS_SHOW_IDENTITIES="1")
    try:
        texts = _reads(open_server, ids, {})
        assert _shown(texts, FORGED_MARKS) == []
        for where, mark in ((f"/v1/tunings/{ids['tuner_run']}", TUNER_NODE), ("/v1/tunings", POD_TOKEN),
                            (f"/v1/tuning-jobs/{ids['job']}", CANCELLING_ADMIN), ("/v1/workers", WORKER),
                            ("/reports", REPORTING_POD), ("/history", TUNER_TOKEN), ("/jobs", WORKER),
                            ("POST /v1/tunings/lookup", TUNER_NODE)):
            assert mark in texts[where], where
    finally:
        stop_server(process)
