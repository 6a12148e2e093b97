"""Engine arguments by allow-list (tunecache.contract.engine_args) at the HTTP doors of a live
`tunecache serve`, on SQLite and PostgreSQL: each argument that loads code, reads or writes a
path on the tuning node, or contradicts the key is a 422 naming it at the jobs API (no job is
queued) and at the reports API (no report is stored); so is an unknown field of
``compilation_config`` and a value out of its bounds; the allowed ones are taken."""

from __future__ import annotations

import json

import httpx

from tests.support.builders import file_environment, h200_key
from tests.support.paths import CUDNN_FILE
from tests.support.serve import as_admin

#: Each was taken (202) before the allow-list, and each loads code, touches a path or an
#: address on the tuning node, or contradicts the key, in vLLM 0.25's own source (issue 39).
DANGEROUS = {
    "trust_remote_code": True,
    "hf_overrides": {"auto_map": {"AutoConfig": "evil/repo--mod.Config"}},
    "model_impl": "transformers",
    "worker_cls": "evil.Worker",
    "worker_extension_cls": "evil.Extension",
    "scheduler_cls": "evil.Scheduler",
    "distributed_executor_backend": "evil.Executor",
    "model_class_overrides": {"LlamaForCausalLM": "evil.Model"},
    "logits_processors": ["evil.Processor"],
    "io_processor_plugin": "evil",
    "kv_transfer_config": {"kv_connector": "X", "kv_connector_module_path": "evil.connector"},
    "download_dir": "/etc",
    "tokenizer": "/root/.ssh",
    "hf_config_path": "/etc",
    "model_weights": "/mnt/other",
    "generation_config": "/etc",
    "allowed_local_media_path": "/",
    "otlp_traces_endpoint": "http://evil:4317",
    "pipeline_parallel_size": 2,
    "prefill_context_parallel_size": 2,
    "quantization_config": {"quant_method": "fp8"},
}
NESTED = {
    "compilation_config.inductor_passes": {"compilation_config": {"inductor_passes": {"post_grad": "evil.fn"}}},
    "compilation_config.cache_dir": {"compilation_config": {"mode": 3, "cache_dir": "/etc/cron.d"}},
    "compilation_config.debug_dump_path": {"compilation_config": {"debug_dump_path": "/tmp/x"}},
    "compilation_config.backend": {"compilation_config": {"backend": "evil.backend"}},
}
OUT_OF_BOUNDS = {
    "max_model_len": ({"max_model_len": -1}, "engine_args.max_model_len is -1: must be from 1 to"),
    "gpu_memory_utilization": ({"gpu_memory_utilization": 5}, "engine_args.gpu_memory_utilization is 5: must be over 0"),
    "kv_cache_dtype": ({"kv_cache_dtype": "../x"}, "engine_args.kv_cache_dtype must be one of"),
    "cudagraph_capture_sizes": ({"compilation_config": {"cudagraph_capture_sizes": [1, 2, 1 << 20]}},
                                "engine_args.compilation_config.cudagraph_capture_sizes entry 1048576 is 1048576"),
    "enforce_eager": ({"enforce_eager": "yes"}, "engine_args.enforce_eager must be true or false"),
}


def refusal(answer: httpx.Response) -> str:
    """The one message of a 422 on ``engine_args`` (its JSON body names the argument)."""
    assert answer.status_code == 422, answer.text
    [error] = answer.json()["detail"]
    assert error["loc"][:2] == ["body", "engine_args"], error
    return error["msg"]


def job(args: dict) -> dict:
    return {"key": h200_key().model_dump(), "hf_config": {"model_type": "llama"}, "warmup": "vllm", "engine_args": args}


def report(args: dict) -> dict:
    return {"key": h200_key().model_dump(), "environment_hash": file_environment(CUDNN_FILE).environment_hash(),
            "outcome": "miss", "install_seconds": 0.5, "pod": "pod-1", "source": "plugin", "rank": 0,
            "boot_id": "boot-0001", "variant": "ab" * 8, "variant_missing": True, "engine_args": args}


def test_the_jobs_api_refuses_each_argument_that_is_not_allowed_naming_it(server):
    for name, value in DANGEROUS.items():
        message = refusal(as_admin.post(f"{server}/v1/tuning-jobs", json=job({"max_model_len": 8192, name: value})))
        assert f"engine_args.{name} is not an allowed engine argument: " in message, message
    for path, args in NESTED.items():
        message = refusal(as_admin.post(f"{server}/v1/tuning-jobs", json=job(args)))
        assert (f"engine_args.{path} is not an allowed engine argument: " in message
                or f"engine_args.{path} must be one of" in message), message
    for args, said in OUT_OF_BOUNDS.values():
        assert said in refusal(as_admin.post(f"{server}/v1/tuning-jobs", json=job(args)))
    assert httpx.get(f"{server}/v1/tuning-jobs").json()["total"] == 0  # nothing refused was queued

    allowed = {"max_model_len": 8192, "kv_cache_dtype": "fp8", "gpu_memory_utilization": 0.85,
               "compilation_config": {"mode": 3, "cudagraph_mode": "FULL_AND_PIECEWISE",
                                      "cudagraph_capture_sizes": [1, 2, 4, 8]}}
    queued = as_admin.post(f"{server}/v1/tuning-jobs", json=job(allowed))
    assert queued.status_code == 202, queued.text
    [listed] = httpx.get(f"{server}/v1/tuning-jobs").json()["items"]
    assert listed["engine_args"] == allowed


def test_the_reports_api_refuses_each_argument_that_is_not_allowed_naming_it(server, database_url):
    from tests.support.builders import stored_reports

    for name, value in {**DANGEROUS, "compilation_config": {"inductor_passes": {"p": "evil.fn"}}}.items():
        message = refusal(httpx.post(f"{server}/v1/reports", json=report({name: value})))
        assert f"engine_args.{name}" in message and "is not an allowed engine argument" in message, message
    for args, said in OUT_OF_BOUNDS.values():
        assert said in refusal(httpx.post(f"{server}/v1/reports", json=report(args)))
    taken = httpx.post(f"{server}/v1/reports", json=report({"max_model_len": 8192}))
    assert taken.status_code == 202, taken.text
    [stored] = stored_reports(database_url, 1)  # the one allowed; nothing refused was stored
    assert json.loads(json.dumps(stored.engine_args)) == {"max_model_len": 8192}


ODD_SHAPES = [{"compilation_config": "3"}, {"compilation_config": {"mode": 9}}, {"attention_backend": "CUSTOM"},
              {"": 1}, {"x" * 300: 1}, {"max_model_len": 8192.5}, {"max_num_seqs": True}]


def test_odd_shapes_are_refused_naming_the_argument(server):
    for args in ODD_SHAPES:
        message = refusal(as_admin.post(f"{server}/v1/tuning-jobs", json=job(args)))
        assert message.startswith("Value error, engine_args.") and len(message) < 400, message
