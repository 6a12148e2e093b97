"""The vLLM warmup: its command line and environment, and harvesting a vLLM-layout cache
directory built from the real H200 FlashInfer files (and FlashInfer's own v2 store code)."""

from __future__ import annotations

import json
import os
import tarfile

import pytest

from tests.support.paths import CUBLASLT_FILE, CUDNN_FILE, QWEN3_CONFIG
from tunecache.contract import ArtifactKind, DeploymentKey
from tunecache.service.tuner.stages import TuneSpec
from tunecache.service.tuner.vllm_warmup import (
    harvest_vllm_cache,
    run_vllm_warmup,
    vllm_command,
)

CONFIG_HASH = "3f" * 32  # vLLM's sha256(VllmConfig.compute_hash()) directory name


def spec(**overrides):
    fields = dict(model="Qwen/Qwen3-30B-A3B", hf_config=json.loads(QWEN3_CONFIG.read_text()), max_num_batched_tokens=8192,
                  tensor_parallel_size=2) | overrides
    deployment = DeploymentKey(**{f: fields.pop(f) for f in list(fields) if f in DeploymentKey.model_fields})
    return TuneSpec(deployment=deployment, **fields)


def test_command_line_and_environment(tmp_path):
    command, env = vllm_command(spec(expert_parallel_size=2), tmp_path, python="/usr/bin/python3")
    assert command[:2] == ["/usr/bin/python3", "-c"] and "LLM(**args)" in command[2]
    args = json.loads(command[3])
    assert args == {
        "model": str(tmp_path / "model"), "load_format": "dummy", "skip_tokenizer_init": True,
        "max_num_batched_tokens": 8192, "tensor_parallel_size": 2, "enable_expert_parallel": True, "dtype": "auto",
        "served_model_name": "Qwen/Qwen3-30B-A3B",
    }  # vLLM's default torch.compile and CUDA graphs, as the fleet boots (no enforce_eager)
    assert command[4] == str(tmp_path / "flashinfer-jit-used.json")
    assert command[5] == str(tmp_path / "compile-facts.json")
    assert json.loads((tmp_path / "model" / "config.json").read_text())["num_experts"] == 128
    assert env == {
        "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache"),
        "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR": str(tmp_path / "flashinfer-autotune"),
        "DG_JIT_CACHE_DIR": str(tmp_path / "deep_gemm"),
        "TRITON_CACHE_DIR": str(tmp_path / "triton"),
        "TILELANG_CACHE_DIR": str(tmp_path / "tilelang"),
        "CUTE_DSL_CACHE_DIR": str(tmp_path / "cute-dsl"),
        "TVM_FFI_CACHE_DIR": str(tmp_path / "tvm-ffi"),
        "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR": str(tmp_path / "fa4-cute-dsl"),
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    }
    fp8_command, _ = vllm_command(spec(quantization="fp8"), tmp_path / "b")
    assert json.loads(fp8_command[3])["quantization"] == "fp8"


