"""The operator's commands against a live `tunecache serve` (SQLite and PostgreSQL: the
``server`` fixture): ``status``, ``env``, ``job list/show/wait``, ``workers``, ``audit``,
``show RUN``, ``history --json``, ``completion``, the config file and the default server of a
local service. The commands run in process (:func:`tunecache.cli.run`, as the console script
runs them), the completion protocol through the installed console script."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading

import pytest
import yaml

from tests.support.cli import MODEL, tunecache_executable
from tests.support.jobs import H200, stand_in_tuner
from tests.support.paths import CUDNN_FILE, LLAMA_CONFIG, ROOT
from tests.support.serve import push_run, start_server, stop_server
from tunecache import cli
from tunecache.cli_kit import ExitCode
from tunecache.client.environment import environment_from_file
from tunecache.service import db
from tunecache.service.worker import JobWorker

NEW_COMMANDS = (["status"], ["env"], ["job", "list"], ["job", "show"], ["job", "wait"], ["workers"], ["audit"],
                ["show"], ["history"], ["completion"])


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exited:
        cli.run(list(args))
    out, err = capsys.readouterr()
    return exited.value.code, out, err


@pytest.mark.parametrize("command", NEW_COMMANDS, ids=" ".join)
def test_each_operator_command_answers_help(capsys, command):
    code, out, err = run_cli(capsys, *command, "--help")
    assert code == 0 and "Usage: tunecache " + " ".join(command) in " ".join(out.split()), err


def test_status_says_each_check_and_exits_by_the_first_failure(server, capsys, monkeypatch, tmp_path):
    code, out, err = run_cli(capsys, "status", "--server", server, "--environment", str(CUDNN_FILE))
    lines = dict(line.split(": ", 1) for line in out.splitlines())
    assert code == 0, out + err
    assert lines["server"] == f"{server} (from --server)"
    assert lines["reachable"].startswith("yes") and lines["health"].startswith("ok (database ")
    assert lines["server version"].startswith("tunecache-server ")
    assert lines["token"].startswith("'admin', scope admin (from the admin token of the tunecache serve")
    assert lines["environment"].startswith("flashinfer 0.7.4, cuda 13.0, gpu NVIDIA H200 (from ")
    assert lines["trusted keys"].startswith("none")
    # a token the service does not know: 13
    monkeypatch.setenv("TUNECACHE_TOKEN", "tc_0123456789abcdef_" + "x" * 32)
    code, out, _ = run_cli(capsys, "status", "--server", server, "--environment", str(CUDNN_FILE))
    assert code == ExitCode.NOT_AUTHORISED == 13 and "token: FAILED: TUNECACHE_TOKEN: the service does not know" in out
    monkeypatch.delenv("TUNECACHE_TOKEN")
    # trusted keys that cannot be read: 2, and the environment file that cannot: 7 (the first failure wins)
    monkeypatch.setenv("TUNECACHE_TRUSTED_KEYS", str(tmp_path / "missing.pub"))
    code, out, _ = run_cli(capsys, "status", "--server", server, "--environment", str(tmp_path / "nothing.json"))
    assert code == ExitCode.USAGE and "trusted keys: FAILED" in out and "environment: FAILED" in out
    monkeypatch.delenv("TUNECACHE_TRUSTED_KEYS")
    code, out, _ = run_cli(capsys, "status", "--server", server, "--environment", str(tmp_path / "nothing.json"))
    assert code == ExitCode.BAD_INPUT
    # nothing listening: 4, in about the --timeout
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    code, out, _ = run_cli(capsys, "status", "--server", closed, "--timeout", "2")
    assert code == ExitCode.SERVER_UNREACHABLE and "reachable: FAILED" in out


def test_the_config_file_gives_server_token_file_and_trusted_keys_and_flags_win(server, capsys, monkeypatch, tmp_path):
    config = tmp_path / "config" / "tunecache" / "config.toml"  # the tests' XDG_CONFIG_HOME
    config.parent.mkdir(parents=True)
    code, out, _ = run_cli(capsys, "keys", "generate", "--out", str(config.parent / "keys"))
    assert code == 0
    token = (tmp_path / "tunecache-data" / "admin.token").read_text().strip()
    (config.parent / "admin.token").write_text(token + "\n")
    config.write_text(f'server = "{server}"\ntoken_file = "admin.token"\ntrusted_keys = "keys/signing.pub"\n')
    code, out, err = run_cli(capsys, "status", "--environment", str(CUDNN_FILE))
    lines = dict(line.split(": ", 1) for line in out.splitlines())
    assert code == 0, out + err
    assert lines["config"] == f"{config} (server, token_file, trusted_keys)"
    assert lines["server"] == f"{server} (from server in {config})"
    assert lines["token"] == f"'admin', scope admin (from token_file in {config})"
    assert lines["trusted keys"].startswith("1 (") and lines["trusted keys"].endswith(f"from trusted_keys in {config}")
    # a variable wins over the file: another server, named as the source
    monkeypatch.setenv("TUNECACHE_URL", "http://127.0.0.1:9")
    code, out, _ = run_cli(capsys, "status", "--timeout", "1")
    assert code == ExitCode.SERVER_UNREACHABLE and "server: http://127.0.0.1:9 (from TUNECACHE_URL)" in out
    monkeypatch.delenv("TUNECACHE_URL")
    # a file that cannot be used: one line, exit 2, whatever the command
    config.write_text('server = "x"\nprofile = "prod"\n')
    code, out, err = run_cli(capsys, "workers")
    assert code == ExitCode.USAGE and err.splitlines() == [
        f"tunecache: error: config file {config}: unknown key 'profile' (known: server, token_file, trusted_keys)"]


def test_without_a_server_a_command_takes_the_local_service_only_once_it_proves_itself(capsys, engine, database_url,
                                                                                      tmp_path):
    process, url = start_server(database_url, tmp_path, "local")  # records where it listens; the token shared
    try:
        push_run(url)
        code, out, err = run_cli(capsys, "history", "--json")
        assert code == 0, err
        assert [run["id"] for run in json.loads(out)["items"]] == [1]
        code, out, _ = run_cli(capsys, "status", "--environment", str(CUDNN_FILE))
        assert code == 0 and f"server: {url} (from the tunecache serve on this machine (" in out
    finally:
        stop_server(process)
    # stopped: another program takes its port; it is never sent a token, and the command says why
    port = int(url.rsplit(":", 1)[1])
    received: list[bytes] = []
    listener = socket.create_server(("127.0.0.1", port))

    def answer():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                received.append(conn.recv(65536))
                conn.sendall(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")

    threading.Thread(target=answer, daemon=True).start()
    try:
        code, _, err = run_cli(capsys, "history")
    finally:
        listener.close()
    assert code == ExitCode.SERVER_UNREACHABLE, err
    assert err.splitlines() == [f"tunecache: error: no --server given, and the tunecache serve recorded in "
                                f"{tmp_path / 'tunecache-data' / 'admin.token'}.json does not answer at {url} as "
                                "itself (stopped?): start it, or give --server or TUNECACHE_URL"]
    assert received and not any(b"authorization" in r.lower() for r in received)  # asked for a proof only


def test_env_prints_the_environment_as_pods_and_the_example_configmap_read_it(capsys, tmp_path):
    code, out, err = run_cli(capsys, "env", "--json", "--environment", str(CUDNN_FILE))
    assert code == 0, err
    written = tmp_path / "environment.json"
    written.write_text(out)
    assert environment_from_file(written) == environment_from_file(CUDNN_FILE)  # what --environment FILE reads
    code, out, _ = run_cli(capsys, "env", "--configmap", "vllm-flashinfer-environment", "--environment", str(CUDNN_FILE))
    example = next(d for d in yaml.safe_load_all((ROOT / "deploy/kubernetes/examples/vllm-pod.yaml").read_text())
                   if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "vllm-flashinfer-environment")
    made = yaml.safe_load(out)
    assert code == 0 and made["kind"] == "ConfigMap" and made["metadata"]["name"] == "vllm-flashinfer-environment"
    assert json.loads(made["data"]["environment.json"]) == json.loads(example["data"]["environment.json"])
    code, _, err = run_cli(capsys, "env", "--configmap", "Not_A_Name", "--environment", str(CUDNN_FILE))
    assert code == ExitCode.USAGE and "is not a Kubernetes name" in err
    code, _, err = run_cli(capsys, "env", "--environment", str(tmp_path / "missing.json"))
    assert code == ExitCode.BAD_INPUT and len(err.splitlines()) == 1


def test_show_history_json_and_audit(server, capsys):
    run = push_run(server)
    code, out, err = run_cli(capsys, "show", str(run["id"]), "--server", server)
    assert code == 0, err
    assert f"run {run['id']}: succeeded" in out and "pinned: no" in out and "current: yes" in out
    assert "recorded: " in out and "by admin" in out and "signature: unsigned" in out
    assert "flashinfer_autotune_v1" in out and f"{CUDNN_FILE.stat().st_size / 1024:.1f} KiB" in out
    assert run_cli(capsys, "pin", str(run["id"]), "--server", server)[0] == 0
    code, out, _ = run_cli(capsys, "show", str(run["id"]), "--server", server, "--json")
    assert code == 0 and json.loads(out)["pinned"] is True
    code, out, _ = run_cli(capsys, "show", str(run["id"]), "--server", server)
    assert "pinned: yes" in out
    assert run_cli(capsys, "show", "999", "--server", server)[0] == ExitCode.SERVER_ERROR
    code, out, _ = run_cli(capsys, "history", "--server", server, "--json")
    page = json.loads(out)
    assert code == 0 and page["total"] == 1 and [r["id"] for r in page["items"]] == [run["id"]]
    assert run_cli(capsys, "history", "--server", server, "--json", "--csv")[0] == ExitCode.USAGE
    code, out, _ = run_cli(capsys, "audit", "--server", server)
    assert code == 0 and f"PUT /v1/tunings/{run['id']}/pin" in out and "POST /v1/tunings" in out
    code, out, _ = run_cli(capsys, "audit", "--server", server, "--json", "--limit", "1")
    assert code == 0 and len(json.loads(out)["events"]) == 1


def test_job_list_show_wait_and_workers(server, database_url, capsys):
    code, out, err = run_cli(capsys, "retune", "--server", server, "--model", MODEL, "--max-num-batched-tokens", "8192",
                             "--gpu-name", "NVIDIA H200", "--config", str(LLAMA_CONFIG))
    assert code == 0, err
    code, out, _ = run_cli(capsys, "job", "list", "--server", server)
    assert code == 0 and out.splitlines()[1].split()[:2] == ["1", "queued"]
    code, out, _ = run_cli(capsys, "job", "wait", "1", "--server", server, "--timeout", "0.3", "--poll", "0.1")
    assert code == ExitCode.WAIT_TIMEOUT and out == ""  # no progress on a pipe
    code, out, _ = run_cli(capsys, "workers", "--server", server)
    assert code == 0 and out == "no GPU job workers seen in the last day\n"
    engine = db.create_db_engine(database_url)
    worker = JobWorker(db.session_factory(engine), H200, "test-worker", tuner=stand_in_tuner(0.4), poll_s=0.1)
    worker.start()
    try:
        code, out, err = run_cli(capsys, "job", "wait", "1", "--server", server, "--poll", "0.1")
        assert code == 0, err
        assert out.startswith("job 1 succeeded in ") and out.rstrip().endswith("run 1")
        code, out, _ = run_cli(capsys, "workers", "--server", server)
        assert code == 0 and "test-worker" in out and "NVIDIA H200" in out and out.splitlines()[1].endswith("yes")
    finally:
        worker.stop()
        engine.dispose()
    code, out, _ = run_cli(capsys, "job", "show", "1", "--server", server)
    assert code == 0 and "job 1: succeeded" in out and "run: 1 (tunecache show 1)" in out and "  gemm 2/2 shape 2" in out
    code, out, _ = run_cli(capsys, "job", "list", "--server", server, "--status", "succeeded", "--json")
    assert code == 0 and [j["id"] for j in json.loads(out)["items"]] == [1]
    # a cancelled job: 16
    run_cli(capsys, "retune", "--server", server, "--model", "m/two", "--max-num-batched-tokens", "8",
            "--gpu-name", "NVIDIA H200", "--node-config")
    assert run_cli(capsys, "job", "cancel", "2", "--server", server)[0] == 0
    code, _, err = run_cli(capsys, "job", "wait", "2", "--server", server)
    assert code == ExitCode.JOB_CANCELLED and err.splitlines() == ["tunecache: error: job 2 cancelled by admin"]
    assert run_cli(capsys, "job", "show", "99", "--server", server)[0] == ExitCode.SERVER_ERROR


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_scripts_and_the_completion_they_ask_for(shell):
    script = subprocess.run([tunecache_executable(), "completion", shell], capture_output=True, text=True, timeout=60)
    assert script.returncode == 0 and f"_TUNECACHE_COMPLETE=complete_{shell}" in script.stdout
    env = {**os.environ, "_TUNECACHE_COMPLETE": f"complete_{shell}"}
    env |= ({"COMP_WORDS": "tunecache job w", "COMP_CWORD": "2"} if shell == "bash" else
            {"_TYPER_COMPLETE_ARGS": "tunecache job w"} | ({"_TYPER_COMPLETE_FISH_ACTION": "get-args"} if shell == "fish" else {}))
    answer = subprocess.run([tunecache_executable()], capture_output=True, text=True, timeout=60, env=env)
    assert answer.returncode == 0 and "wait" in answer.stdout and "cancel" not in answer.stdout, answer.stderr
