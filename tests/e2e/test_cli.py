"""The CLI against a live `tunecache serve` process, with the real H200 FlashInfer files."""

from __future__ import annotations

import http.server
import importlib.metadata
import json
import os
import socket
import subprocess
import threading
from pathlib import Path

import httpx
import pytest

from tests.support import forked
from tests.support.cli import tunecache, tunecache_executable
from tunecache.cli_kit import ExitCode
from tests.support.paths import CUBLASLT_FILE, CUDNN_FILE
from tests.support.serve import free_port, as_admin, start_server, stop_server
from tunecache.service import db
from tests.support.cli import MODEL, pull, push
from tests.support.torch_tests import cuda_available

# What this module tests happens on the pod: its server runs on SQLite only (tests/conftest.py).
SERVER_DATABASE_INCIDENTAL = True

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


@pytest.mark.postgres
def test_db_upgrade_brings_an_empty_postgres_schema_to_the_head_and_serve_starts_on_it(postgres_schema_url, tmp_path):
    """What an operator does before the first `tunecache serve` on PostgreSQL (the ``server``
    fixture starts its servers on copies of a migrated database instead)."""
    upgraded = tunecache("db", "upgrade", "--database", postgres_schema_url, check=True)
    assert f"database at revision {db.head_revision()}" in upgraded.stdout
    process, url = start_server(postgres_schema_url, tmp_path, "upgraded")
    try:
        assert httpx.get(f"{url}/v1/health").status_code == 200
    finally:
        stop_server(process)


class _NotTunecache(http.server.BaseHTTPRequestHandler):
    """Some other web server: HTML 404 for everything."""

    def do_POST(self):  # noqa: N802
        self.send_response(404)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(b"<html>nope</html>")

    def log_message(self, *args):
        pass


def test_a_server_that_is_not_tunecache_exits_5(tmp_path):
    httpd = http.server.HTTPServer(("127.0.0.1", 0), _NotTunecache)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        pulled = pull(f"http://127.0.0.1:{httpd.server_port}", tmp_path / "dest")
    finally:
        httpd.shutdown()
    assert pulled.returncode == 5 and "server answered 404" in pulled.stderr
    assert "Traceback" not in pulled.stderr


def test_wrong_server_path_is_not_mistaken_for_a_miss(server, tmp_path):
    pulled = pull(f"{server}/v1", tmp_path / "dest")
    assert pulled.returncode == 5 and "Traceback" not in pulled.stderr


def test_push_of_a_file_with_undetected_fields_exits_7_and_uploads_nothing(server, tmp_path):
    doc = json.loads(CUDNN_FILE.read_text())
    doc["_metadata"]["cuda_version"] = "unknown"
    path = tmp_path / "unknown.json"
    path.write_text(json.dumps(doc))
    result = push(server, path)
    assert result.returncode == 7 and "could not detect cuda_version" in result.stderr
    sha = __import__("hashlib").sha256(path.read_bytes()).hexdigest()
    assert httpx.head(f"{server}/v1/artifacts/{sha}").status_code == 404


def test_an_empty_stages_option_is_a_usage_error(server):
    result = tunecache("retune", "--server", server, "--model", MODEL, "--max-num-batched-tokens", "8192",
                       "--gpu-name", "NVIDIA H200", "--stages", "")
    assert result.returncode == 2 and "--stages is empty" in result.stderr


def test_client_usage_errors_exit_2(server, tmp_path):
    no_scheme = pull(server.removeprefix("http://"), tmp_path / "dest")
    assert no_scheme.returncode == 2 and "must look like http://host:port" in no_scheme.stderr
    escaping = pull(server, tmp_path / "dest", CUDNN_FILE, "--file-name", "../escaped.json")
    assert escaping.returncode == 2 and not (tmp_path / "escaped.json").exists()


def test_bad_metadata_values_exit_7(server, tmp_path):
    for metadata in ({"gpu": ""}, {"gpu": "x" * 200}, {"gpu": None}):
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps({"_metadata": json.loads(CUDNN_FILE.read_text())["_metadata"] | metadata}))
        pushed = push(server, bad)
        assert pushed.returncode == 7 and "_metadata.gpu" in pushed.stderr and "Traceback" not in pushed.stderr
        pulled = pull(server, tmp_path / "dest", bad)
        assert pulled.returncode == 7 and "_metadata.gpu" in pulled.stderr


