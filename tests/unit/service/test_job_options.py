"""A job's options as the contract's model (:class:`tunecache.contract.JobOptions`): what a job
keeps, and what its worker tunes with, unknown fields refused; on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from sqlalchemy import update

from tests.support.builders import h200_key
from tests.support.jobs import H200
from tunecache.contract import JobOptions, TuningJobCreate
from tunecache.service import db, jobs
from tunecache.service.models import TuningJob
from tunecache.service.worker import JobWorker


@pytest.fixture
def sessions(engine):
    return db.session_factory(engine)


def test_job_options_refuse_what_they_do_not_know_and_what_the_contract_refuses():
    with pytest.raises(ValidationError, match="gemm_backend\n  Extra inputs are not permitted"):
        JobOptions.model_validate({"gemm_backend": ["cudnn"]})
    with pytest.raises(ValidationError, match="'nope': not a FlashInfer GEMM backend"):
        JobOptions(gemm_backends=["nope"])
    with pytest.raises(ValidationError, match="engine_args name an engine variant, which only warmup 'vllm' tunes"):
        JobOptions(engine_args={"max_model_len": 8192})
    assert JobOptions.model_validate({"warmup": None}).warmup == "stages"  # a row from before the vLLM warmup


def test_a_job_keeps_its_options_as_the_model_gives_them(sessions):
    request = TuningJobCreate(key=h200_key(), hf_config={"model_type": "llama"}, gemm_backends=["cudnn"],
                              stages=["gemm"], warmup="vllm", engine_args={"max_model_len": 8192})
    with sessions.begin() as session:
        job, _ = jobs.enqueue(session, request)
        stored = session.get(TuningJob, job.id).options
    assert stored == {"gemm_backends": ["cudnn"], "stages": ["gemm"], "warmup": "vllm",
                      "engine_args": {"max_model_len": 8192}, "vllm_version": None}
    assert JobOptions.model_validate(stored) == request.options()


def test_a_job_stored_with_an_option_the_contract_does_not_know_fails_naming_it_and_runs_nothing(sessions):
    with sessions.begin() as session:
        job, _ = jobs.enqueue(session, TuningJobCreate(key=h200_key(), hf_config={"model_type": "llama"}))
        options = {**session.get(TuningJob, job.id).options, "skip_verification": True}
        session.execute(update(TuningJob).where(TuningJob.id == job.id).values(options=options))
    started = []
    assert JobWorker(sessions, H200, "w", tuner=lambda *args, **kw: started.append(args)).run_once()
    with sessions() as session:
        failed = jobs.get_job(session, job.id)
    assert started == [] and failed.status == "failed", failed
    assert failed.error == "skip_verification: Extra inputs are not permitted", failed.error
