"""tunecache.contract.engine_args.allowed_engine_args: what a stored row or a pod's engine keeps of
its engine arguments is exactly what check_engine_args takes."""

from __future__ import annotations

import pytest

from tunecache.contract.engine_args import allowed_engine_args, check_engine_args


def test_a_stored_dict_keeps_its_allowed_arguments_and_fields_only():
    stored = {"max_model_len": 8192, "trust_remote_code": True, "hf_token": "hf_x", "block_size": -3,
              "gpu_memory_utilization": 0.8, "compilation_config": {"mode": 3, "cache_dir": "/etc", "backend": "evil.x"},
              "kv_cache_dtype": "fp8", "tokenizer": "/root"}
    kept = allowed_engine_args(stored)
    assert kept == {"compilation_config": {"mode": 3}, "gpu_memory_utilization": 0.8, "kv_cache_dtype": "fp8",
                    "max_model_len": 8192}
    assert check_engine_args(kept) == kept


@pytest.mark.parametrize("stored", [None, [1, 2], "max_model_len", {"compilation_config": {"cache_dir": "/x"}},
                                    {"compilation_config": "3"}, {"cudagraph_capture_sizes": list(range(1, 129))}])
def test_nothing_is_kept_of_what_names_no_allowed_argument(stored):
    assert allowed_engine_args(stored) == {}


@pytest.mark.parametrize("args, named", [
    ({"max_model_len": 8192.0}, "engine_args.max_model_len"),
    ({"compilation_config": {"cudagraph_capture_sizes": [1, 2.0]}}, "engine_args.compilation_config.cudagraph_capture_sizes"),
])
def test_a_whole_number_written_as_a_fraction_is_refused(args, named):
    """``8192.0`` reached ``vllm.LLM`` as a float where vLLM's argument is an int."""
    from tunecache.contract import EngineArgRefused, check_engine_args

    with pytest.raises(EngineArgRefused) as refused:
        check_engine_args(args)
    assert named in str(refused.value) and "whole number" in str(refused.value)
    assert check_engine_args({"max_model_len": 8192, "gpu_memory_utilization": 0.5}) == {
        "max_model_len": 8192, "gpu_memory_utilization": 0.5}