def test_serve_configuration_errors(tmp_path):
    """Each on a port of its own: the checks hold whatever listens on the default port (8321),
    which this test takes itself where it is free (the bad database was exit 11 then)."""
    from tunecache.service.settings import Settings

    env = {**os.environ, "TUNECACHE_DATA_DIR": str(tmp_path), "TUNECACHE_WORKER": "off"}
    bad_port = subprocess.run([tunecache_executable(), "serve"], env=env | {"TUNECACHE_PORT": "abc"},
                              capture_output=True, text=True, timeout=60)
    assert bad_port.returncode == 2 and "TUNECACHE_PORT" in bad_port.stderr
    with socket.socket() as default:
        try:
            default.bind(("127.0.0.1", Settings.model_fields["port"].default))
            default.listen()
        except OSError:  # something listens there already: the case itself
            pass
        bad_url = tunecache("serve", "--database", "notaurl", "--port", str(free_port()))
    assert bad_url.returncode == 9 and "not usable" in bad_url.stderr and "Traceback" not in bad_url.stderr
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = subprocess.run(
            [tunecache_executable(), "serve", "--port", str(busy.getsockname()[1]), "--database", f"sqlite:///{tmp_path}/x.db"],
            env=env, capture_output=True, text=True, timeout=120,
        )
    assert taken.returncode == 11 and "could not serve" in taken.stderr


def test_serve_on_a_busy_port_exits_11_in_one_line_before_touching_the_database(tmp_path):
    """Issue 21: the port is checked before the database is created, migrated or given an admin token."""
    data = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if k not in ("TUNECACHE_DATABASE_URL", "TUNECACHE_SERVER_PROCESSES")}
    env |= {"TUNECACHE_DATA_DIR": str(data), "TUNECACHE_JOB_WORKER": "off"}
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        taken = subprocess.run([tunecache_executable(), "serve", "--port", str(port)],
                               env=env, capture_output=True, text=True, timeout=120)
    assert taken.returncode == 11, taken.stderr
    assert taken.stderr.splitlines() == [
        f"tunecache: error: could not serve on http://127.0.0.1:{port} with 1 process(es): Address already in use"]
    assert not (data / "tunecache.db").exists() and not (data / "admin.token").exists()


