"""The attack on a fleet's pods, played against a live server: replace the shared library
inside the current JIT module, upload it, and make a run of it current.

Without a token it fails at the service (401); with a ``push`` token the run is stored as an
unverified pod run and never becomes current; with a stolen ``tune`` token it becomes
current, but a pod that trusts only the fleet's signing key refuses it (exit 14), installs
nothing, keeps what it had, and the replaced library never loads: its load-time marker
never appears. The libraries are real ELF shared objects built with the C compiler here
and loaded with ``ctypes``, as FlashInfer loads a JIT module.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.support import forked
from tests.support.cli import tunecache_executable
from tests.support.paths import CUDNN_FILE
from tests.support.serve import admin_headers
from tests.support.builders import pod_jit_environment, run_payload
from tests.support.jit import MTIME_NS, fake_workspace
from tunecache.client.jit_install import install_jit_module
from tunecache.contract import TuningRunCreate
from tunecache.formats.jit_module import module_tarball
from tunecache.signing import generate_signing_key, load_signing_key, sign_run

# What this module tests happens on the pod and in the signatures: its server runs on SQLite only (tests/conftest.py).
SERVER_DATABASE_INCIDENTAL = True

MODULE = "batch_prefill_bf16_h128"
MODEL = "meta-llama/Llama-3.1-8B"

LIBRARY_SOURCE = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void loaded(void) {
    const char *dir = getenv("MARKER_DIR");
    if (!dir) return;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, WHO);
    FILE *f = fopen(path, "w");
    if (f) { fputs(WHO, f); fclose(f); }
}
"""


def _shared_library(tmp_path: Path, who: str) -> bytes:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build the shared libraries of the attack")
    source = tmp_path / f"{who}.c"
    source.write_text(LIBRARY_SOURCE)
    out = tmp_path / f"{who}.so"
    subprocess.run([compiler, "-shared", "-fPIC", f'-DWHO="{who}"', str(source), "-o", str(out)], check=True)
    return out.read_bytes()


def _module_with(tmp_path: Path, name: str, library: bytes) -> bytes:
    """A JIT module tarball whose ``.so`` is ``library`` (file times kept as the node's)."""
    workspace = fake_workspace(tmp_path / name, MODULE)
    so = workspace / "cached_ops" / MODULE / f"{MODULE}.so"
    so.write_bytes(library)
    os.utime(so, ns=(MTIME_NS, MTIME_NS))
    return module_tarball(workspace, MODULE)


def _load_every_module(workspace: Path, marker_dir: Path) -> None:
    """What FlashInfer does with an installed module: dlopen its ``.so`` (in a fresh process)."""
    code = ("import ctypes, pathlib, sys\n"
            "for so in sorted(pathlib.Path(sys.argv[1]).glob('cached_ops/*/*.so')): ctypes.CDLL(str(so))\n")
    subprocess.run([sys.executable, "-c", code, str(workspace)], check=True, env={**os.environ, "MARKER_DIR": str(marker_dir)})


def _put(server: str, data: bytes, headers: dict) -> httpx.Response:
    return httpx.put(f"{server}/v1/artifacts/{hashlib.sha256(data).hexdigest()}", content=data, headers=headers)


def _run(module: bytes, pod_jit: dict, signing_key=None, signature=None) -> TuningRunCreate:
    payload = run_payload(CUDNN_FILE, summary={"entries": 42, "flashinfer_jit": pod_jit})
    payload["artifacts"].append({"kind": "flashinfer_jit_module", "name": f"flashinfer-jit/{MODULE}.tar.gz",
                                 "media_type": "application/gzip", "sha256": hashlib.sha256(module).hexdigest()})
    run = TuningRunCreate.model_validate(payload)
    if signing_key is not None:
        signature = sign_run(signing_key, run.key, run.environment, run.artifacts, run.summary)
    return run.model_copy(update={"signature": signature})


def _post(server: str, run: TuningRunCreate, headers: dict) -> httpx.Response:
    return httpx.post(f"{server}/v1/tunings", content=run.model_dump_json(),
                      headers={**headers, "Content-Type": "application/json"})


