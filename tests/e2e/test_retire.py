"""``tunecache retire RUN`` (issue 39, Why 8: no command took a run out of use): a retired run
is not current, never served, kept for history and audited; the key falls back to the newest
usable run before it, or to none."""

from __future__ import annotations

import httpx

from tests.support.builders import h200_key
from tests.support.cli import MODEL, push, tunecache
from tests.support.paths import CUDNN_FILE
from tests.support.serve import as_admin
from tunecache.cli_kit import ExitCode


def _lookup(server) -> httpx.Response:
    import json

    environment = json.loads(CUDNN_FILE.read_text())["_metadata"]
    return httpx.post(f"{server}/v1/tunings/lookup", json={"key": h200_key().model_dump(), "environment": environment})


def test_retire_takes_a_run_out_of_use_and_the_key_falls_back(server):
    assert push(server).returncode == 0 and push(server).returncode == 0
    first, second = sorted(r["id"] for r in as_admin.get(f"{server}/v1/tunings").json()["items"])
    assert _lookup(server).json()["id"] == second

    retired = tunecache("retire", str(second), "--server", server)
    assert retired.returncode == 0, retired.stderr
    assert retired.stdout.splitlines() == [
        f"run {second} of {MODEL} on NVIDIA H200 is retired: never served again; run {first} is current in its place"]
    assert _lookup(server).json()["id"] == first  # served at once: the lookup cache moved on
    run = as_admin.get(f"{server}/v1/tunings/{second}").json()
    assert run["retired_at"] is not None and run["is_current"] is False  # kept for history
    assert as_admin.get(f"{server}/v1/tunings").json()["total"] == 2
    shown = tunecache("history", "--server", server, "--model", MODEL)  # the history says it, as the run's page
    assert "succeeded (retired)" in next(line for line in shown.stdout.splitlines() if line.startswith(f"{second} ")), \
        shown.stdout
    page = httpx.get(f"{server}/runs/{second}")
    assert page.status_code == 200 and 'id="retired"' in page.text and 'id="promote-form"' not in page.text
    again = tunecache("retire", str(second), "--server", server)  # idempotent, nothing moves
    assert again.returncode == 0 and _lookup(server).json()["id"] == first, again.stderr

    last = tunecache("retire", str(first), "--server", server)
    assert last.stdout.splitlines() == [
        f"run {first} of {MODEL} on NVIDIA H200 is retired: never served again; no run is current for its key now"]
    assert _lookup(server).status_code == 404
    refused = tunecache("promote", str(second), "--server", server)  # a retired run never comes back
    assert refused.returncode == int(ExitCode.JOB_CONFLICT) and "retired" in refused.stderr, refused.stderr
    assert push(server).returncode == 0  # a new run of the key is current again
    assert _lookup(server).json()["id"] > second

    details = [event["detail"] or "" for event in as_admin.get(f"{server}/v1/audit").json()["events"]]
    assert f"retired run {second} of {MODEL} (current now: run {first})" in details, details
    assert f"retired run {first} of {MODEL} (current now: none)" in details, details


def test_retire_needs_an_admin_token_and_an_existing_run(server):
    assert push(server).returncode == 0
    [run] = as_admin.get(f"{server}/v1/tunings").json()["items"]
    anonymous = httpx.post(f"{server}/v1/tunings/{run['id']}/retire")
    assert anonymous.status_code == 401, anonymous.text
    missing = tunecache("retire", "999999", "--server", server)
    assert missing.returncode == int(ExitCode.SERVER_ERROR)
    assert missing.stderr.splitlines() == ["tunecache: error: server answered 404: no tuning run 999999"]
    assert _lookup(server).json()["id"] == run["id"]
