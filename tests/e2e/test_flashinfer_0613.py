"""FlashInfer 0.6.13 (the version vLLM 0.25 pins) beside 0.7.4, with a file 0.6.13 wrote on
an H200 through tunecache's own tuner (tests/fixtures/flashinfer-0.6.13-h200/).

0.6.13's ``_collect_metadata()`` has no ``cutlass_dsl_version`` and its entries are
``[runner, tactic]``. FlashInfer compares only the fields its own ``_collect_metadata()``
returns, so such a file loads under 0.6.13 and never under 0.7.4: tunecache stores the
absent field as ``NOT_TRACKED``, finds the file for a 0.6.13 pod and names the difference
for a 0.7.4 one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.paths import CUDNN_FILE
from tests.support.cli import pull, push
from tunecache.contract import NOT_TRACKED, differences
from tunecache.formats.autotune_file import parse_autotune_file, read_entries
from tests.support.paths import FIXTURES

# What this module tests happens on the pod: its server runs on SQLite only (tests/conftest.py).
SERVER_DATABASE_INCIDENTAL = True

FIXTURE = FIXTURES / "flashinfer-0.6.13-h200" / "llama-3.1-8b-mm_bf16-cudnn.json"
METADATA = json.loads(FIXTURE.read_text())["_metadata"]


def test_a_0613_file_has_an_environment_without_cutlass_dsl():
    parsed = parse_autotune_file(FIXTURE.read_bytes())
    assert "cutlass_dsl_version" not in METADATA and parsed.entries == 48
    assert parsed.environment.cutlass_dsl_version == NOT_TRACKED
    assert parsed.environment.flashinfer_version == "0.6.13" and parsed.environment.indeterminate_fields() == []
    entries = read_entries(FIXTURE.read_bytes(), "0.6.13 file")
    assert len(entries) == 48 and {len(json.loads(FIXTURE.read_text())[k]) for k in json.loads(FIXTURE.read_text())
                                   if not k.startswith("_")} == {2}


def test_flashinfers_own_rule_agrees_with_tunecaches(tmp_path):
    """FlashInfer's metadata check (0.7.4's ``_classify_metadata_mismatches``; 0.6.13's
    ``load_configs`` loops over its current fields the same way) against a 0.6.13 pod and a
    0.7.4 pod: tunecache's differences name exactly the fields FlashInfer rejects."""
    autotuner = pytest.importorskip("flashinfer.autotuner.autotuner", reason="flashinfer-python is not installed")
    stored = parse_autotune_file(FIXTURE.read_bytes()).environment
    pod_0613 = stored  # a 0.6.13 pod on the same machine reports the same six fields
    pod_074 = parse_autotune_file(CUDNN_FILE.read_bytes()).environment
    for pod, current in ((pod_0613, METADATA), (pod_074, json.loads(CUDNN_FILE.read_text())["_metadata"])):
        hard, soft = autotuner._classify_metadata_mismatches(METADATA, current)
        ours = {d.field for d in differences(_key(), stored, _key(), pod)}
        assert ours == set(hard) | set(soft)
    assert ours == {"flashinfer_version", "cutlass_dsl_version"}


def _key():
    from tests.support.builders import h200_key

    return h200_key()


def test_a_0613_file_is_stored_and_installed_for_a_0613_pod_only(server, tmp_path):
    pushed = push(server, FIXTURE, "--max-num-batched-tokens", "1024")
    assert pushed.returncode == 0, pushed.stderr
    pod_0613 = tmp_path / "env-0613.json"
    pod_0613.write_text(json.dumps(METADATA))  # what 0.6.13's _collect_metadata() returns: six fields
    pulled = pull(server, tmp_path / "a", pod_0613, "--max-num-batched-tokens", "1024")
    assert pulled.returncode == 0, pulled.stderr
    assert Path(pulled.stdout.strip()).read_bytes() == FIXTURE.read_bytes()
    other = pull(server, tmp_path / "b", CUDNN_FILE, "--max-num-batched-tokens", "1024")  # a 0.7.4 pod
    assert other.returncode == 3
    assert "flashinfer_version: stored 0.6.13, yours 0.7.4" in other.stderr
    assert f"cutlass_dsl_version: stored {NOT_TRACKED}, yours" in other.stderr
