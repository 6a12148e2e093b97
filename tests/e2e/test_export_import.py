"""``tunecache export`` and ``tunecache import`` (issue 42, build item 4): signed runs carried
from one `tunecache serve` to another with no route between them, as an OCI image layout and
through a real OCI registry (Debian's ``docker-registry``, the CNCF distribution registry),
checked by what a pod of the second service installs."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.support.builders import run_payload, signed
from tests.support.cli import MODEL, tunecache
from tests.support.paths import CUDNN_FILE
from tests.support.serve import free_port, start_server, stop_server
from tunecache.cli_kit import ExitCode
from tunecache.signing import generate_signing_key, load_signing_key

# Two services of their own on SQLite files: what is tested is the carrying, not the database.
SERVER_DATABASE_INCIDENTAL = True

REGISTRY = shutil.which("docker-registry") or "/usr/bin/docker-registry"


def _token(tmp_path: Path, name: str) -> str:
    return (tmp_path / f"{name}-data" / "admin.token").read_text().strip()


@pytest.fixture
def tuner_key(tmp_path, monkeypatch):
    """The tuner node's key of the first service; both services and the pods trust it."""
    files = generate_signing_key(tmp_path / "tuner-key")
    monkeypatch.setenv("TUNECACHE_TRUSTED_KEYS", str(files.public_path))
    return load_signing_key(files.private_path)


@pytest.fixture
def services(tmp_path, tuner_key):
    """Two services (their own databases and data dirs), each trusting the tuner's key:
    {name: (url, admin token)}."""
    started = {}
    try:
        for name in ("tuned", "airgapped"):
            process, url = start_server(f"sqlite:///{tmp_path / name}.db", tmp_path, name)
            started[name] = (process, url)
        yield {name: (url, _token(tmp_path, name)) for name, (_, url) in started.items()}
    finally:
        for process, _ in started.values():
            stop_server(process)


def _record_signed(url: str, token: str, signing_key) -> dict:
    data = CUDNN_FILE.read_bytes()
    headers = {"Authorization": f"Bearer {token}"}
    stored = httpx.put(f"{url}/v1/artifacts/{hashlib.sha256(data).hexdigest()}", content=data, headers=headers)
    assert stored.status_code in (200, 201), stored.text
    recorded = httpx.post(f"{url}/v1/tunings", json=signed(run_payload(CUDNN_FILE), signing_key), headers=headers)
    assert recorded.status_code == 201 and recorded.json()["is_current"], recorded.text
    return recorded.json()


def _runs(url: str, token: str) -> list[dict]:
    return httpx.get(f"{url}/v1/tunings", headers={"Authorization": f"Bearer {token}"}).json()["items"]


def _pod_installs(url: str, token: str, dest: Path) -> subprocess.CompletedProcess:
    """A pod of ``url`` (trusting the tuner's key) pulls its tuning, and installs only a signed one."""
    return tunecache("--token", token, "pull", "--server", url, "--model", MODEL, "--max-num-batched-tokens", "8192",
                     "--dest", str(dest), "--environment", str(CUDNN_FILE))


def _assert_carried(services, source_run: dict, pod_dir: Path) -> None:
    url, token = services["airgapped"]
    [imported] = _runs(url, token)
    assert imported["signature"] == source_run["signature"]  # kept: signed by the tuner of the first service
    assert imported["signature_verified"] is True and imported["is_current"]
    assert imported["key"] == source_run["key"] and imported["environment"] == source_run["environment"]
    pulled = _pod_installs(url, token, pod_dir)
    assert pulled.returncode == 0, pulled.stderr
    assert "is signed by trusted key" in pulled.stdout + pulled.stderr
    [installed] = [p for p in pod_dir.iterdir() if p.suffix == ".json"]
    assert installed.read_bytes() == CUDNN_FILE.read_bytes()


