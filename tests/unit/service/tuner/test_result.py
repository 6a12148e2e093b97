"""The tuner child's result, parsed with a model where it reaches the parent
(:mod:`tunecache.service.tuner.result`): a result the model refuses is refused whole."""

from __future__ import annotations

import hashlib
import shutil

import pytest
from pydantic import ValidationError

from tests.support.paths import CUDNN_FILE
from tunecache.contract import ArtifactKind, EnvironmentMetadata
from tunecache.formats.autotune_file import parse_autotune_file
from tunecache.service.tuner.harvest import FlashInferFileHarvester, FlashInferJitHarvester
from tunecache.service.tuner.process import TunerResult
from tunecache.service.tuner.result import HarvestedArtifact, TunerSummary


def child_result(**changes) -> dict:
    """A result event's summary as the child writes it (``TunerSummary`` as JSON)."""
    environment = parse_autotune_file(CUDNN_FILE.read_bytes()).environment
    summary = TunerSummary(gpu_name="NVIDIA H200", arch="sm90", environment=environment, entries=3, tuning_seconds=1.5,
                           stages={"gemm": {"status": "done", "seconds": 1.0}}, jit_modules=["m"],
                           artifacts=[FlashInferFileHarvester().artifact("autotune.json"),
                                      FlashInferJitHarvester().module_artifact("m").description()])
    return {**summary.model_dump(mode="json", exclude_unset=True), **changes}


def test_the_parent_reads_the_childs_result_as_a_typed_result(tmp_path):
    shutil.copy(CUDNN_FILE, tmp_path / "autotune.json")
    (tmp_path / "jit").mkdir()
    (tmp_path / "jit" / "m.tar.gz").write_bytes(b"module")
    result = TunerResult.of(TunerSummary.model_validate(child_result()), tmp_path)
    assert isinstance(result.environment, EnvironmentMetadata) and (result.gpu_name, result.arch) == ("NVIDIA H200", "sm90")
    assert result.summary == {"entries": 3, "tuning_seconds": 1.5, "stages": {"gemm": {"status": "done", "seconds": 1.0}},
                              "jit_modules": ["m"]}  # only what the child set; no vllm_compile
    assert [(a.kind, a.name, a.sha256, path) for a, path in result.artifacts] == [
        (ArtifactKind.FLASHINFER_AUTOTUNE, "autotune.json", hashlib.sha256(CUDNN_FILE.read_bytes()).hexdigest(),
         tmp_path / "autotune.json"),
        (ArtifactKind.FLASHINFER_JIT_MODULE, "flashinfer-jit/m.tar.gz", hashlib.sha256(b"module").hexdigest(),
         tmp_path / "jit" / "m.tar.gz")]


@pytest.mark.parametrize("changes, refused", [
    ({"entries": "many"}, "entries"),
    ({"extra_field": 1}, "extra_field"),
    ({"artifacts": [{"kind": "flashinfer_autotune_v1", "name": "a", "media_type": "application/json",
                     "path": "../../etc/passwd"}]}, "not a path inside the tuner's output directory"),
    ({"artifacts": [{"kind": "flashinfer_autotune_v1", "name": "a", "media_type": "application/json",
                     "path": "/etc/passwd"}]}, "not a path inside the tuner's output directory"),
    ({"artifacts": [{"kind": "a_kind_nobody_knows", "name": "a", "media_type": "x", "path": "a"}]}, "kind"),
])
def test_a_result_the_model_refuses_is_refused_whole(changes, refused):
    with pytest.raises(ValidationError, match=refused):
        TunerSummary.model_validate(child_result(**changes))


def test_a_harvested_artifact_is_recorded_without_its_module():
    artifact = FlashInferJitHarvester().module_artifact("m")
    assert artifact.module == "m" and artifact.description().module is None
    assert HarvestedArtifact.model_validate(artifact.model_dump()) == artifact
