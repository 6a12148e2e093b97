"""The hand-off from an engine's main process to its workers (tunecache.client.boot.handoff):
exactly the variables the pod guide declares, and what is handed over is what is read back."""

from __future__ import annotations

from pathlib import Path

from tunecache.client.boot.handoff import VARIABLES, Handoff
from tunecache.client.settings import POD_HANDOFF_VARIABLES


def test_the_record_carries_exactly_the_declared_hand_off_variables():
    assert set(VARIABLES.values()) == set(POD_HANDOFF_VARIABLES)
    everything = Handoff(boot_started_ns=12, warm_state_run=7, compile_cache=Path("/c/run-7.tar.gz"),
                         engine_args={"max_model_len": 4096}, flashinfer_aot_dir=Path("/w/aot"), deep_gemm_dir=Path("/dg"))
    assert set(everything.to_environment()) == set(POD_HANDOFF_VARIABLES)


def test_what_is_handed_over_is_read_back_and_what_is_not_set_stays_unset(monkeypatch):
    for variable in VARIABLES.values():  # set, then removed: monkeypatch then removes what the test hands over
        monkeypatch.setenv(variable, "")
        monkeypatch.delenv(variable)
    assert Handoff.from_environment() == Handoff()
    handed = Handoff(warm_state_run=7, engine_args={"max_model_len": 4096}, deep_gemm_dir=Path("/dg"))
    assert handed.to_environment() == {"TUNECACHE_WARM_STATE_RUN": "7", "TUNECACHE_ENGINE_ARGS": '{"max_model_len": 4096}',
                                       "DG_JIT_CACHE_DIR": "/dg"}
    handed.hand_over()
    Handoff(boot_started_ns=12).hand_over()
    assert Handoff.from_environment() == Handoff(boot_started_ns=12, warm_state_run=7,
                                                 engine_args={"max_model_len": 4096}, deep_gemm_dir=Path("/dg"))
    assert Handoff.from_environment({"TUNECACHE_ENGINE_ARGS": "[1]", "TUNECACHE_BOOT_STARTED_NS": "x",
                                     "TUNECACHE_COMPILE_CACHE": ""}) == Handoff()
    for not_a_run in ("x", "0", "-3", "7.0", " "):  # a run id is a whole number from 1
        assert Handoff.from_environment({"TUNECACHE_WARM_STATE_RUN": not_a_run}) == Handoff()
