"""GEMM shapes from real Hugging Face configs."""

from __future__ import annotations

import json

import pytest

from tests.support.paths import LLAMA_CONFIG, QWEN3_CONFIG
from tunecache.service.tuner.model_config import (
    AttentionShape,
    GemmShape,
    ModelConfigError,
    MoeShape,
    checkpoint_quantization,
    dense_gemm_shapes,
    attention_shape,
    is_moe,
    load_hf_config,
    load_job_model_config,
    model_config_path,
    ModelConfigUnavailable,
    moe_shape,
)

QWEN3_MOE = json.loads(QWEN3_CONFIG.read_text())


def test_llama_3_1_8b_shapes():
    config = load_hf_config(LLAMA_CONFIG.parent)
    assert dense_gemm_shapes(config) == [
        GemmShape("qkv", 6144, 4096),  # (32 + 2*8) * 128
        GemmShape("o", 4096, 4096),
        GemmShape("gate_up", 28672, 4096),
        GemmShape("down", 4096, 14336),
    ]
    assert checkpoint_quantization(config) is None and not is_moe(config)


def test_tensor_parallel_split_and_kv_replication():
    config = load_hf_config(LLAMA_CONFIG)
    assert dense_gemm_shapes(config, 2) == [
        GemmShape("qkv", 3072, 4096), GemmShape("o", 4096, 2048),
        GemmShape("gate_up", 14336, 4096), GemmShape("down", 4096, 7168),
    ]
    # tp 16 > 8 KV heads: each rank keeps one replicated KV head
    assert dense_gemm_shapes(config, 16)[0] == GemmShape("qkv", (2 + 2) * 128, 4096)
    with pytest.raises(ModelConfigError, match="not divisible by tensor_parallel_size 3"):
        dense_gemm_shapes(config, 3)


def test_moe_models_get_attention_projections_only():
    assert is_moe(QWEN3_MOE)
    assert dense_gemm_shapes(QWEN3_MOE) == [GemmShape("qkv", (32 + 8) * 128, 2048), GemmShape("o", 2048, 4096)]


def test_fp8_checkpoint_and_nested_text_config():
    config = {"text_config": json.loads(LLAMA_CONFIG.read_text()), "quantization_config": {"quant_method": "fp8"}}
    assert checkpoint_quantization(config) == "fp8"
    assert len(dense_gemm_shapes(config)) == 4


def test_bad_configs_are_named(tmp_path):
    with pytest.raises(ModelConfigError, match="hidden_size"):
        dense_gemm_shapes({"num_attention_heads": 8})
    broken = tmp_path / "config.json"
    broken.write_text("{not json")
    with pytest.raises(ModelConfigError, match="cannot read model config"):
        load_hf_config(tmp_path)
    with pytest.raises(ModelConfigError, match="neither a directory with config.json"):
        load_hf_config(tmp_path / "nowhere")


def test_qwen3_moe_expert_and_attention_shapes():
    assert moe_shape(QWEN3_MOE) == MoeShape(experts=128, local_experts=128, top_k=8, hidden=2048, intermediate=768,
                                            tp_size=1, ep_size=1)
    assert moe_shape(QWEN3_MOE, tensor_parallel_size=2).intermediate == 384
    expert_parallel = moe_shape(QWEN3_MOE, tensor_parallel_size=2, expert_parallel_size=2)
    assert (expert_parallel.local_experts, expert_parallel.intermediate) == (64, 768)
    assert attention_shape(QWEN3_MOE) == AttentionShape(num_qo_heads=32, num_kv_heads=4, head_dim=128)
    assert attention_shape(QWEN3_MOE, 8) == AttentionShape(num_qo_heads=4, num_kv_heads=1, head_dim=128)
    with pytest.raises(ModelConfigError, match="no experts"):
        moe_shape(json.loads(LLAMA_CONFIG.read_text()))


@pytest.fixture
def config_dir(tmp_path):
    """A node's model config directory holding meta-llama/Llama-3.1-8B, and a config.json
    outside it (``tmp_path / "outside"``)."""
    root = tmp_path / "model-configs"
    (root / "meta-llama" / "Llama-3.1-8B").mkdir(parents=True)
    (root / "meta-llama" / "Llama-3.1-8B" / "config.json").write_text(LLAMA_CONFIG.read_text())
    (tmp_path / "outside" / "x").mkdir(parents=True)
    (tmp_path / "outside" / "x" / "config.json").write_text(LLAMA_CONFIG.read_text())
    return root


def test_a_job_model_maps_to_its_config_inside_the_directory(config_dir):
    assert model_config_path(config_dir, "meta-llama/Llama-3.1-8B") == \
        (config_dir / "meta-llama" / "Llama-3.1-8B" / "config.json").resolve()
    assert load_job_model_config(config_dir, "meta-llama/Llama-3.1-8B") == json.loads(LLAMA_CONFIG.read_text())
    # a link that stays inside the directory (as a Hugging Face cache's snapshots are) is fine
    (config_dir / "aliases").mkdir()
    (config_dir / "aliases" / "llama").symlink_to(config_dir / "meta-llama" / "Llama-3.1-8B")
    assert load_job_model_config(config_dir, "aliases/llama")["hidden_size"] == 4096


@pytest.mark.parametrize("model", ["../x", "../outside/x", "/abs", "/etc", "meta-llama/../../outside/x", "org/./name",
                                   ".hidden/name", "org//name", "org/name/", "", "org\\name", "org/name\x00"])
def test_names_that_could_leave_the_directory_are_refused(config_dir, model):
    with pytest.raises(ModelConfigUnavailable) as refused:
        load_job_model_config(config_dir, model)
    assert "model config directory" in str(refused.value)
    assert str(config_dir.parent) not in str(refused.value)


def test_a_symlink_out_of_the_directory_finds_nothing(config_dir, tmp_path):
    (config_dir / "evil").mkdir()
    (config_dir / "evil" / "x").symlink_to(tmp_path / "outside" / "x")          # a linked model directory
    (config_dir / "evil" / "y").mkdir()
    (config_dir / "evil" / "y" / "config.json").symlink_to(tmp_path / "outside" / "x" / "config.json")  # a linked file
    (config_dir / "etc").symlink_to("/etc")                                     # a linked organisation
    for model in ("evil/x", "evil/y", "etc/ssl"):
        with pytest.raises(ModelConfigUnavailable) as refused:
            model_config_path(config_dir, model)
        assert str(refused.value) == f"model config for {model!r} not found in the node's model config directory"
        assert "outside" in refused.value.detail or "No such file" in refused.value.detail  # the why: log only


def test_public_messages_carry_no_node_path_nor_os_error(config_dir):
    with pytest.raises(ModelConfigUnavailable) as missing:
        load_job_model_config(config_dir, "org/absent")
    assert str(missing.value) == "model config for 'org/absent' not found in the node's model config directory"
    assert str(config_dir) in missing.value.detail and str(config_dir) not in str(missing.value)
    (config_dir / "org" / "broken").mkdir(parents=True)
    (config_dir / "org" / "broken" / "config.json").write_text("{not json")
    with pytest.raises(ModelConfigUnavailable) as broken:
        load_job_model_config(config_dir, "org/broken")
    assert str(broken.value) == ("model config for 'org/broken' in the node's model config directory is not a "
                                 "readable JSON object")
    assert "Expecting property name" in broken.value.detail
    with pytest.raises(ModelConfigUnavailable) as unset:
        load_job_model_config(None, "meta-llama/Llama-3.1-8B")
    assert "TUNECACHE_MODEL_CONFIG_DIR" in str(unset.value) and "hf_config" in str(unset.value)
