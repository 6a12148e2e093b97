"""vLLM 0.33/0.34's startup plans from a run (tunecache.client.startup_plan): only files vLLM would
load under their name are staged, and a worker places only the plan of the fingerprint its own
vLLM computes, naming the run's others when none is its."""

from __future__ import annotations

import io
import json
import tarfile
from types import SimpleNamespace

from tunecache.client.startup_plan import StartupPlans, place_plan
from tunecache.contract import ArtifactKind
from tunecache.engines.vllm.startup_plan import plan_file_name, plan_fingerprint

MINE, THEIRS = "0123456789abcdef", "fedcba9876543210"


def plan(fingerprint: str, **fields) -> bytes:
    return json.dumps({"schema": 2, "fingerprint": fingerprint, "kv_cache_memory_bytes": 40 << 30,
                       "free_memory_baseline": 70 << 30, **fields}).encode()


def tarball(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_a_plan_is_one_vllm_loads_under_its_name_only():
    assert plan_fingerprint(plan_file_name(MINE), plan(MINE)) == MINE
    assert plan_fingerprint(plan_file_name(MINE), plan(THEIRS)) is None  # named for another fingerprint
    assert plan_fingerprint(plan_file_name(MINE), plan(MINE, schema=1)) == MINE  # 0.33's
    assert plan_fingerprint(plan_file_name(MINE), plan(MINE, schema=3)) is None  # _load_plan refuses another schema
    assert plan_fingerprint(plan_file_name(MINE), plan(MINE, kv_cache_memory_bytes="40G")) is None
    assert plan_fingerprint("startup_plan_x.json", plan(MINE)) is None


def test_the_install_stages_the_runs_plans_for_the_workers_and_nothing_where_vllm_reads(tmp_path):
    data = tarball({plan_file_name(MINE): plan(MINE), plan_file_name(THEIRS): plan(MINE), "other.json": b"{}"})
    fetched = SimpleNamespace(warm_state={ArtifactKind.VLLM_STARTUP_PLAN: data}, drift={})
    written = StartupPlans(tmp_path / "staged").stage(fetched)()
    assert written == {"warm_state": ("startup plans (1, staged for the workers)",)}
    assert sorted(p.name for p in (tmp_path / "staged").iterdir()) == [plan_file_name(MINE)]


def test_a_worker_places_the_plan_of_its_own_fingerprint(tmp_path):
    staged = tmp_path / "staged"
    staged.mkdir()
    (staged / plan_file_name(MINE)).write_bytes(plan(MINE))
    target = tmp_path / "vllm" / "startup_plan" / plan_file_name(MINE)
    line = place_plan(staged, MINE, target)
    assert line.startswith(f"startup plan placed at {target} (fingerprint {MINE})")
    assert target.read_bytes() == plan(MINE)
    assert "in place already" in place_plan(staged, MINE, target)


def test_a_worker_of_another_fingerprint_gets_none_and_says_which_the_run_has(tmp_path):
    staged = tmp_path / "staged"
    staged.mkdir()
    (staged / plan_file_name(THEIRS)).write_bytes(plan(THEIRS))
    target = tmp_path / "vllm" / "startup_plan" / plan_file_name(MINE)
    line = place_plan(staged, MINE, target)
    assert line.startswith(f"startup plan not placed, vLLM profiles: the run has none for this worker's fingerprint "
                           f"{MINE} ({THEIRS})")
    assert not target.exists()
