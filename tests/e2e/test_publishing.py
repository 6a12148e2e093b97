"""Safe publishing against a live `tunecache serve`, on SQLite and PostgreSQL: what cannot be
loaded, matched or trusted never becomes a fleet's current run. Each test is one row of the
publishing review (a case that was stored and made current before)."""

from __future__ import annotations

import hashlib
import json

from tests.support.builders import h200_key, run_payload
from tests.support.cli import push
from tests.support.paths import CUDNN_FILE
from tests.support.serve import as_admin


def _put(server, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    assert as_admin.put(f"{server}/v1/artifacts/{digest}", content=data).status_code in (200, 201)
    return digest


def _post_file(server, data: bytes):
    payload = run_payload(CUDNN_FILE, h200_key())
    payload["artifacts"][0]["sha256"] = _put(server, data)
    return as_admin.post(f"{server}/v1/tunings", json=payload)


def test_a_file_with_an_entry_flashinfer_cannot_load_is_refused_at_record(server, tmp_path):
    doc = json.loads(CUDNN_FILE.read_text())
    doc["garbage key"] = "x"  # FlashInfer's AutoTuner.load_configs raises IndexError on it in every pod
    answer = _post_file(server, json.dumps(doc).encode())
    assert answer.status_code == 422
    assert "entry 'garbage key' is not [runner_class, tactic, ...]" in answer.json()["detail"]
    bad = tmp_path / "garbage.json"
    bad.write_text(json.dumps(doc))
    pushed = push(server, bad)
    assert pushed.returncode == 7 and "entry 'garbage key'" in pushed.stderr, pushed.stderr
    assert as_admin.get(f"{server}/v1/tunings").json()["total"] == 0  # nothing stored, nothing current


def test_a_wildcard_environment_is_refused_naming_the_field(server, tmp_path):
    doc = json.loads(CUDNN_FILE.read_text())
    doc["_metadata"]["cuda_version"] = "*"
    answer = _post_file(server, json.dumps(doc).encode())
    assert answer.status_code == 422 and "_metadata.cuda_version is the wildcard '*'" in answer.json()["detail"]
    wildcard = tmp_path / "wildcard.json"
    wildcard.write_text(json.dumps(doc))
    pushed = push(server, wildcard)
    assert pushed.returncode == 7 and "_metadata.cuda_version is the wildcard" in pushed.stderr


def _h100_file(tmp_path):
    doc = json.loads(CUDNN_FILE.read_text())
    doc["_metadata"]["gpu"] = "NVIDIA H100 80GB HBM3"
    path = tmp_path / "h100.json"
    path.write_text(json.dumps(doc))
    return path


def test_keys_no_pod_could_ask_for_are_refused_with_the_field_named(server, tmp_path):
    pushed = push(server, _h100_file(tmp_path), "--gpu-name", "NVIDIA H200")
    assert pushed.returncode == 7, pushed.stderr
    assert "key.gpu_name 'NVIDIA H200' is not the GPU the file was tuned on (_metadata.gpu 'NVIDIA H100 80GB HBM3')" \
        in pushed.stderr
    for field, value, named in (("model", "   ", "model"), ("model", "meta-llama/Llama\t3", "control characters"),
                                ("model", " meta-llama/Llama-3.1-8B", "whitespace"),
                                ("dtype", "potato", "dtype 'potato' is not one of vLLM's --dtype choices"),
                                ("quantization", "fp9", "quantization 'fp9' is not one of vLLM's --quantization")):
        payload = run_payload(CUDNN_FILE, h200_key())
        payload["key"][field] = value
        _put(server, CUDNN_FILE.read_bytes())
        answer = as_admin.post(f"{server}/v1/tunings", json=payload)
        assert answer.status_code == 422 and named in answer.text, (field, value, answer.text)
    assert as_admin.get(f"{server}/v1/tunings").json()["total"] == 0


def test_jobs_no_tuner_could_run_are_refused_with_the_field_named(server):
    key = h200_key().model_dump()
    for body, named in (({"key": key, "gemm_backends": ["bogus"]}, "'bogus': not a FlashInfer GEMM backend"),
                        ({"key": key, "hf_config": json.loads(CUDNN_FILE.read_text())},
                         "is a FlashInfer autotune file (it has _metadata), not a model's config.json"),
                        ({"key": key, "hf_config": {"hidden_size": 4096}}, "neither model_type nor architectures"),
                        ({"key": {**key, "dtype": "potato"}, "hf_config": {"model_type": "llama"}}, "key.dtype 'potato'")):
        answer = as_admin.post(f"{server}/v1/tuning-jobs", json=body)
        assert answer.status_code == 422 and named in answer.text, (body.keys(), answer.text)
    assert as_admin.get(f"{server}/v1/tuning-jobs").json()["total"] == 0
