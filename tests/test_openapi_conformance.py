"""The OpenAPI document is what the service does: schemathesis, every check, a fixed seed,
against a real ``tunecache serve``. Rules a JSON schema cannot state (the body must hash to
the path's sha256, cross-field rules of a run, free-form JSON without NUL) are listed in
``schemathesis.toml``."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_schemathesis_finds_nothing(server):
    executable = shutil.which("schemathesis")
    assert executable, "schemathesis is not installed (pip install -e '.[test]')"
    result = subprocess.run(
        [executable, "run", f"{server}/openapi.json", "--checks", "all", "--seed", "1", "--max-examples", "30"],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert "11 operations" in result.stdout or "Tested: 11" in result.stdout, result.stdout[-2000:]