def test_a_replaced_jit_library_never_loads_on_a_pod(server, tmp_path):
    pod_env = {**os.environ, "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "pod-home")}
    pod_jit = pod_jit_environment(pod_env)
    if pod_jit is None:
        pytest.skip("FlashInfer finds no CUDA toolkit here, so a pod cannot place JIT modules")
    workspace = Path(pod_jit["workspace_dir"])
    markers = tmp_path / "markers"
    markers.mkdir()

    admin = admin_headers()
    tokens = {}
    for name, scope in (("gpu-node-1", "tune"), ("pods", "push")):
        answer = httpx.post(f"{server}/v1/tokens", json={"name": name, "scope": scope}, headers=admin)
        assert answer.status_code == 201, answer.text
        tokens[scope] = {"Authorization": f"Bearer {answer.json()['token']}"}
    node_key_files = generate_signing_key(tmp_path / "node-key")
    node_key = load_signing_key(node_key_files.private_path)
    pod_env["TUNECACHE_TRUSTED_KEYS"] = str(node_key_files.public_path)

    def pull(*extra: str, env: dict = pod_env) -> subprocess.CompletedProcess:
        return forked.run(["pull", "--server", server, "--model", MODEL, "--max-num-batched-tokens", "8192",
                           "--dest", str(tmp_path / "tactics"), "--environment", str(CUDNN_FILE), *extra], env=env)

    # The fleet's node publishes a signed run; a pod installs and loads its module.
    legit = _module_with(tmp_path, "node", _shared_library(tmp_path, "legit"))
    for data in (CUDNN_FILE.read_bytes(), legit):
        assert _put(server, data, tokens["tune"]).status_code in (200, 201)
    published = _post(server, _run(legit, pod_jit, signing_key=node_key), tokens["tune"])
    assert published.status_code == 201 and published.json()["is_current"], published.text
    first = pull("--jit")
    assert first.returncode == 0 and "installed 1 FlashInfer JIT modules" in first.stderr, first.stderr
    _load_every_module(workspace, markers)
    assert (markers / "legit").is_file()

    # The attacker: the current module from the open read path, its library replaced.
    current = httpx.post(f"{server}/v1/tunings/lookup", json={k: published.json()[k] for k in ("key", "environment")}).json()
    module_sha = next(a["sha256"] for a in current["artifacts"] if a["kind"] == "flashinfer_jit_module")
    downloaded = httpx.get(f"{server}/v1/artifacts/{module_sha}").content
    unpacked = tmp_path / "attacker"
    install_jit_module(downloaded, unpacked)
    so = unpacked / "cached_ops" / MODULE / f"{MODULE}.so"
    times = so.stat().st_mtime_ns
    so.write_bytes(_shared_library(tmp_path, "evil"))
    os.utime(so, ns=(times, times))
    evil = module_tarball(unpacked, MODULE)
    assert evil != legit

    # 1. No token: nothing is stored.
    assert _put(server, evil, {}).status_code == 401
    assert _post(server, _run(evil, pod_jit), {}).status_code == 401
    # 2. A pod's push token: stored as an unverified pod run, whatever the body says; not current.
    assert _put(server, evil, tokens["push"]).status_code in (200, 201)
    pushed = _post(server, _run(evil, pod_jit), tokens["push"]).json()
    assert (pushed["trigger"], pushed["verified"], pushed["is_current"]) == ("pod", False, False)
    assert httpx.post(f"{server}/v1/tunings/lookup", json={k: current[k] for k in ("key", "environment")}).json()["id"] \
        == current["id"]

    # 3. A stolen tune token without the signing key: the service makes the run current, the pod refuses it.
    attacker_key = load_signing_key(generate_signing_key(tmp_path / "attacker-key").private_path)
    attempts = {
        "unsigned": _run(evil, pod_jit),
        "signed by another key": _run(evil, pod_jit, signing_key=attacker_key),
        "the node's signature copied": _run(evil, pod_jit, signature=_run(legit, pod_jit, signing_key=node_key).signature),
    }
    for what, run in attempts.items():
        stolen = _post(server, run, tokens["tune"])
        assert stolen.status_code == 201 and stolen.json()["is_current"], (what, stolen.text)
        refused = pull("--jit")
        assert refused.returncode == 14, (what, refused.returncode, refused.stderr)
        assert "refused" in refused.stderr and "nothing was installed" in refused.stderr, refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr  # one clear line
        installed_so = workspace / "cached_ops" / MODULE / f"{MODULE}.so"
        assert hashlib.sha256(installed_so.read_bytes()).digest() != hashlib.sha256(so.read_bytes()).digest(), what
    # A pod without trusted keys still takes the tactics, but never the module.
    no_keys = {k: v for k, v in pod_env.items() if k != "TUNECACHE_TRUSTED_KEYS"}
    tactics_only = pull("--jit", env=no_keys)
    assert tactics_only.returncode == 0, tactics_only.stderr
    assert "no trusted keys are set" in tactics_only.stderr and "installed 1 FlashInfer JIT modules" not in tactics_only.stderr

    # FlashInfer loads what is installed: still the node's library, never the attacker's.
    _load_every_module(workspace, markers)
    assert not (markers / "evil").exists()
    assert (markers / "legit").is_file()


def _certificates(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A private CA and a server certificate it signed for 127.0.0.1: (ca.pem, cert.pem, key.pem)."""
    import datetime as dt
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.timezone.utc)

    def build(subject: str, issuer: str, public_key, signing_key, ca: bool):
        builder = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
                   .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
                   .public_key(public_key).serial_number(x509.random_serial_number())
                   .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if not ca:
            builder = builder.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                                            critical=False)
        return builder.sign(signing_key, hashes.SHA256())

    ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_cert = build("tunecache test CA", "tunecache test CA", ca_key.public_key(), ca_key, ca=True)
    server_cert = build("127.0.0.1", "tunecache test CA", server_key.public_key(), ca_key, ca=False)
    paths = tmp_path / "ca.pem", tmp_path / "cert.pem", tmp_path / "key.pem"
    paths[0].write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(server_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                  serialization.NoEncryption()))
    return paths


def test_tls_is_verified_and_a_token_never_goes_out_in_clear_text(tmp_path):
    from tests.support.serve import free_port

    ca, cert, key = _certificates(tmp_path)
    port = free_port()
    log = open(tmp_path / "serve.log", "w")
    server = subprocess.Popen([tunecache_executable(), "serve", "--port", str(port), "--ssl-certfile", str(cert),
                               "--ssl-keyfile", str(key)], stdout=log, stderr=log,
                              env={**os.environ, "TUNECACHE_WORKER": "off"})
    url = f"https://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                if httpx.get(f"{url}/v1/health", verify=str(ca), timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                assert server.poll() is None, (tmp_path / "serve.log").read_text()
                subprocess.run(["sleep", "0.1"])

        def token_list(env: dict) -> subprocess.CompletedProcess:
            return subprocess.run([tunecache_executable(), "token", "list", "--server", url],
                                  env={**os.environ, "TUNECACHE_ATTEMPTS": "1", **env}, capture_output=True, text=True,
                                  timeout=60)

        unverified = token_list({})  # the system's CAs do not know this one
        assert unverified.returncode == 4 and "CERTIFICATE_VERIFY_FAILED" in unverified.stderr, unverified.stderr
        verified = token_list({"TUNECACHE_CA_BUNDLE": str(ca)})
        assert verified.returncode == 0 and verified.stdout.startswith("admin\tadmin\t"), verified.stderr
    finally:
        server.terminate()
        server.wait(timeout=20)
        log.close()

    clear = subprocess.run([tunecache_executable(), "token", "list", "--server", "http://tunecache.example:8321"],
                           env={**os.environ, "TUNECACHE_TOKEN": "tc_0123456789abcdef_" + "z" * 43},
                           capture_output=True, text=True, timeout=60)
    assert clear.returncode == 13 and "refusing to send a token in clear text to tunecache.example" in clear.stderr


def test_bad_tls_files_and_token_names_are_one_line_errors(tmp_path):
    missing = subprocess.run([tunecache_executable(), "serve", "--port", "1", "--ssl-certfile", str(tmp_path / "nope.pem"),
                              "--ssl-keyfile", str(tmp_path / "nope.key")], capture_output=True, text=True, timeout=60,
                             env={**os.environ, "TUNECACHE_WORKER": "off"})
    assert missing.returncode == 11 and missing.stderr.strip().startswith("tunecache: error: cannot serve TLS with")
    assert "Traceback" not in missing.stderr
    _, cert, _ = _certificates(tmp_path)
    (tmp_path / "other").mkdir()
    _, _, other_key = _certificates(tmp_path / "other")  # a key that is not the certificate's
    mismatched = subprocess.run([tunecache_executable(), "serve", "--port", "1", "--ssl-certfile", str(cert),
                                 "--ssl-keyfile", str(other_key)], capture_output=True, text=True, timeout=60,
                                env={**os.environ, "TUNECACHE_WORKER": "off"})
    assert mismatched.returncode == 11 and "Traceback" not in mismatched.stderr, mismatched.stderr
    for name in ("", "?x", "../x", "a/b", "."):
        revoked = subprocess.run([tunecache_executable(), "token", "revoke", "--server", "http://127.0.0.1:1", name],
                                 capture_output=True, text=True, timeout=60)
        assert revoked.returncode == 2 and "token name" in revoked.stderr, (name, revoked.stderr)


def test_an_empty_token_is_refused_never_the_local_admin_token(server):
    """On a machine with a tunecache serve's admin.token, ``--token ''`` or ``TUNECACHE_TOKEN=``
    (an optional Secret left blank) would otherwise fall back to that file and act as admin."""
    as_admin = subprocess.run([tunecache_executable(), "token", "create", "--name", "reader", "--scope", "read", "--server", server],
                              capture_output=True, text=True, timeout=60)
    assert as_admin.returncode == 0, as_admin.stderr  # no token given: the local admin.token, as documented
    for how, args, env in (("--token", ["--token", ""], {}), ("TUNECACHE_TOKEN", [], {"TUNECACHE_TOKEN": ""})):
        refused = subprocess.run([tunecache_executable(), *args, "token", "create", "--name", "sneaky", "--scope", "admin",
                                  "--server", server], capture_output=True, text=True, timeout=60,
                                 env={**os.environ, **env})
        assert refused.returncode == 13, refused.stderr
        assert refused.stderr.strip() == f"tunecache: error: {how} is set but empty: an empty token is refused, never " \
                                         "taken as no token (which would fall back to TUNECACHE_TOKEN_FILE or a local " \
                                         "server's admin.token); unset it, or give a token"
    names = [t["name"] for t in httpx.get(f"{server}/v1/tokens", headers=admin_headers()).json()]
    assert "sneaky" not in names and "reader" in names
