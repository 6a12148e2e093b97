"""The tuner at the GPU edge, stood in: the job worker's tests give it this instead of the
child process."""

from __future__ import annotations

import hashlib
import shutil
import time

from tunecache.contract import ArtifactCreate, ArtifactKind, StageChanged, StageProgress, TuningJobCreate
from tunecache.service import jobs
from tunecache.service.tuner.process import TunerResult
from tunecache.service.worker import GpuIdentity

from tests.support.builders import file_environment, h200_key
from tests.support.paths import CUDNN_FILE

H200 = GpuIdentity("NVIDIA H200", "sm90")


def stand_in_tuner(delay_s: float = 0.0):
    """Returns the real H200 file as the tuning result, with progress events like the child's."""

    def tune(spec, work_dir, timeout_s, on_event, cancel=None):
        on_event(StageChanged(stage="gemm", status="running"))
        for step in (1, 2):
            time.sleep(delay_s / 2)
            on_event(StageProgress(stage="gemm", step=step, total=2, detail=f"shape {step}"))
        path = work_dir / "autotune.json"
        shutil.copy(CUDNN_FILE, path)
        artifact = ArtifactCreate(kind=ArtifactKind.FLASHINFER_AUTOTUNE, name="autotune.json", media_type="application/json",
                                  sha256=hashlib.sha256(path.read_bytes()).hexdigest())
        return TunerResult(gpu_name=H200.gpu_name, arch=H200.arch, environment=file_environment(CUDNN_FILE),
                           summary={"entries": 42, "tuning_seconds": delay_s, "stages": {}}, artifacts=[(artifact, path)])

    return tune


def enqueue(sessions, **key_fields):
    """Queue a job for the H200 key (``key_fields`` changed) as a POST /v1/jobs would."""
    with sessions.begin() as session:
        return jobs.enqueue(session, TuningJobCreate(key=h200_key(**key_fields), hf_config={"model_type": "llama", "hidden_size": 1}))
