"""What reads show (:mod:`tunecache.service.redaction`): engine arguments as readers see them,
and who sees identities. The routes and pages that apply it: tests/e2e/test_read_scope.py."""

from __future__ import annotations

import pytest

from tunecache.contract import Scope
from tunecache.service.redaction import HIDDEN, engine_args_for_readers, shows_identities
from tunecache.service.settings import Settings
from tunecache.service.tokens import ANONYMOUS, Caller


def test_engine_args_for_readers_are_what_the_allow_list_takes_today():
    shown = engine_args_for_readers({
        "max_model_len": 8192, "enforce_eager": True, "gpu_memory_utilization": 0.85, "kv_cache_dtype": "fp8_e4m3",
        "hf_token": "hf_forged", "trust_remote_code": True, "worker_cls": "evil.Worker",
        "hf_overrides": {"auto_map": {"AutoConfig": "x.y"}}, "logits_processors": ["a.b"],
        "compilation_config": {"mode": 3, "inductor_passes": {"p": "m.f"}, "cache_dir": "/tmp/x"},
        "download_dir": "/" + "d" * 200, "not an identifier": 1, "a" * 65: 1,
    })
    assert shown == {"max_model_len": 8192, "enforce_eager": True, "gpu_memory_utilization": 0.85,
                     "kv_cache_dtype": "fp8_e4m3", "compilation_config": {"mode": 3}}
    assert engine_args_for_readers(None) is None
    assert engine_args_for_readers({"hf_overrides": {}}) is None  # nothing left: as no arguments
    assert engine_args_for_readers({"compilation_config": {"cache_dir": "/x"}}) is None  # an object left empty
    assert engine_args_for_readers(["max_model_len", 1]) is None  # not an object at all


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 10 ** 70, -1, "8192"])
def test_engine_args_for_readers_drop_values_out_of_the_allow_lists_bounds(value):
    assert engine_args_for_readers({"max_model_len": value, "max_num_seqs": 8}) == {"max_num_seqs": 8}


@pytest.mark.parametrize(("scope", "setting", "shown"), [
    (None, False, False), (Scope.READ, False, False), (Scope.PUSH, False, False), (Scope.TUNE, False, False),
    (Scope.ADMIN, False, True), (None, True, True), (Scope.READ, True, True),
])
def test_identities_are_for_admins_unless_the_setting_opens_them(scope, setting, shown, tmp_path):
    caller = ANONYMOUS if scope is None else Caller(name="someone", scope=scope)
    settings = Settings(database_url="sqlite://", data_dir=tmp_path, reads_show_identities=setting)
    assert shows_identities(caller, settings) is shown
    assert HIDDEN == "(hidden)"
