"""The key's engine through the pod's commands, as processes (the key's engine itself:
tests/unit/client/test_key_engine.py)."""

from __future__ import annotations


def test_pod_commands_take_the_engine_and_name_an_unknown_one():
    from tests.support.cli import MODEL, tunecache
    from tests.support.paths import CUDNN_FILE

    key_options = ["--model", MODEL, "--max-num-batched-tokens", "8192", "--environment", str(CUDNN_FILE),
                   "--arch", "sm90", "--server", "http://127.0.0.1:9"]
    refused = tunecache("doctor", *key_options, "--engine", "sglang")
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        "tunecache: error: invalid key: engine: Input should be 'vllm'"], refused.stderr
    named = tunecache("doctor", *key_options, "--engine", "vllm")
    assert "  engine: vllm" in named.stdout.splitlines(), named.stdout
