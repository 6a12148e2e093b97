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
