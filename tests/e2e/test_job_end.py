"""A job's run and the job's end are recorded together or not at all, on SQLite and the real
PostgreSQL: a job worker in a process of its own dies (``os._exit``, no clean-up, as under
``kill -9``) right after its tuning recorded the run and before the job was marked finished;
the service started again on the host takes the job back and the job ends with one run, not
a run of the dead worker's beside the one of its second tuning.

The tuner is the GPU edge, stood in (:func:`tests.support.jobs.stand_in_tuner`); the worker,
its claim, the recording and the database are the real ones.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.jobs import H200, enqueue, stand_in_tuner
from tunecache.contract import TuningRunQuery
from tunecache.service import db, jobs, repository
from tunecache.service.models import TuningJob
from tunecache.service.worker import JobWorker

REPO = Path(__file__).resolve().parents[2]

#: Exit status of the worker process that died between its run's record and its job's end.
DIED = 17

#: A service's job worker in a process of its own (named ``<host>:<pid>``, as ``serve`` names
#: it) that runs one job and dies as the job's end is about to be written: ``jobs.finish`` is
#: where a worker records the job succeeded with its run.
WORKER_PROCESS = f"""
import os, socket, sys
from pathlib import Path
from tunecache.service import db, jobs
from tunecache.service.worker import GpuIdentity, JobWorker
from tests.support.jobs import stand_in_tuner

finish = jobs.finish

def finish_then_die(session, job_id, worker, *, run_id=None, **rest):
    if run_id is not None:  # the run is recorded; the job's end is next
        os._exit({DIED})
    return finish(session, job_id, worker, run_id=run_id, **rest)

jobs.finish = finish_then_die
sessions = db.session_factory(db.create_db_engine(sys.argv[1]))
name = f"{{socket.gethostname()}}:{{os.getpid()}}"
JobWorker(sessions, GpuIdentity("NVIDIA H200", "sm90"), name, work_root=Path(sys.argv[2]), lease_s=60,
          tuner=stand_in_tuner()).run_once()
"""


@pytest.fixture
def sessions(engine):
    return db.session_factory(engine)


def test_a_worker_killed_between_its_run_and_its_jobs_end_leaves_one_run_for_the_job(
        sessions, database_url, tmp_path):
    job, _ = enqueue(sessions)
    work_root = tmp_path / "work"
    work_root.mkdir()
    died = subprocess.run([sys.executable, "-c", WORKER_PROCESS, database_url, str(work_root)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert died.returncode == DIED, died.stderr  # it got as far as the job's end, and died there
    with sessions() as session:
        left = session.get(TuningJob, job.id)
        assert (left.status, left.run_id, left.attempts) == ("running", None, 1)  # its lease has a minute to go
        recorded_by_the_dead = repository.list_runs(session, TuningRunQuery()).total

    # the service started again on this host takes the job back at its first claim and tunes it again
    again = JobWorker(sessions, H200, f"{socket.gethostname()}:{os.getpid()}", work_root=work_root,
                      tuner=stand_in_tuner())
    assert again.run_once()
    with sessions() as session:
        done = jobs.get_job(session, job.id)
        runs = repository.list_runs(session, TuningRunQuery())
    assert (done.status, done.attempts, done.worker) == ("succeeded", 2, again.name)
    assert recorded_by_the_dead == 0  # nothing of the dead worker's tuning was kept
    assert runs.total == 1 and [r.id for r in runs.items] == [done.run_id]  # the job's one run


def test_a_worker_that_lost_its_job_before_its_end_records_nothing(sessions):
    job, _ = enqueue(sessions)
    tune = stand_in_tuner()

    def tuned_while_another_worker_took_the_job(spec, work_dir, timeout_s, on_event, cancel=None):
        result = tune(spec, work_dir, timeout_s, on_event, cancel=cancel)
        with sessions.begin() as session:  # the lease expired and another worker claimed the job
            session.get(TuningJob, job.id).worker = "other"
        return result

    assert JobWorker(sessions, H200, "w", tuner=tuned_while_another_worker_took_the_job).run_once()
    with sessions() as session:
        left = jobs.get_job(session, job.id)
        runs = repository.list_runs(session, TuningRunQuery())
    assert (left.status, left.worker, left.run_id) == ("running", "other", None)  # the other worker's to end
    assert runs.total == 0  # the result of the worker that lost the job is dropped