def test_a_layout_carries_signed_runs_that_a_pod_of_the_other_service_installs(services, tuner_key, tmp_path):
    (source, source_token), (target, target_token) = services["tuned"], services["airgapped"]
    run = _record_signed(source, source_token, tuner_key)
    assert _pod_installs(target, target_token, tmp_path / "before").returncode == ExitCode.NO_COMPATIBLE_TUNING

    layout = tmp_path / "bundle"
    exported = tunecache("--token", source_token, "export", "--server", source, "--model", MODEL, "--layout", str(layout))
    assert exported.returncode == 0, exported.stderr
    assert exported.stdout.splitlines()[0].startswith(f"run {run['id']} of {MODEL} on NVIDIA H200")
    index = json.loads((layout / "index.json").read_text())
    assert index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"] == "latest"
    assert (layout / "blobs" / "sha256" / run["artifacts"][0]["sha256"]).read_bytes() == CUDNN_FILE.read_bytes()

    imported = tunecache("--token", target_token, "import", "--server", target, "--layout", str(layout))
    assert imported.returncode == 0, imported.stderr
    size = CUDNN_FILE.stat().st_size  # the only artifact, which the other service lacked
    assert f"(current; {size:,} bytes uploaded; signed by {run['signature']['key_id']})" in imported.stdout, \
        imported.stdout
    _assert_carried(services, run, tmp_path / "pod")

    again = tunecache("--token", target_token, "import", "--server", target, "--layout", str(layout))
    assert again.returncode == 0 and "already current here" in again.stdout, again.stdout + again.stderr
    assert len(_runs(target, target_token)) == 1


def test_a_service_that_does_not_trust_the_signer_refuses_the_run_and_stores_nothing(tuner_key, tmp_path):
    stranger = generate_signing_key(tmp_path / "stranger-key")
    source_process, source = start_server(f"sqlite:///{tmp_path / 'tuned'}.db", tmp_path, "tuned")
    target_process, target = start_server(f"sqlite:///{tmp_path / 'other'}.db", tmp_path, "other",
                                          TUNECACHE_TRUSTED_KEYS=str(stranger.public_path))
    try:
        source_token, target_token = _token(tmp_path, "tuned"), _token(tmp_path, "other")
        run = _record_signed(source, source_token, tuner_key)
        layout = tmp_path / "bundle"
        assert tunecache("--token", source_token, "export", "--server", source, "--run", str(run["id"]),
                         "--layout", str(layout)).returncode == 0
        refused = tunecache("--token", target_token, "import", "--server", target, "--layout", str(layout))
        assert refused.returncode == ExitCode.UNTRUSTED_RUN, refused.stdout + refused.stderr
        lines = refused.stderr.strip().splitlines()
        assert lines[0].startswith(f"tunecache: run {run['id']} of {MODEL} refused: not signed by a key this service "
                                   "trusts (TUNECACHE_TRUSTED_KEYS): signed by key ")
        assert lines[-1] == ("tunecache: error: 1 of 1 runs refused: this service does not trust the keys that signed them "
                             "(TUNECACHE_TRUSTED_KEYS on the server)")
        assert _runs(target, target_token) == []
        sha = run["artifacts"][0]["sha256"]  # refused before any byte was sent
        assert httpx.head(f"{target}/v1/artifacts/{sha}", headers={"Authorization": f"Bearer {target_token}"}
                          ).status_code == 404
    finally:
        stop_server(source_process)
        stop_server(target_process)


