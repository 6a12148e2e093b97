"""The CLI against a live `tunecache serve` process, with the real H200 FlashInfer files."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from conftest import CUBLASLT_FILE, CUDNN_FILE, free_port, tunecache

MODEL = "meta-llama/Llama-3.1-8B"


def push(server, path=CUDNN_FILE, *extra):
    return tunecache("push", str(path), "--server", server, "--model", MODEL, "--max-num-batched-tokens", "8192", *extra)


def pull(server, dest, environment=CUDNN_FILE, *extra):
    return tunecache(
        "pull", "--server", server, "--model", MODEL, "--max-num-batched-tokens", "8192",
        "--dest", str(dest), "--environment", str(environment), *extra,
    )


def test_push_then_pull_installs_identical_file(server, tmp_path):
    pushed = push(server)
    assert pushed.returncode == 0, pushed.stderr
    assert "42 entries, current" in pushed.stdout

    pulled = pull(server, tmp_path / "dest")
    assert pulled.returncode == 0, pulled.stderr
    installed = Path(pulled.stdout.strip())
    assert installed.parent == tmp_path / "dest"
    assert installed.read_bytes() == CUDNN_FILE.read_bytes()
    original, copy = json.loads(CUDNN_FILE.read_text()), json.loads(installed.read_text())
    assert copy == original and len([k for k in copy if not k.startswith("_")]) == 42


def test_pull_with_metadata_json_environment(server, tmp_path):
    push(server, CUBLASLT_FILE)
    metadata = tmp_path / "env.json"
    metadata.write_text(json.dumps(json.loads(CUBLASLT_FILE.read_text())["_metadata"]))
    pulled = pull(server, tmp_path / "dest", metadata, "--file-name", "autotune.json")
    assert pulled.returncode == 0, pulled.stderr
    assert (tmp_path / "dest" / "autotune.json").read_bytes() == CUBLASLT_FILE.read_bytes()


def test_pull_miss_exits_3_naming_the_differing_field(server, tmp_path):
    push(server)
    other = tmp_path / "other-env.json"
    metadata = json.loads(CUDNN_FILE.read_text())["_metadata"] | {"cudnn_version": "91700"}
    other.write_text(json.dumps(metadata))
    pulled = pull(server, tmp_path / "dest", other)
    assert pulled.returncode == 3
    assert "cudnn_version: stored 91900, yours 91700" in pulled.stderr
    assert not (tmp_path / "dest").exists()


def test_pull_from_unreachable_server_exits_4(tmp_path):
    pulled = pull(f"http://127.0.0.1:{free_port()}", tmp_path / "dest")
    assert pulled.returncode == 4
    assert pulled.stderr.startswith("tunecache: error: tunecache server") and "unreachable" in pulled.stderr


def test_push_of_a_non_flashinfer_file_exits_7_and_stores_nothing(server, tmp_path):
    bogus = tmp_path / "bogus.json"
    bogus.write_text('{"not": "a cache"}')
    pushed = push(server, bogus)
    assert pushed.returncode == 7 and "no _metadata block" in pushed.stderr
    missing = push(server, tmp_path / "missing.json")
    assert missing.returncode == 7 and "cannot read" in missing.stderr
    assert httpx.get(f"{server}/v1/tunings").json()["total"] == 0


def test_usage_errors_exit_2(server, tmp_path):
    bad = tunecache("pull", "--server", server, "--model", MODEL, "--max-num-batched-tokens", "0", "--dest", str(tmp_path))
    assert bad.returncode == 2
    pushed = push(server, CUDNN_FILE, "--arch", "hopper")
    assert pushed.returncode == 2 and "arch" in pushed.stderr


def test_serve_refuses_a_postgres_database_without_schema(postgres_schema_url):
    result = tunecache("serve", "--port", str(free_port()), "--database", postgres_schema_url)
    assert result.returncode == 9
    assert "run `tunecache db upgrade" in result.stderr
