"""vLLM 0.33/0.34's startup plans harvested on the tuner (tunecache.service.tuner.harvest.StartupPlanHarvester)."""

from __future__ import annotations

from tunecache.contract import ArtifactKind


def test_the_startup_plan_harvest_keeps_only_plans_vllm_loads_under_their_name(tmp_path):
    """vLLM 0.33/0.34's ``$VLLM_CACHE_ROOT/startup_plan/`` (tunecache.service.tuner.harvest.StartupPlanHarvester)."""
    import io
    import json
    import tarfile

    from tunecache.service.tuner.harvest import StartupPlanHarvester

    plans = tmp_path / "scratch" / "vllm-cache" / "startup_plan"
    plans.mkdir(parents=True)
    good = {"schema": 2, "fingerprint": "0123456789abcdef", "kv_cache_memory_bytes": 1 << 30,
            "free_memory_baseline": 2 << 30}
    (plans / "startup_plan_0123456789abcdef.json").write_text(json.dumps(good))
    (plans / "startup_plan_fedcba9876543210.json").write_text(json.dumps(good))  # another fingerprint inside
    (plans / "startup_plan_0123456789abcdef.json.tmp.12").write_text(json.dumps(good))  # vLLM's half-written one
    out = tmp_path / "out"
    out.mkdir()
    [artifact], _ = StartupPlanHarvester().harvest(tmp_path / "scratch", out)
    assert artifact.kind == ArtifactKind.VLLM_STARTUP_PLAN
    with tarfile.open(fileobj=io.BytesIO((out / "vllm-startup-plan.tar.gz").read_bytes())) as tar:
        assert [m.name.removeprefix("./") for m in tar.getmembers() if m.isfile()] == [
            "startup_plan_0123456789abcdef.json"]
    (plans / "startup_plan_0123456789abcdef.json").unlink()
    assert StartupPlanHarvester().harvest(tmp_path / "scratch", out) == ([], {})
