"""The OpenAPI document is what the service does: schemathesis, every check, a fixed seed,
against a real ``tunecache serve``. Rules a JSON schema cannot state (the body must hash to
the path's sha256, cross-field rules of a run, free-form JSON without NUL) are listed in
``schemathesis.toml``."""

from __future__ import annotations

import shutil
import subprocess

import httpx
import pytest

from tests.support.serve import as_admin
from tests.support.paths import ROOT



@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_schemathesis_finds_nothing(server):
    """As an admin (every route reachable); schemathesis also sends each request without the
    token and with a made-up one and checks the routes that need one refuse it."""
    executable = shutil.which("schemathesis")
    assert executable, "schemathesis is not installed (pip install -e '.[test]')"
    # A token of its own, with a name it will not come up with for DELETE /v1/tokens/{name}.
    token = as_admin.post(f"{server}/v1/tokens", json={"name": "conformance-7c1f93b2d4e5a6f8", "scope": "admin"}).json()["token"]
    result = subprocess.run(
        [executable, "run", f"{server}/openapi.json", "--checks", "all", "--seed", "1", "--max-examples", "30",
         # a cancelled job stays readable: DELETE /v1/tuning-jobs/{id} cancels (schemathesis.toml)
         "--exclude-checks", "use_after_free",
         "--header", f"Authorization: Bearer {token}"],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    # every operation of the document was tested (GET /metrics included)
    operations = sum(len(item) for item in httpx.get(f"{server}/openapi.json").json()["paths"].values())
    assert f"Tested: {operations}" in result.stdout, result.stdout[-2000:]