def test_node_engine_args_are_added_and_key_arguments_cannot_be_overridden(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNECACHE_VLLM_ENGINE_ARGS", '{"attention_backend": "FLASHINFER", "max_model_len": 4096}')
    command, _ = vllm_command(spec(), tmp_path)
    args = json.loads(command[3])
    assert args["attention_backend"] == "FLASHINFER" and args["max_model_len"] == 4096 and args["max_num_batched_tokens"] == 8192
    for bad, message in (('{"max_num_batched_tokens": 1}', "cannot set max_num_batched_tokens: the tuning key"),
                         ('["FLASHINFER"]', "must be a JSON object"), ("{oops", "is not JSON")):
        monkeypatch.setenv("TUNECACHE_VLLM_ENGINE_ARGS", bad)
        with pytest.raises(ValueError, match=message):
            vllm_command(spec(), tmp_path / "x")


@pytest.mark.parametrize("args, named", [
    ({"trust_remote_code": True}, "engine_args.trust_remote_code is not an allowed engine argument"),
    ({"worker_extension_cls": "evil.Extension"}, "engine_args.worker_extension_cls is not an allowed engine argument"),
    ({"download_dir": "/etc"}, "engine_args.download_dir is not an allowed engine argument"),
    ({"pipeline_parallel_size": 2}, "engine_args.pipeline_parallel_size is not an allowed engine argument"),
    ({"max_num_batched_tokens": 1}, "engine_args.max_num_batched_tokens is not an allowed engine argument"),
    ({"compilation_config": {"mode": 3, "inductor_passes": {"p": "evil.fn"}}},
     "engine_args.compilation_config.inductor_passes is not an allowed engine argument"),
    ({"max_model_len": -1}, "engine_args.max_model_len is -1"),
    ({"gpu_memory_utilization": 5}, "engine_args.gpu_memory_utilization is 5"),
])
def test_the_tuner_refuses_engine_args_that_are_not_allowed_before_anything_runs(tmp_path, monkeypatch, args, named):
    """Checked again right before vllm.LLM, whatever built the spec (model_copy does not validate)."""
    monkeypatch.setenv("TUNECACHE_VLLM_ENGINE_ARGS", '{"attention_backend": "FLASHINFER"}')
    unchecked = spec().model_copy(update={"engine_args": args})
    with pytest.raises(ValueError, match=named.replace(".", r"\.")):
        vllm_command(unchecked, tmp_path / "scratch")
    assert not (tmp_path / "scratch").exists()  # nothing written, nothing started


def test_a_variants_allowed_engine_args_go_over_the_nodes(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNECACHE_VLLM_ENGINE_ARGS", '{"attention_backend": "FLASHINFER", "max_model_len": 4096}')
    variant = {"max_model_len": 8192, "compilation_config": {"cudagraph_mode": "PIECEWISE"}}
    command, _ = vllm_command(spec(engine_args=variant), tmp_path)
    args = json.loads(command[3])
    assert args["attention_backend"] == "FLASHINFER" and args["max_model_len"] == 8192
    assert args["compilation_config"] == {"cudagraph_mode": "PIECEWISE"}


STAND_IN_VLLM = """
import json, os, shutil
class LLM:
    # vLLM's edge: records its arguments and writes per-rank files where vLLM 0.33 would
    def __init__(self, **kw):
        open(os.environ["RECORD"], "w").write(json.dumps(kw))
        rank_dir = os.path.join(os.environ["VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR"], "%s")
        os.makedirs(rank_dir)
        for rank, source in enumerate(os.environ["RANK_SOURCES"].split(":")):
            shutil.copy(source, os.path.join(rank_dir, "autotune_configs_dp0_rank%%d.json" %% rank))
""" % CONFIG_HASH


def test_run_vllm_warmup_runs_the_script_and_harvests(tmp_path, monkeypatch):
    """The real script and harvest, with a stand-in `vllm` package at the vLLM edge."""
    fake = tmp_path / "fakevllm" / "vllm"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(STAND_IN_VLLM)
    record = tmp_path / "record.json"
    monkeypatch.setenv("PYTHONPATH", str(fake.parent))
    monkeypatch.setenv("RECORD", str(record))
    monkeypatch.setenv("RANK_SOURCES", f"{CUDNN_FILE}:{CUBLASLT_FILE}")
    out = tmp_path / "out"
    out.mkdir()
    harvested = run_vllm_warmup(spec(), tmp_path / "scratch", out)
    assert json.loads(record.read_text())["load_format"] == "dummy"
    assert harvested["ranks"] == [(0, 0), (0, 1)]
    assert harvested["autotune_file"].read_bytes() == CUDNN_FILE.read_bytes()


def test_multi_rank_vllm_without_a_file_is_a_clear_error(tmp_path, monkeypatch):
    """vLLM 0.25 tunes a TP=2 engine on every rank without writing a file: nothing to store."""
    fake = tmp_path / "fakevllm" / "vllm"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("class LLM:\n    def __init__(self, **kw):\n        pass\n")
    monkeypatch.setenv("PYTHONPATH", str(fake.parent))
    with pytest.raises(RuntimeError, match="no FlashInfer autotune file that it reads back"):
        run_vllm_warmup(spec(tensor_parallel_size=2), tmp_path / "scratch", tmp_path)


def test_a_single_process_engine_that_tuned_nothing_gets_an_empty_file_from_flashinfer(tmp_path, monkeypatch):
    """Seen on the H200 with vLLM 0.25 and a bf16 Llama: FlashInfer's autotune ran and found no
    tunable op, so vLLM wrote no file. The run is FlashInfer's own file of no entries (its
    save_configs), with this machine's _metadata."""
    pytest.importorskip("flashinfer.autotuner", reason="flashinfer-python is not installed")
    from tunecache.formats.autotune_file import parse_autotune_file

    from flashinfer.autotuner import AutoTuner

    monkeypatch.setattr(AutoTuner, "_instance", None)  # this test's own singleton, the suite's put back after
    # this process's tuner holds 42 configs (FlashInfer loads a file whose _metadata is all "*" anywhere)
    document = json.loads(CUDNN_FILE.read_text())
    document["_metadata"] = {key: "*" for key in document["_metadata"]}
    (tmp_path / "loaded.json").write_text(json.dumps(document))
    assert AutoTuner.get().load_configs(str(tmp_path / "loaded.json"))
    fake = tmp_path / "fakevllm" / "vllm"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("class LLM:\n    def __init__(self, **kw):\n        pass\n")
    monkeypatch.setenv("PYTHONPATH", f"{fake.parent}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    out = tmp_path / "out"
    out.mkdir()
    harvested = run_vllm_warmup(spec(tensor_parallel_size=1), tmp_path / "scratch", out)
    parsed = parse_autotune_file(harvested["autotune_file"].read_bytes())
    assert parsed.entries == 0 and harvested["ranks"] == [(0, 0)]
    assert all(key.startswith("_") for key in json.loads(harvested["autotune_file"].read_text()))


STAND_IN_VLLM_025 = """
import os
from pathlib import Path
class LLM:
    # vLLM 0.25's edge on a GPU node: a single-process engine writes <hash>/autotune_configs.json,
    # and FlashInfer builds an attention module into the node's workspace while it warms up
    def __init__(self, **kw):
        directory = Path(os.environ["VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR"]) / "%s"
        directory.mkdir(parents=True)
        (directory / "autotune_configs.json").write_bytes(Path(os.environ["RANK_SOURCES"]).read_bytes())
        module = Path(os.environ["STAND_IN_WORKSPACE"]) / "cached_ops" / "batch_prefill_with_kv_cache_fa2"
        module.mkdir(parents=True)
        (module / "batch_prefill_with_kv_cache_fa2.so").write_bytes(b"ELF built now")
""" % CONFIG_HASH


def test_vllm_025_single_file_and_the_jit_modules_built_during_the_run(tmp_path, monkeypatch):
    """vLLM 0.25 (torch 2.11, FlashInfer 0.6.13): its one ``autotune_configs.json`` is the
    run's file, and a FlashInfer module built in the workspace while vLLM ran is harvested;
    one built before the run is not."""
    jit_env = pytest.importorskip("flashinfer.jit.env", reason="flashinfer-python is not installed")
    workspace = tmp_path / "workspace"
    old = workspace / "cached_ops" / "other_model_module"
    old.mkdir(parents=True)
    (old / "other_model_module.so").write_bytes(b"ELF from an earlier run")
    os.utime(old / "other_model_module.so", ns=(0, 0))
    monkeypatch.setattr(jit_env, "FLASHINFER_WORKSPACE_DIR", workspace)
    fake = tmp_path / "fakevllm" / "vllm"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(STAND_IN_VLLM_025)
    monkeypatch.setenv("PYTHONPATH", f"{fake.parent}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.setenv("RANK_SOURCES", str(CUDNN_FILE))
    monkeypatch.setenv("STAND_IN_WORKSPACE", str(workspace))
    out = tmp_path / "out"
    out.mkdir()
    harvested = run_vllm_warmup(spec(tensor_parallel_size=1), tmp_path / "scratch", out)
    assert harvested["ranks"] == [(0, 0)]
    assert harvested["autotune_file"].read_bytes() == CUDNN_FILE.read_bytes()
    assert [a.module for a in harvested["jit"]] == ["batch_prefill_with_kv_cache_fa2"]
    [jit] = [a for a in harvested["artifacts"] if a.kind == ArtifactKind.FLASHINFER_JIT_MODULE]
    assert jit.name == "flashinfer-jit/batch_prefill_with_kv_cache_fa2.tar.gz"
    with tarfile.open(out / jit.path) as tar:
        assert tar.extractfile("cached_ops/batch_prefill_with_kv_cache_fa2/batch_prefill_with_kv_cache_fa2.so").read() \
            == b"ELF built now"


def test_harvest_per_rank_files_v2_store_and_deep_gemm(tmp_path):
    scratch, out = tmp_path / "scratch", tmp_path / "out"
    rank_dir = scratch / "flashinfer-autotune" / CONFIG_HASH
    rank_dir.mkdir(parents=True)
    (rank_dir / "autotune_configs_dp0_rank1.json").write_bytes(CUBLASLT_FILE.read_bytes())
    (rank_dir / "autotune_configs_dp0_rank0.json").write_bytes(CUDNN_FILE.read_bytes())
    (rank_dir / "unrelated.json").write_text("{}")
    (rank_dir / "autotune_configs.json").write_bytes(CUDNN_FILE.read_bytes())  # 0.33/0.34 on SM120: the shared file
    deep_gemm = scratch / "deep_gemm" / "cache" / "kernel.abc"
    deep_gemm.mkdir(parents=True)
    (deep_gemm / "kernel.cubin").write_bytes(b"cubin")
    out.mkdir()

    harvested = harvest_vllm_cache(scratch, out)
    assert harvested["ranks"] == [(0, 0), (0, 1)]
    assert harvested["autotune_file"].read_bytes() == CUDNN_FILE.read_bytes()  # rank 0 is the run's file
    kinds = {a.name: a.kind for a in harvested["artifacts"]}
    assert kinds == {
        f"vllm/{CONFIG_HASH}/autotune_configs_dp0_rank0.json": ArtifactKind.VLLM_RANK_FILE,
        f"vllm/{CONFIG_HASH}/autotune_configs_dp0_rank1.json": ArtifactKind.VLLM_RANK_FILE,
        f"vllm/{CONFIG_HASH}/autotune_configs.json": ArtifactKind.VLLM_RANK_FILE,
        "deep-gemm-jit-cache.tar.gz": ArtifactKind.DEEP_GEMM_JIT_CACHE,
    }
    for artifact in harvested["artifacts"]:
        assert (out / artifact.path).is_file()
    with tarfile.open(out / "deep-gemm-jit-cache.tar.gz") as tar:
        assert tar.getnames() == ["cache/kernel.abc/kernel.cubin"]


def test_harvest_a_v2_store_written_by_flashinfer(tmp_path):
    autotune_cache = pytest.importorskip("flashinfer.autotune_cache", reason="flashinfer-python is not installed")
    doc = json.loads(CUBLASLT_FILE.read_text())
    store = autotune_cache.ManagedAutotuneCache(doc["_metadata"], root=tmp_path / "scratch" / "flashinfer-autotune")
    for key, (runner, tactic, policy, *_rest) in ((k, v) for k, v in doc.items() if not k.startswith("_")):
        store.publish(key, runner, tactic, profiling_policy=tuple(policy))
    out = tmp_path / "out"
    out.mkdir()
    harvested = harvest_vllm_cache(tmp_path / "scratch", out)
    assert harvested["autotune_file"] is None and harvested["ranks"] == []
    [v2] = harvested["artifacts"]
    assert v2.kind == ArtifactKind.FLASHINFER_V2_STORE
    with tarfile.open(out / v2.path) as tar:
        names = tar.getnames()
    assert f"{store.env_hash}/manifest.json" in names
    assert sum(n.startswith(f"{store.env_hash}/entries/") for n in names) == 42


def test_without_vllm_the_vllm_warmup_refuses_in_one_line(tmp_path, monkeypatch):
    """A tuner image without vLLM (the service's image on a plain torch base): one line that
    says what to do, before any engine is started (it used to fail inside vLLM's command)."""
    monkeypatch.delenv("PYTHONPATH", raising=False)
    with pytest.raises(ValueError, match=r"^the vLLM warmup needs vLLM where the tuner runs \(no vllm package for "
                                         r".*\): run the tuner in the fleet's vLLM image"):
        run_vllm_warmup(spec(), tmp_path / "scratch", tmp_path)
