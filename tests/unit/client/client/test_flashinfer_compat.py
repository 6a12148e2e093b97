"""tunecache's notion of a matching environment against FlashInfer's own loader (CPU).

Needs flashinfer-python (installed by .ci/run); on a CPU its environment reports
"unknown" for cuda/cublas/cudnn/gpu, so the H200 files must be rejected by both.
"""

from __future__ import annotations

import json

import pytest

from tests.support.paths import CUBLASLT_FILE, CUDNN_FILE
from tests.support.builders import file_environment, h200_key
from tests.support.torch_tests import IMPORTS_TORCH
from tunecache.client.environment import detect_environment
from tunecache.contract import ENVIRONMENT_FIELDS, differences

#: FlashInfer imports torch: these tests share one test process (``--dist loadgroup``).
pytestmark = IMPORTS_TORCH


@pytest.fixture
def autotuner():
    """FlashInfer's ``flashinfer.autotuner.autotuner`` module (not the package's function of that
    name), imported when a test asks: collecting this module does not import torch."""
    pytest.importorskip("flashinfer", reason="flashinfer-python is not installed")
    from flashinfer.autotuner import autotuner

    return autotuner


@pytest.fixture
def tuner(autotuner):
    instance = autotuner.AutoTuner.get()
    instance._file_configs.clear()
    return instance


def test_detected_environment_is_flashinfers_metadata(autotuner):
    detected = detect_environment()
    assert detected.model_dump() == {f: str(v) for f, v in autotuner._collect_metadata().items() if f in ENVIRONMENT_FIELDS}


@pytest.mark.parametrize("path", [CUDNN_FILE, CUBLASLT_FILE])
def test_mismatching_fields_are_the_ones_flashinfer_rejects(path, autotuner, tuner):
    stored = file_environment(path)
    local = detect_environment()
    ours = {d.field for d in differences(h200_key(), stored, h200_key(), local)}
    hard, soft = autotuner._classify_metadata_mismatches(json.loads(path.read_text())["_metadata"], autotuner._collect_metadata())
    assert ours == set(hard) | set(soft)
    assert ours  # a CPU is not an H200
    assert tuner.load_configs(str(path)) is False


def test_flashinfer_loads_every_entry_of_a_stored_file_when_the_environment_matches(tmp_path, tuner):
    # Stand in for "the same environment" with FlashInfer's own wildcard ("*" never mismatches).
    doc = json.loads(CUDNN_FILE.read_text())
    doc["_metadata"] = {k: "*" for k in doc["_metadata"]}
    path = tmp_path / "wildcard.json"
    path.write_text(json.dumps(doc))
    assert tuner.load_configs(str(path)) is True
    entries = {k for k in doc if not k.startswith("_")}
    assert set(tuner._file_configs) == entries and len(entries) == 42
