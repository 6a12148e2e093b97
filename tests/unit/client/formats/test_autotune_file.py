"""What a recorded FlashInfer file must be: loadable by FlashInfer's own loader (the same
cases run through ``AutoTuner.load_configs`` of the FlashInfer installed here), and filed
under one environment (no ``"*"``)."""

from __future__ import annotations

import json

import pytest

from tests.support.paths import CUBLASLT_FILE, CUDNN_FILE
from tests.support.torch_tests import IMPORTS_TORCH
from tunecache.formats.autotune_file import NotAnAutotuneFile, check_loadable

BAD_ENTRIES = [
    ("garbage key", "x", "entry 'garbage key' is not [runner_class, tactic, ...]"),
    ("('bf16_gemm', 'R', ())", [], "is not [runner_class, tactic, ...]"),
    ("('bf16_gemm', 'R', ())", ["CudnnBf16GemmRunner"], "is not [runner_class, tactic, ...]"),
    ("('bf16_gemm', 'R', ())", [7, 0], "is not [runner_class, tactic, ...]"),
    ("('bf16_gemm', 'R', ())", None, "is not [runner_class, tactic, ...]"),
    ("('bf16_gemm', 'R', ())", ["CublasLtRunner", 3, 5], "profiling policy that is not a list"),
    ("_stray", "x", "entry '_stray' is not"),
]


def _with(path, key, value, metadata=None) -> bytes:
    doc = json.loads(path.read_text())
    doc[key] = value
    if metadata is not None:
        doc["_metadata"] = metadata
    return json.dumps(doc).encode()


@pytest.mark.parametrize("path", [CUDNN_FILE, CUBLASLT_FILE])
def test_real_files_are_loadable(path):
    assert check_loadable(path.read_bytes()).entries == 42


@IMPORTS_TORCH
@pytest.mark.parametrize("key, value, message", BAD_ENTRIES)
def test_an_entry_flashinfer_cannot_load_is_named_and_flashinfer_fails_on_it_too(tmp_path, key, value, message):
    with pytest.raises(NotAnAutotuneFile, match=message.replace("[", r"\[").replace("(", r"\(")):
        check_loadable(_with(CUDNN_FILE, key, value), "pushed.json")
    autotuner = pytest.importorskip("flashinfer.autotuner")
    wildcard = {k: "*" for k in json.loads(CUDNN_FILE.read_text())["_metadata"]}  # FlashInfer: any environment
    path = tmp_path / "bad.json"
    path.write_bytes(_with(CUDNN_FILE, key, value, wildcard))
    with pytest.raises((IndexError, TypeError, KeyError, AttributeError, ValueError)):
        autotuner.AutoTuner().load_configs(str(path))


@IMPORTS_TORCH
def test_flashinfer_loads_what_passes(tmp_path):
    autotuner = pytest.importorskip("flashinfer.autotuner")
    wildcard = {k: "*" for k in json.loads(CUDNN_FILE.read_text())["_metadata"]}
    path = tmp_path / "good.json"
    path.write_bytes(_with(CUDNN_FILE, "_generation", "abc", wildcard))
    assert autotuner.AutoTuner().load_configs(str(path)) is True
    check_loadable(_with(CUDNN_FILE, "_generation", "abc"))


def test_a_wildcard_environment_is_refused_with_the_field_named():
    metadata = dict(json.loads(CUDNN_FILE.read_text())["_metadata"], cudnn_version="*")
    with pytest.raises(NotAnAutotuneFile, match=r"_metadata.cudnn_version is the wildcard '\*'"):
        check_loadable(_with(CUDNN_FILE, "_generation", "abc", metadata))


def test_flashinfer_06_reads_every_key_but_metadata_as_an_entry():
    metadata = dict(json.loads(CUDNN_FILE.read_text())["_metadata"], flashinfer_version="0.6.13")
    with pytest.raises(NotAnAutotuneFile, match="entry '_generation'"):
        check_loadable(_with(CUDNN_FILE, "_generation", "abc", metadata))
