"""GEMM shapes from real Hugging Face configs."""

from __future__ import annotations

import json

import pytest

from conftest import LLAMA_CONFIG
from tunecache.service.tuner.model_config import (
    GemmShape,
    ModelConfigError,
    checkpoint_quantization,
    dense_gemm_shapes,
    is_moe,
    load_hf_config,
)

# Qwen3-30B-A3B's published config (the fields the shapes use).
QWEN3_MOE = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
    "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 6144,
    "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8, "torch_dtype": "bfloat16",
}


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