def test_serve_on_a_host_it_cannot_listen_on_exits_11_in_one_line(tmp_path):
    env = {**os.environ, "TUNECACHE_DATA_DIR": str(tmp_path / "data"), "TUNECACHE_JOB_WORKER": "off"}
    env.pop("TUNECACHE_DATABASE_URL", None)
    bad = subprocess.run([tunecache_executable(), "serve", "--host", "no-such-host.invalid", "--port", str(free_port())],
                         env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 11, bad.stderr
    lines = bad.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tunecache: error: could not serve on http://no-such-host.invalid:")
    assert not (tmp_path / "data" / "tunecache.db").exists()


@pytest.mark.skipif(cuda_available(), reason="checks a node without a GPU")
def test_worker_on_without_a_gpu_is_refused_in_one_line(tmp_path):
    env = {**os.environ, "TUNECACHE_DATA_DIR": str(tmp_path), "TUNECACHE_WORKER": "on"}
    result = subprocess.run([tunecache_executable(), "serve", "--port", str(free_port())], env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 11 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == ["tunecache: error: TUNECACHE_WORKER=on but this node cannot tune: no CUDA device"]


@pytest.mark.skipif(cuda_available(), reason="checks a node without a GPU")
def test_job_worker_on_without_a_gpu_is_refused_under_the_new_name(tmp_path):
    env = {**os.environ, "TUNECACHE_DATA_DIR": str(tmp_path), "TUNECACHE_JOB_WORKER": "on"}
    env.pop("TUNECACHE_WORKER", None)
    result = subprocess.run([tunecache_executable(), "serve", "--port", str(free_port())], env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 11 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        "tunecache: error: TUNECACHE_JOB_WORKER=on but this node cannot tune: no CUDA device"]


@pytest.mark.parametrize("field, new, old, value, other", [
    ("job_worker", "TUNECACHE_JOB_WORKER", "TUNECACHE_WORKER", "off", "on"),
    ("server_processes", "TUNECACHE_SERVER_PROCESSES", "TUNECACHE_WORKERS", 3, 5),
])
def test_renamed_settings_read_the_new_and_the_old_variable(monkeypatch, field, new, old, value, other):
    """``TUNECACHE_JOB_WORKER`` and ``TUNECACHE_SERVER_PROCESSES`` (tunecache.service.settings)
    are read under their new names and, when those are unset, under their old ones; the new
    name wins over the old, an argument over both."""
    from tunecache.service.settings import Settings, variable_name

    for name in (new, old):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(new, str(value))
    assert getattr(Settings(), field) == value and variable_name(field) == new
    monkeypatch.delenv(new)
    monkeypatch.setenv(old, str(value))
    assert getattr(Settings(), field) == value and variable_name(field) == old
    monkeypatch.setenv(new, str(other))
    assert getattr(Settings(), field) == other and variable_name(field) == new
    assert getattr(Settings(**{field: value}), field) == value


def test_renamed_settings_keep_their_old_keyword_and_attribute_names(monkeypatch):
    from tunecache.service.settings import Settings

    for name in ("TUNECACHE_JOB_WORKER", "TUNECACHE_WORKER", "TUNECACHE_SERVER_PROCESSES", "TUNECACHE_WORKERS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TUNECACHE_JOB_WORKER", "on")
    settings = Settings(worker="off", workers=4)
    assert (settings.job_worker, settings.server_processes) == ("off", 4)
    assert (settings.worker, settings.workers) == ("off", 4)


def _serve_on_a_busy_port(tmp_path, *options, env=None):
    """``tunecache serve`` where its port is taken: it says how many processes it starts, then exits 11."""
    environ = {k: v for k, v in os.environ.items() if k not in ("TUNECACHE_SERVER_PROCESSES", "TUNECACHE_WORKERS")}
    environ |= {"TUNECACHE_DATA_DIR": str(tmp_path), "TUNECACHE_JOB_WORKER": "off", **(env or {})}
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        return subprocess.run(
            [tunecache_executable(), "serve", "--port", str(busy.getsockname()[1]), "--database",
             f"sqlite:///{tmp_path}/x.db", *options], env=environ, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("options, env, deprecated", [
    (("--processes", "2"), {}, False),
    (("--workers", "2"), {}, True),
    ((), {"TUNECACHE_SERVER_PROCESSES": "2"}, False),
    ((), {"TUNECACHE_WORKERS": "2"}, False),
])
def test_serve_processes_under_the_new_and_the_old_names(tmp_path, options, env, deprecated):
    result = _serve_on_a_busy_port(tmp_path, *options, env=env)
    assert result.returncode == 11 and "could not serve" in result.stderr, result.stderr
    assert "with 2 process(es)" in result.stderr
    assert ("--workers is deprecated, use --processes" in result.stderr) is deprecated


def test_serve_names_the_processes_variable_it_read_and_refuses_two_counts(tmp_path):
    for name in ("TUNECACHE_SERVER_PROCESSES", "TUNECACHE_WORKERS"):
        bad = _serve_on_a_busy_port(tmp_path, env={name: "0"})
        assert bad.returncode == 2 and f"({name})" in bad.stderr, bad.stderr
    both = _serve_on_a_busy_port(tmp_path, "--processes", "2", "--workers", "3")
    assert both.returncode == 2 and "--workers is the old name of --processes" in both.stderr
    assert "--workers" not in _serve_help()  # the old name works, but is not offered


def _serve_help() -> str:
    result = tunecache("serve", "--help")
    assert result.returncode == 0 and "--processes" in result.stdout, result.stderr
    return result.stdout


def test_init_container_installs_every_rank_for_vllm(server, tmp_path):
    push(server, CUDNN_FILE, "--tensor-parallel-size", "2", "--data-parallel-size", "2")
    config_hash = "cd" * 32
    pulled = tunecache(
        "pull", "--server", server, "--model", MODEL, "--max-num-batched-tokens", "8192", "--tensor-parallel-size", "2",
        "--environment", str(CUDNN_FILE), "--layout", "vllm", "--vllm-config-hash", config_hash,
        "--data-parallel-size", "2", "--dest", str(tmp_path / "vllm-root"),
    )
    assert pulled.returncode == 0, pulled.stderr
    files = sorted((tmp_path / "vllm-root" / config_hash).iterdir())
    # vLLM's world rank runs on across data-parallel replicas: dp * (tp * pp) + local rank
    assert [f.name for f in files] == ["autotune_configs_dp0_rank0.json", "autotune_configs_dp0_rank1.json",
                                       "autotune_configs_dp1_rank2.json", "autotune_configs_dp1_rank3.json"]
    assert pulled.stdout.split() == [str(f) for f in files]
    assert all(f.read_bytes() == CUDNN_FILE.read_bytes() for f in files)
    missing_hash = tunecache("pull", "--server", server, "--model", MODEL, "--max-num-batched-tokens", "8192",
                             "--environment", str(CUDNN_FILE), "--layout", "vllm")
    assert missing_hash.returncode == 2 and "--vllm-config-hash" in missing_hash.stderr


def test_pull_into_flashinfer_v2_store(server, tmp_path):
    push(server, CUBLASLT_FILE)
    pulled = tunecache("pull", "--server", server, "--model", MODEL, "--max-num-batched-tokens", "8192",
                       "--environment", str(CUBLASLT_FILE), "--layout", "flashinfer-v2", "--dest", str(tmp_path / "v2"))
    assert pulled.returncode == 0, pulled.stderr
    store = Path(pulled.stdout.strip())
    assert store.parent == tmp_path / "v2" / "v2" and (store / "manifest.json").is_file()
    assert len(list((store / "entries").glob("*.json"))) == 42


def test_doctor_shows_environment_key_and_what_differs(server, tmp_path):
    push(server)
    matching = tunecache("doctor", "--server", server, "--model", MODEL, "--max-num-batched-tokens", "8192",
                         "--environment", str(CUDNN_FILE))
    assert matching.returncode == 0, matching.stderr
    assert "cudnn_version: 91900" in matching.stdout and "max_num_batched_tokens: 8192" in matching.stdout
    assert "run 1 matches (42 entries" in matching.stdout
    other = tmp_path / "env.json"
    other.write_text(json.dumps(json.loads(CUDNN_FILE.read_text())["_metadata"] | {"cudnn_version": "91700"}))
    missing = tunecache("doctor", "--server", server, "--model", MODEL, "--max-num-batched-tokens", "8192",
                        "--environment", str(other))
    assert missing.returncode == 3
    assert "run 1 (meta-llama/Llama-3.1-8B, NVIDIA H200): cudnn_version: stored 91900, yours 91700" in missing.stdout
    # A pushed file has no finish time: doctor says when it was recorded, never "finished <creation>".
    assert "recorded " in matching.stdout and "finished " not in matching.stdout


def test_pull_says_what_it_did_not_install_and_why(server, tmp_path, monkeypatch):
    from tests.support.builders import run_payload, signed
    from tunecache.signing import generate_signing_key, load_signing_key

    push(server)
    unsigned = pull(server, tmp_path / "a", CUDNN_FILE, "--jit-workspace", str(tmp_path / "workspace"))
    assert unsigned.returncode == 0 and "no trusted keys are set (TUNECACHE_TRUSTED_KEYS)" in unsigned.stderr
    keys = generate_signing_key(tmp_path / "keys")
    monkeypatch.setenv("TUNECACHE_TRUSTED_KEYS", str(keys.public_path))
    assert as_admin.post(f"{server}/v1/tunings", json=signed(run_payload(CUDNN_FILE), load_signing_key(keys.private_path)))
    no_modules = pull(server, tmp_path / "b", CUDNN_FILE, "--jit-workspace", str(tmp_path / "workspace"))
    assert no_modules.returncode == 0
    assert "run 2 is signed by trusted key" in no_modules.stderr
    assert "run 2 has no FlashInfer JIT modules (the tactics are installed)" in no_modules.stderr
    short_hash = tunecache("pull", "--server", server, "--model", MODEL, "--max-num-batched-tokens", "8192",
                           "--environment", str(CUDNN_FILE), "--layout", "vllm", "--vllm-config-hash", "abc123",
                           "--dest", str(tmp_path / "b"))
    assert short_hash.returncode == 2 and "'abc123' is not 64 lowercase hex digits" in short_hash.stderr


def test_a_bad_jit_module_means_nothing_is_installed(server, tmp_path, node_signing_key):
    """One good and one hostile JIT module: every module is checked before any is unpacked."""
    import hashlib
    import io
    import tarfile

    from tests.support.builders import run_payload, signed
    from tests.support.jit import fake_workspace
    from tunecache.formats.jit_module import module_tarball

    good = module_tarball(fake_workspace(tmp_path / "node"), "batch_prefill_bf16_h128")
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        info = tarfile.TarInfo("cached_ops/evil/../../../etc/evil")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    bad = raw.getvalue()
    payload = run_payload(CUDNN_FILE)
    for name, blob in (("good", good), ("bad", bad), ("cache", CUDNN_FILE.read_bytes())):
        as_admin.put(f"{server}/v1/artifacts/{hashlib.sha256(blob).hexdigest()}", content=blob)
        if name != "cache":
            payload["artifacts"].append({"kind": "flashinfer_jit_module", "name": f"flashinfer-jit/{name}.tar.gz",
                                         "media_type": "application/gzip", "sha256": hashlib.sha256(blob).hexdigest()})
    assert as_admin.post(f"{server}/v1/tunings", json=signed(payload, node_signing_key)).status_code == 201
    pulled = pull(server, tmp_path / "dest", CUDNN_FILE, "--jit-workspace", str(tmp_path / "workspace"))
    assert pulled.returncode == 6 and "unsafe path" in pulled.stderr and "not installed" in pulled.stderr
    assert not (tmp_path / "workspace").exists() and not (tmp_path / "dest").exists()


@pytest.mark.parametrize("header", ["not-a-number", str(2**63), "9" * 20, "1" + "0" * 19])
def test_a_jit_module_with_a_bad_time_header_is_a_bad_artifact(server, tmp_path, node_signing_key, header):
    """A module whose TUNECACHE.mtime_ns header is not a number, or one past what a signed
    64-bit count of nanoseconds holds (ninja's, and st_mtime_ns's): exit 6, nothing installed
    (issue 21: 2**63 and 20 digits were installed with another time than the header's)."""
    import hashlib

    from tests.support.builders import run_payload, signed
    from tests.support.jit import tarball

    bad = tarball([("cached_ops/m/m.so", f"mtime_ns={header}")])
    payload = run_payload(CUDNN_FILE)
    for blob in (bad, CUDNN_FILE.read_bytes()):
        as_admin.put(f"{server}/v1/artifacts/{hashlib.sha256(blob).hexdigest()}", content=blob)
    payload["artifacts"].append({"kind": "flashinfer_jit_module", "name": "flashinfer-jit/m.tar.gz",
                                 "media_type": "application/gzip", "sha256": hashlib.sha256(bad).hexdigest()})
    assert as_admin.post(f"{server}/v1/tunings", json=signed(payload, node_signing_key)).status_code == 201
    pulled = pull(server, tmp_path / "dest", CUDNN_FILE, "--jit-workspace", str(tmp_path / "workspace"))
    assert pulled.returncode == 6 and "not a whole number" in pulled.stderr and "not installed" in pulled.stderr
    assert not (tmp_path / "workspace").exists() and not (tmp_path / "dest").exists()


def test_retune_checks_its_options_before_asking(server, tmp_path):
    unknown = tunecache("retune", "--server", server, "--model", "m", "--max-num-batched-tokens", "8",
                        "--gpu-name", "NVIDIA H200", "--stages", "gemm,foo")
    assert unknown.returncode == 2 and "unknown stages foo" in unknown.stderr
    listed = tmp_path / "config.json"
    listed.write_text("[1]")
    not_object = tunecache("retune", "--server", server, "--model", "m", "--max-num-batched-tokens", "8",
                           "--gpu-name", "NVIDIA H200", "--config", str(listed))
    assert not_object.returncode == 7 and "not a JSON object" in not_object.stderr
    assert httpx.get(f"{server}/v1/tuning-jobs").json()["total"] == 0


def test_jit_modules_built_with_other_paths_are_skipped_and_the_tactics_installed(server, tmp_path, node_signing_key):
    """A run records what its JIT modules' build.ninja names (workspace, FlashInfer data,
    CUDA home, nvcc, CUDA version); a pod where one differs installs the tactics and skips
    the modules with one line naming the difference; a pod where all match installs both."""
    import hashlib

    from tests.support.builders import pod_jit_environment, run_payload, signed
    from tests.support.jit import fake_workspace
    from tunecache.formats.jit_module import module_tarball

    env = {**os.environ, "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "pod-home")}
    pod_environment = pod_jit_environment(env)
    if pod_environment is None:
        import pytest

        pytest.skip("FlashInfer finds no CUDA toolkit here, so a pod cannot tell where modules were built")
    module = module_tarball(fake_workspace(tmp_path / "node"), "batch_prefill_bf16_h128")
    sha = hashlib.sha256(module).hexdigest()
    as_admin.put(f"{server}/v1/artifacts/{sha}", content=module)
    as_admin.put(f"{server}/v1/artifacts/{hashlib.sha256(CUDNN_FILE.read_bytes()).hexdigest()}", content=CUDNN_FILE.read_bytes())

    def record(flashinfer_jit: dict) -> None:
        payload = run_payload(CUDNN_FILE, summary={"entries": 42, "flashinfer_jit": flashinfer_jit})
        payload["artifacts"].append({"kind": "flashinfer_jit_module", "name": "flashinfer-jit/m.tar.gz",
                                     "media_type": "application/gzip", "sha256": sha})
        assert as_admin.post(f"{server}/v1/tunings", json=signed(payload, node_signing_key)).status_code == 201

    def pull_jit(dest):
        return forked.run(["pull", "--server", server, "--model", MODEL, "--max-num-batched-tokens", "8192",
                           "--dest", str(dest), "--environment", str(CUDNN_FILE), "--jit"], env=env)

    record({**pod_environment, "cuda_home": "/opt/node-cuda-12.8"})
    elsewhere = pull_jit(tmp_path / "a")
    assert elsewhere.returncode == 0, elsewhere.stderr
    assert f"not installed, built elsewhere: cuda_home: node /opt/node-cuda-12.8, here {pod_environment['cuda_home']}" \
        in elsewhere.stderr
    assert Path(elsewhere.stdout.strip()).read_bytes() == CUDNN_FILE.read_bytes()  # the tactics are installed
    workspace = Path(pod_environment["workspace_dir"])
    assert not (workspace / "cached_ops" / "batch_prefill_bf16_h128").exists()

    record(pod_environment)
    same = pull_jit(tmp_path / "b")
    assert same.returncode == 0 and "installed 1 FlashInfer JIT modules" in same.stderr, same.stderr
    assert (workspace / "cached_ops" / "batch_prefill_bf16_h128" / "batch_prefill_bf16_h128.so").is_file()


def test_every_command_that_takes_a_key_has_the_same_key_options():
    """The key options are declared once (``tunecache.cli.key_options``): push, pull, doctor,
    retune and tune offer them with the same names, defaults and help; the GPU is optional
    (the environment's) for push, pull and doctor, required for retune, detected by tune."""
    import typer.main

    from tunecache import cli

    cli.load_command_plugins()
    group = typer.main.get_command(cli.app)

    def options(command: str) -> dict:
        return {p.name: (tuple(p.opts), p.required, p.default, p.help) for p in group.commands[command].params}

    deployment = ("model", "max_num_batched_tokens", "dtype", "quantization", "tensor_parallel_size",
                  "data_parallel_size", "enable_expert_parallel")
    push_options = options("push")
    assert push_options["tensor_parallel_size"][0] == ("--tensor-parallel-size", "-tp")
    assert push_options["model"][1] and push_options["dtype"][2] == "auto" and push_options["enable_expert_parallel"][2] is False
    for command in ("pull", "doctor", "retune", "tune"):
        assert {f: options(command)[f] for f in deployment} == {f: push_options[f] for f in deployment}, command
    for command in ("pull", "doctor"):
        assert {f: options(command)[f] for f in ("gpu_name", "arch")} == {f: push_options[f] for f in ("gpu_name", "arch")}
    assert not push_options["gpu_name"][1] and options("retune")["gpu_name"][1]
    assert "gpu_name" not in options("tune") and "arch" not in options("tune")
    missing = tunecache("retune", "--server", "http://127.0.0.1:9", "--model", "m", "--max-num-batched-tokens", "8")
    assert missing.returncode == 2 and "--gpu-name" in missing.stderr


def test_a_usage_error_of_the_console_script_is_one_line_and_exit_2():
    result = tunecache("serve", "--no-such-option")  # a command of the server's plugin
    assert result.returncode == ExitCode.USAGE == 2, result.stderr
    assert result.stderr.splitlines() == ["tunecache: error: no such option: --no-such-option (see tunecache serve --help)"]
    missing = tunecache("pull", "--model", MODEL, "--max-num-batched-tokens", "8192", "--dest", "/nonexistent")
    assert missing.returncode == 2 and missing.stderr.splitlines() == [
        "tunecache: error: missing option '--server' (env var: 'TUNECACHE_URL') (see tunecache pull --help)"]


def test_version_names_each_installed_distribution():
    result = tunecache("--version")
    assert result.returncode == 0 and result.stderr == ""
    assert result.stdout.splitlines() == [
        f"tunecache-client {importlib.metadata.version('tunecache-client')}",
        f"tunecache-server {importlib.metadata.version('tunecache-server')}",
    ]


def test_help_into_a_closed_pipe_ends_without_a_traceback_and_h_is_help():
    """``tunecache --help | head -1``: the reader goes away mid-help. typer 0.29's click copy
    has no ``Abort``, and naming it in an ``except`` raised AttributeError with a traceback."""
    process = subprocess.Popen([tunecache_executable(), "--help"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.read(1)
    process.stdout.close()  # as head does once it has its line
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=60) in (0, 1), stderr
    assert "Traceback" not in stderr and "AttributeError" not in stderr, stderr
    for args in (["-h"], ["pull", "-h"], ["job", "-h"]):
        shown = tunecache(*args)
        assert shown.returncode == 0 and "Usage: tunecache" in shown.stdout, (args, shown.stderr)


def test_a_bad_key_field_is_one_line_in_the_validators_own_words():
    """Without pydantic's "Value error," prefix (it showed in the CLI's one-line errors)."""
    result = tunecache("doctor", "--server", "http://127.0.0.1:1", "--model", " bad", "--max-num-batched-tokens", "8",
                       "--environment", str(CUDNN_FILE))
    assert result.returncode == int(ExitCode.USAGE)
    assert result.stderr.strip().splitlines()[-1] == ("tunecache: error: invalid key: model: must not start or end "
                                                     "with whitespace")


def test_doctor_checks_the_key_before_it_says_anything():
    """A key value out of range is one line and exit 2 with nothing on stdout (the environment
    block was printed first)."""
    result = tunecache("doctor", "--server", "http://127.0.0.1:1", "--model", MODEL, "--max-num-batched-tokens",
                       "99999999", "--environment", str(CUDNN_FILE))
    assert result.returncode == int(ExitCode.USAGE) and result.stdout == "", result.stdout
    assert result.stderr.splitlines() == [
        "tunecache: error: invalid key: max_num_batched_tokens: Input should be less than or equal to 16777216"]


def test_a_reader_that_leaves_early_does_not_change_the_exit_code(server):
    """``tunecache doctor ... | head -1`` on a miss: exit 3 as without the pipe, the rest of
    the output dropped (click ended the command with exit 1 and nothing said)."""
    process = subprocess.Popen([tunecache_executable(), "doctor", "--server", server, "--model", "no/such-model",
                                "--max-num-batched-tokens", "8192", "--environment", str(CUDNN_FILE)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout.readline().startswith(b"environment")
    process.stdout.close()  # as head does once it has its line
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=60) == int(ExitCode.NO_COMPATIBLE_TUNING), stderr
    assert "Traceback" not in stderr and "Broken pipe" not in stderr, stderr


def test_fleet_values_past_the_servers_bounds_are_usage_errors():
    """--hours and --offset beyond what GET /v1/fleet accepts: one line naming the command's
    help, exit 2, before any request (the server's 422 was printed as a raw list, exit 5)."""
    for option, value, bound in (("--hours", "99999999999", "87600"), ("--offset", "99999999999", "2147483647")):
        result = tunecache("fleet", "--server", "http://127.0.0.1:1", option, value)
        assert result.returncode == int(ExitCode.USAGE), result.stderr
        assert result.stderr.splitlines() == [
            f"tunecache: error: invalid value for '{option}': Input should be less than or equal to {bound} "
            "(see tunecache fleet --help)"]


def test_two_db_upgrades_at_once_on_one_sqlite_file_migrate_one_after_the_other(tmp_path):
    """SQLite alters a table by copying it into _alembic_tmp_<table>: two upgrades at once left
    that copy behind in 2 of 6 rounds of a probe, and every later migration failed on it."""
    import sqlite3
    import subprocess

    from tests.support.cli import tunecache_executable
    from tunecache.service.db import head_revision

    for round_ in range(4):
        url = f"sqlite:///{tmp_path / f'round-{round_}.db'}"
        started = [subprocess.Popen([tunecache_executable(), "db", "upgrade", "--database", url],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
        outcomes = [process.communicate(timeout=120) + (process.returncode,) for process in started]
        assert [code for _, _, code in outcomes] == [0, 0], outcomes
        with sqlite3.connect(tmp_path / f"round-{round_}.db") as connection:
            tables = [row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
            [(revision,)] = connection.execute("SELECT version_num FROM alembic_version").fetchall()
        assert not [t for t in tables if t.startswith("_alembic_tmp")] and revision == head_revision()


def test_a_push_with_a_push_token_says_why_its_run_is_not_current(server, tmp_path):
    """A pod's push token files the run as a pod's run that never becomes current: push --help
    promised a reason, and none was printed (nor shown by the API or the dashboard)."""
    import httpx

    from tests.support.cli import tunecache_executable
    from tests.support.serve import admin_headers

    answer = httpx.post(f"{server}/v1/tokens", json={"name": "pods", "scope": "push"}, headers=admin_headers())
    assert answer.status_code == 201, answer.text
    result = subprocess.run([tunecache_executable(), "--token", answer.json()["token"], "push", str(CUDNN_FILE),
                             "--server", server, "--model", "meta-llama/Llama-3.1-8B", "--max-num-batched-tokens", "8192"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    said = ("recorded with a push token, so it is stored as a pod's run: unverified, and never current (a run recorded "
            "with a tune or admin token can become current)")
    assert f"is not current: {said}" in result.stderr
    [run] = httpx.get(f"{server}/v1/tunings").json()["items"]
    assert (run["trigger"], run["is_current"], run["held"]) == ("pod", False, said)


def test_a_lost_admin_token_is_recovered_from_the_database(server, database_url, tmp_path):
    """On Kubernetes the first admin token lands in a server pod's emptyDir (or a tuner pod's):
    lost on a restart. Whoever can reach the database makes a new one, and it works."""
    import httpx

    from tests.support.cli import tunecache_executable

    made = subprocess.run([tunecache_executable(), "db", "admin-token", "--database", database_url, "--name", "ops"],
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    assert token.startswith("tc_") and len(made.stdout.strip().splitlines()) == 1
    listed = httpx.get(f"{server}/v1/tokens", headers={"Authorization": f"Bearer {token}"})
    assert listed.status_code == 200 and "ops" in [t["name"] for t in listed.json()]
    again = subprocess.run([tunecache_executable(), "db", "admin-token", "--database", database_url, "--name", "ops"],
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and again.stderr.strip().splitlines() == [
        "tunecache: error: a token named 'ops' exists already: give another --name"]


def test_serve_makes_no_first_admin_token_where_it_is_told_not_to(tmp_path):
    from tests.support.serve import start_server, stop_server

    process, url = start_server(f"sqlite:///{tmp_path / 'tuner.db'}", tmp_path, "tuner",
                                TUNECACHE_BOOTSTRAP_ADMIN_TOKEN="false")
    try:
        assert not (tmp_path / "tuner-data" / "admin.token").exists()
    finally:
        stop_server(process)


def test_doctor_says_an_unsigned_run_will_not_load_where_pods_trust_keys(server, tmp_path, node_signing_key, monkeypatch):
    """With TUNECACHE_TRUSTED_KEYS set, a pod installs nothing of an unsigned run, the tactics
    neither: doctor said the tactics load while pull exited 14 (and then exited 0 where it said
    so: now 14, as pull). A bad value of the variable is one line and exit 2 before anything is
    printed, as pull says it."""
    from tests.support.cli import tunecache_executable

    assert push(server).returncode == 0  # unsigned
    command = [tunecache_executable(), "doctor", "--server", server, "--model", "meta-llama/Llama-3.1-8B",
               "--max-num-batched-tokens", "8192", "--environment", str(CUDNN_FILE)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == int(ExitCode.UNTRUSTED_RUN), result.stderr
    [tactics] = [line.strip() for line in result.stdout.splitlines() if line.strip().startswith("flashinfer_autotune_v1")]
    assert tactics.startswith("flashinfer_autotune_v1: will not load: the run is refused, nothing of it installs: ")
    monkeypatch.setenv("TUNECACHE_TRUSTED_KEYS", str(tmp_path / "no-such-file"))
    bad = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stdout == "" and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    assert bad.stderr.startswith("tunecache: error: TUNECACHE_TRUSTED_KEYS") and "TUNECACHE_TRUSTED_KEYS: TUNECACHE" \
        not in bad.stderr


def test_pin_and_unpin_keep_a_run_from_retention_and_let_it_go(server):
    """``tunecache pin RUN`` and ``unpin RUN`` (admin, the token file of this machine's serve):
    the run shows ``pinned`` and the audit log says who did it; both are idempotent; an
    unknown run exits 5, a token of too small a scope 13."""
    assert push(server).returncode == 0
    [run] = httpx.get(f"{server}/v1/tunings").json()["items"]
    assert run["pinned"] is False
    said = f"run {run['id']} of {MODEL} on NVIDIA H200 is pinned: retention never deletes it"
    for _ in range(2):  # a pinned run pinned again: the same
        pinned = tunecache("pin", str(run["id"]), "--server", server)
        assert pinned.returncode == 0 and pinned.stdout.splitlines() == [said], pinned.stderr
        assert httpx.get(f"{server}/v1/tunings/{run['id']}").json()["pinned"] is True
    for _ in range(2):
        unpinned = tunecache("unpin", str(run["id"]), "--server", server)
        assert unpinned.returncode == 0 and unpinned.stdout.splitlines() == [
            f"run {run['id']} of {MODEL} on NVIDIA H200 is unpinned: retention keeps or deletes it as any other run"]
        assert httpx.get(f"{server}/v1/tunings/{run['id']}").json()["pinned"] is False
    details = [event["detail"] or "" for event in as_admin.get(f"{server}/v1/audit").json()["events"]]
    assert any(d.startswith(f"pinned run {run['id']} ") for d in details), details
    assert any(d.startswith(f"unpinned run {run['id']} ") for d in details), details

    for command in ("pin", "unpin"):
        missing = tunecache(command, "999999", "--server", server)
        assert missing.returncode == ExitCode.SERVER_ERROR == 5 and "404" in missing.stderr, missing.stderr
    reader = as_admin.post(f"{server}/v1/tokens", json={"name": "reader", "scope": "read"}).json()["token"]
    refused = subprocess.run([tunecache_executable(), "--token", reader, "pin", str(run["id"]), "--server", server],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == ExitCode.NOT_AUTHORISED == 13, refused.stderr
    assert tunecache("pin", "0", "--server", server).returncode == ExitCode.USAGE
