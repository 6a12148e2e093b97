"""The tuner's child process on a CPU machine: the real child, real FlashInfer import,
real failure paths (no CUDA device, timeout) and the `tune` command's exit code."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.support.cli import tunecache_executable
from tests.support.paths import LLAMA_CONFIG, QWEN3_CONFIG
from tests.support.torch_tests import cuda_available
from tunecache.contract import DeploymentKey
from tunecache.service.tuner.process import TunerFailed, run_tuner
from tunecache.service.tuner.deep_gemm_stage import DeepGemmStage, deep_gemm_shapes, warmup_m_values
from tunecache.service.tuner.stages import AttentionWarmupStage, DenseGemmStage, FusedMoeStage, TuneSpec

pytest.importorskip("torch", reason="torch is not installed")


def spec(**overrides) -> TuneSpec:
    fields = dict(model="meta-llama/Llama-3.1-8B", hf_config=json.loads(LLAMA_CONFIG.read_text()), max_num_batched_tokens=8192)
    fields.update(overrides)
    deployment = DeploymentKey(**{f: fields.pop(f) for f in list(fields) if f in DeploymentKey.model_fields})
    return TuneSpec(deployment=deployment, **fields)


@pytest.mark.skipif(cuda_available(), reason="checks the no-GPU path")
def test_child_without_gpu_fails_with_a_clear_error(tmp_path):
    events = []
    with pytest.raises(TunerFailed) as info:
        run_tuner(spec(), tmp_path, timeout_s=300, on_event=events.append)
    assert "no CUDA device" in info.value.message
    assert events[-1].event == "error"
    assert "Traceback" in info.value.log_tail  # the child's stderr is kept
    assert info.value.started is None


def test_child_is_killed_at_the_timeout(tmp_path):
    with pytest.raises(TunerFailed, match="timed out after 0.2 s"):
        run_tuner(spec(), tmp_path, timeout_s=0.2)


def test_gemm_stage_skips_what_it_cannot_tune():
    stage = DenseGemmStage()
    assert stage.skip_reason(spec(), "sm90") is None
    assert "no FlashInfer GEMM backends chosen for sm75" in stage.skip_reason(spec(), "sm75")
    assert stage.skip_reason(spec(gemm_backends=["cublaslt"]), "sm75") is None
    assert "awq" in stage.skip_reason(spec(quantization="awq"), "sm90")


@pytest.mark.skipif(cuda_available(), reason="checks the no-GPU path")
def test_tune_command_exits_8_without_gpu(tmp_path):
    result = subprocess.run(
        [tunecache_executable(), "tune", "--model", "meta-llama/Llama-3.1-8B", "--config", str(LLAMA_CONFIG),
         "--max-num-batched-tokens", "8192", "--database", f"sqlite:///{tmp_path / 'db.sqlite'}"],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 8, result.stderr
    # one line: it was said twice (the progress display's, then the command's) with the child's traceback
    assert result.stderr.strip().splitlines() == [
        "tunecache: error: RuntimeError: no CUDA device: this node cannot tune (it can still serve lookups) (no run "
        "recorded: the tuner failed before it found its GPU, so there is no key to file it under)"]


def test_tune_command_needs_one_destination(tmp_path):
    result = subprocess.run(
        [tunecache_executable(), "tune", "--model", "m", "--config", str(LLAMA_CONFIG), "--max-num-batched-tokens", "8"],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2 and "give --server URL or --database URL" in result.stderr


def test_tune_warmup_option_and_its_deprecated_runner_name(tmp_path):
    """``--warmup stages|vllm``; ``--runner native|vllm`` (and ``native``) still accepted,
    hidden from the help; a bad value of either is exit 2 naming the option."""
    def tune(*args):
        return subprocess.run([tunecache_executable(), "tune", "--model", "m", "--config", str(LLAMA_CONFIG),
                               "--max-num-batched-tokens", "8", *args], capture_output=True, text=True, timeout=60)

    for accepted in (["--warmup", "stages"], ["--warmup", "vllm"], ["--runner", "native"], ["--runner", "vllm"],
                     ["--warmup", "native"]):
        result = tune(*accepted)  # the value is accepted: it fails on the missing destination, after the option check
        assert result.returncode == 2 and "give --server URL or --database URL" in result.stderr, (accepted, result.stderr)
    for bad, named in ((["--warmup", "native-ish"], "--warmup must be 'stages' or 'vllm'"),
                       (["--runner", "stages"], "--runner must be 'native' or 'vllm'")):
        result = tune(*bad)
        assert result.returncode == 2 and named in result.stderr, (bad, result.stderr)
    shown = subprocess.run([tunecache_executable(), "tune", "--help"], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "COLUMNS": "200"})
    assert "--warmup" in shown.stdout and "--runner" not in shown.stdout


def test_stage_choice_follows_the_model():
    qwen = json.loads(QWEN3_CONFIG.read_text())
    assert FusedMoeStage().skip_reason(spec(), "sm90") == "dense model (no experts)"
    assert FusedMoeStage().skip_reason(spec(hf_config=qwen), "sm90") is None
    assert "sm90 only" in FusedMoeStage().skip_reason(spec(hf_config=qwen), "sm100")
    assert "bf16 only" in FusedMoeStage().skip_reason(spec(hf_config=qwen, quantization="fp8"), "sm90")
    assert AttentionWarmupStage().skip_reason(spec(), "sm90") is None
    fp8_only = "DeepGEMM warmup applies to fp8 checkpoints with 128x128 weight blocks only"
    assert DeepGemmStage().skip_reason(spec(), "sm90") == fp8_only
    assert DeepGemmStage().skip_reason(spec(quantization="fp8"), "sm90") == fp8_only  # per-tensor fp8: not DeepGEMM's
    blocked = json.loads(LLAMA_CONFIG.read_text()) | {
        "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
    assert DeepGemmStage().skip_reason(spec(hf_config=blocked), "sm90").startswith("deep_gemm is not importable")


def test_deep_gemm_warmup_covers_vllms_m_values_and_shapes():
    """vLLM 0.25's relax-mode M values for one GEMM (132 SMs on an H200): the small Ms, every
    block-M multiple, and the wave boundaries; DeepGEMM takes Llama's per-rank GEMMs."""
    values = warmup_m_values(8192, 4096, 132)
    assert values[:7] == [1, 2, 4, 8, 16, 24, 32] and {40, 48, 56, 64} <= set(values)
    assert set(range(64, 8193, 64)) <= set(values) and max(values) == 8192 and values == sorted(set(values))
    assert 132 * 128 // (4096 // 256) in values  # one wave of 128x256 blocks
    assert warmup_m_values(16, 4096, 132) == [1, 2, 4, 8, 16]
    blocked = json.loads(LLAMA_CONFIG.read_text())
    shapes = {(s.n, s.k) for s in deep_gemm_shapes(spec(hf_config=blocked, tensor_parallel_size=2))}
    assert shapes and all(n % 64 == 0 and k % 128 == 0 for n, k in shapes)
    assert (14336, 4096) in shapes and (4096, 7168) in shapes  # gate_up (2 x 14336 / 2) and down at tp=2
