"""GPU-only: the end-to-end script (serve -> tune -> pull -> 0 misses) on a real GPU.

Stands for ``scripts/gpu_e2e.py``, whose full H200 run (cudnn + cublaslt) is recorded in
``results/gpu/2026-11-30-llama-3.1-8b-gemm/``. Here with the fast cublaslt backend only.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from tests.support.paths import ROOT

SCRIPT = ROOT / "scripts" / "gpu_e2e.py"


@pytest.mark.gpu
def test_tuned_file_installs_with_zero_misses(tmp_path):
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--backends", "cublaslt", "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work")],
        capture_output=True, text=True, timeout=900,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((tmp_path / "out" / "gpu_e2e.json").read_text())
    assert summary["tuned"]["cache_misses"] == 0
    assert summary["entries"] == 4 * 21  # 4 decoder GEMMs x 21 hybrid token buckets up to 8192
