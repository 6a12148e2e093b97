"""What a new user met on the pod side (issue 39, Why 8): doctor's exit code is pull's, a
full stdout is one line and a documented exit code, ``token create`` that cannot deliver its
token revokes it, ``push --arch`` must match the file's GPU."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.support.cli import MODEL, pull, push, tunecache, tunecache_executable
from tests.support.paths import CUDNN_FILE
from tests.support.serve import as_admin
from tunecache.cli_kit import ExitCode

# What this module tests happens on the pod: its server runs on SQLite only (tests/conftest.py).
SERVER_DATABASE_INCIDENTAL = True

FULL = "/dev/full"
pytestmark = pytest.mark.skipif(not os.path.exists(FULL), reason="needs /dev/full (Linux)")


def _into_dev_full(*args: str) -> subprocess.CompletedProcess:
    """``tunecache ARGS > /dev/full``: every write to stdout fails with ENOSPC, as on a full disk."""
    with open(FULL, "w") as full:
        return subprocess.run([tunecache_executable(), *args], stdout=full, stderr=subprocess.PIPE, text=True,
                              timeout=120)


def test_doctor_exits_as_pull_does_for_a_run_the_pod_refuses(server, tmp_path, node_signing_key):
    """A pod that trusts keys installs nothing of an unsigned run: pull exits 14; doctor said
    so ("will not load") and exited 0. Both now come from one decision
    (:func:`tunecache.client.run_trust.trusted_signer`)."""
    assert push(server).returncode == 0  # unsigned
    pulled = pull(server, tmp_path / "dest")
    assert pulled.returncode == int(ExitCode.UNTRUSTED_RUN), pulled.stderr
    doctor = tunecache("doctor", "--server", server, "--model", MODEL, "--max-num-batched-tokens", "8192",
                       "--environment", str(CUDNN_FILE))
    assert doctor.returncode == pulled.returncode, doctor.stderr
    assert "flashinfer_autotune_v1: will not load: the run is refused" in doctor.stdout
    [line] = doctor.stderr.splitlines()
    assert line.startswith("tunecache: error: tuning run ") and "refused" in line and "nothing would be installed" in line


@pytest.mark.parametrize("command", ["history", "doctor"])
def test_a_full_stdout_is_one_line_and_exit_12(server, command):
    """``history > /dev/full`` and ``doctor > /dev/full`` ended in a Python traceback."""
    assert push(server).returncode == 0
    args = {"history": ["history", "--server", server],
            "doctor": ["doctor", "--server", server, "--model", MODEL, "--max-num-batched-tokens", "8192",
                       "--environment", str(CUDNN_FILE)]}[command]
    result = _into_dev_full(*args)
    assert result.returncode == int(ExitCode.INSTALL_FAILED), result.stderr
    assert result.stderr.splitlines() == ["tunecache: error: cannot write to stdout: No space left on device"]


def test_a_token_that_cannot_be_printed_is_revoked(server):
    """``token create > /dev/full``: the service kept the token's hash and its only copy was
    lost. Now the token is revoked at once, and the line says so."""
    result = _into_dev_full("token", "create", "--server", server, "--name", "lost-one", "--scope", "read")
    assert result.returncode == int(ExitCode.INSTALL_FAILED), result.stderr
    assert result.stderr.splitlines() == [
        "tunecache: error: cannot write to stdout: No space left on device; token 'lost-one' was revoked (its only "
        "copy was lost): create another"]
    [token] = [t for t in as_admin.get(f"{server}/v1/tokens").json() if t["name"] == "lost-one"]
    assert token["revoked_at"] is not None
