"""GEMM shapes from real Hugging Face configs."""

from __future__ import annotations

import json

import pytest

from conftest import LLAMA_CONFIG, QWEN3_CONFIG
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