def test_export_refuses_an_unsigned_run_and_leaves_no_layout(tmp_path):
    process, url = start_server(f"sqlite:///{tmp_path / 'tuned'}.db", tmp_path, "tuned")
    try:
        token = _token(tmp_path, "tuned")
        pushed = tunecache("--token", token, "push", str(CUDNN_FILE), "--server", url, "--model", MODEL,
                           "--max-num-batched-tokens", "8192")
        assert pushed.returncode == 0, pushed.stderr
        refused = tunecache("--token", token, "export", "--server", url, "--all", "--layout", str(tmp_path / "bundle"))
        assert refused.returncode == ExitCode.UNTRUSTED_RUN
        assert refused.stderr.startswith("tunecache: error: run 1 of meta-llama/Llama-3.1-8B is unsigned: a service imports "
                                         "only runs signed by a key it trusts"), refused.stderr
        assert not (tmp_path / "bundle").exists()
        nothing = tunecache("--token", token, "export", "--server", url, "--model", "no/such-model", "--layout",
                            str(tmp_path / "bundle"))
        assert nothing.returncode == ExitCode.NO_COMPATIBLE_TUNING, nothing.stderr
        assert not (tmp_path / "bundle").exists()
    finally:
        stop_server(process)


@pytest.fixture
def registry(tmp_path):
    """A real OCI registry on a free port: the CNCF distribution registry (``docker-registry``,
    Debian's package, which .ci/run installs), storing into the test's directory; its
    ``host:port``."""
    if not os.access(REGISTRY, os.X_OK):
        pytest.skip(f"no OCI registry server: {REGISTRY} is not installed (apt-get install docker-registry)")
    port = free_port()
    config = tmp_path / "registry.yml"
    config.write_text(f"version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: "
                      f"{tmp_path / 'registry-data'}\nhttp:\n  addr: 127.0.0.1:{port}\n")
    log = open(tmp_path / "registry.log", "w")
    process = subprocess.Popen([REGISTRY, "serve", str(config)], stdout=log, stderr=log)
    try:
        for _ in range(100):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v2/", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert process.poll() is None, (tmp_path / "registry.log").read_text()
            time.sleep(0.1)
        else:
            pytest.fail("the registry did not answer: " + (tmp_path / "registry.log").read_text())
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_a_registry_carries_signed_runs_that_a_pod_of_the_other_service_installs(services, tuner_key, registry,
                                                                                  tmp_path):
    (source, source_token), (target, target_token) = services["tuned"], services["airgapped"]
    run = _record_signed(source, source_token, tuner_key)
    reference = f"{registry}/tunecache/runs:2026-12"
    exported = tunecache("--token", source_token, "export", "--server", source, "--all", "--registry", reference,
                         "--plain-http")
    assert exported.returncode == 0, exported.stderr
    assert exported.stdout.splitlines()[-1].startswith("exported 1 run (") and reference in exported.stdout
    tags = httpx.get(f"http://{registry}/v2/tunecache/runs/tags/list").json()
    assert tags["tags"] == ["2026-12"]  # what the registry holds, asked of it directly

    # the bounds hold while a bundle comes down: an artifact over TUNECACHE_MAX_UNPACK_BYTES stops the download
    bounded = subprocess.run([shutil.which("tunecache"), "--token", target_token, "import", "--server", target,
                              "--registry", reference, "--plain-http"], capture_output=True, text=True, timeout=120,
                             env={**os.environ, "TUNECACHE_MAX_UNPACK_BYTES": "1000"})
    assert bounded.returncode == ExitCode.BAD_INPUT, bounded.stdout + bounded.stderr
    assert bounded.stderr.startswith("tunecache: error: blob sha256:") and "over TUNECACHE_MAX_UNPACK_BYTES (1,000)" \
        in bounded.stderr
    assert _runs(target, target_token) == []

    imported = tunecache("--token", target_token, "import", "--server", target, "--registry", reference, "--plain-http")
    assert imported.returncode == 0, imported.stderr
    _assert_carried(services, run, tmp_path / "pod")

    missing = tunecache("--token", target_token, "import", "--server", target, "--registry",
                        f"{registry}/tunecache/runs:no-such-tag", "--plain-http")
    assert missing.returncode == ExitCode.SERVER_ERROR, missing.stdout + missing.stderr
    assert missing.stderr == (f"tunecache: error: registry of {registry}/tunecache/runs:no-such-tag: "
                              "manifest unknown\n")  # the registry's own words, in one line
