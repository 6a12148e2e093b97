"""GPU-only: pods unlike the tuning node boot at their floor from one stored run.

Stands for ``scripts/gpu_fleet_pods.py`` (docs/gpu.md, "Pods unlike the tuning node"; results
under ``results/gpu/2026-12-03-fleet-pods/``): one cold tuning, then for each pod setup
(another HOME, a uid without an account, other cache directories, another package prefix, a
copy of the tuner, another engine variant tuned through the service's job queue) a tunecache-warm boot from empty caches and a local-warm boot over what it
left, both through the plugin. The issue's bar: each tunecache-warm boot compiles nothing and
is within 1.10x of the local-warm boot of the same setup and compiles nothing it does not.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from tests.support.paths import ROOT

SCRIPT = ROOT / "scripts" / "gpu_fleet_pods.py"


@pytest.mark.gpu
def test_every_pod_setup_boots_at_its_floor_from_one_stored_run(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    for step in (["tune"], ["pods", "--pair", "1"]):
        result = subprocess.run([sys.executable, str(SCRIPT), *step, "--out", str(out), "--work", str(work)],
                                capture_output=True, text=True, timeout=3000)
        assert result.returncode == 0, result.stdout + result.stderr
    boots = json.loads((out / "fleet_pods.json").read_text())
    setups = {b["pod"] for b in boots if b["boot"] == "tunecache_warm"}
    assert setups == {"same_as_tuner", "other_home", "non_root_user", "other_cache_dirs", "other_prefix", "engine_variant"}
    [variant] = [b for b in boots if b["pod"] == "engine_variant_tuner"]
    assert variant["job_status"] == "succeeded" and variant["variant"] and not variant["is_current"]
    for setup in setups:
        [warm] = [b for b in boots if b["pod"] == setup and b["boot"] == "tunecache_warm"]
        [local] = [b for b in boots if b["pod"] == setup and b["boot"] == "local_warm"]
        # compiling nothing the local-warm boot does not (both enter FlashInfer's autotune context)
        beyond = {kind: n for kind, n in warm["compiled"].items() if n > local["compiled"].get(kind, 0)}
        assert not beyond, (setup, beyond, warm["tunecache_lines"])
        assert warm["ready_s"] <= 1.10 * local["ready_s"], (setup, warm["ready_s"], local["ready_s"])
