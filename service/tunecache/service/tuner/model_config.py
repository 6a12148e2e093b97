"""GEMM shapes of a model's decoder layers, derived from its Hugging Face ``config.json``.

No weights and no hub downloads: a directory or file with ``config.json``, or a model
type ``transformers.AutoConfig.for_model`` knows (its defaults), when transformers is
installed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class ModelConfigError(ValueError):
    """The model config is missing, unreadable, or lacks a field the shapes need (named)."""


@dataclass(frozen=True)
class GemmShape:
    """One linear layer as FlashInfer sees it: ``out[M, n] = x[M, k] @ W[n, k].T``.

    ``M`` is the token count (tuned over buckets up to ``max_num_batched_tokens``).
    """

    name: str
    n: int
    k: int


def load_hf_config(spec: str | Path) -> dict[str, Any]:
    """The config dict of a model.

    Args:
        spec: a directory holding ``config.json``, a JSON file, or a model type
            (``"llama"``) that ``transformers.AutoConfig.for_model`` knows.

    Raises:
        ModelConfigError: not found, not JSON, or not a JSON object.
    """
    path = Path(spec).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        try:
            config = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ModelConfigError(f"cannot read model config {path}: {exc}") from None
        if not isinstance(config, dict):
            raise ModelConfigError(f"model config {path} is not a JSON object")
        return config
    try:
        from transformers import AutoConfig
    except ImportError:
        raise ModelConfigError(
            f"{spec!s} is neither a directory with config.json nor a JSON file "
            "(model types need the transformers package)"
        ) from None
    try:
        return AutoConfig.for_model(str(spec)).to_dict()
    except ValueError as exc:
        raise ModelConfigError(f"{spec!s} is not a config path nor a model type transformers knows: {exc}") from None


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    """Multimodal configs nest the language model under ``text_config``."""
    nested = config.get("text_config")
    return nested if isinstance(nested, dict) else config


def _require(config: dict[str, Any], *names: str) -> int:
    for name in names:
        value = config.get(name)
        if isinstance(value, int) and value > 0:
            return value
    raise ModelConfigError(f"model config lacks a positive integer {' or '.join(names)}")


def _divide(total: int, parts: int, what: str) -> int:
    if total % parts:
        raise ModelConfigError(f"{what} ({total}) is not divisible by tensor_parallel_size {parts}")
    return total // parts


def checkpoint_quantization(config: dict[str, Any]) -> str | None:
    """The checkpoint's quantization method (``quantization_config.quant_method``), e.g. ``"fp8"``."""
    quant = _text_config(config).get("quantization_config") or config.get("quantization_config")
    if isinstance(quant, dict) and isinstance(quant.get("quant_method"), str):
        return quant["quant_method"]
    return None


def is_moe(config: dict[str, Any]) -> bool:
    """True for mixture-of-experts configs (``num_experts`` / ``num_local_experts`` / ``n_routed_experts``)."""
    text = _text_config(config)
    return any(isinstance(text.get(k), int) and text[k] > 1 for k in ("num_experts", "num_local_experts", "n_routed_experts"))


def dense_gemm_shapes(config: dict[str, Any], tensor_parallel_size: int = 1) -> list[GemmShape]:
    """The per-rank GEMMs of one decoder layer, as vLLM shards them.

    * ``qkv`` (``QKVParallelLinear``): n = (heads/tp + 2 * max(1, kv_heads/tp)) * head_dim,
      k = hidden. KV heads are replicated when tp exceeds them, as vLLM does.
    * ``o`` (``RowParallelLinear``): n = hidden, k = heads/tp * head_dim.
    * ``gate_up`` (``MergedColumnParallelLinear``): n = 2 * intermediate/tp, k = hidden.
    * ``down`` (``RowParallelLinear``): n = hidden, k = intermediate/tp.

    MoE configs get only ``qkv`` and ``o``: their expert MLPs are the fused-MoE stage's.
    Shapes equal in (n, k) are kept once, the first name winning.

    Raises:
        ModelConfigError: a needed field is missing or does not divide by ``tensor_parallel_size``.
    """
    if tensor_parallel_size < 1:
        raise ModelConfigError("tensor_parallel_size must be >= 1")
    text = _text_config(config)
    hidden = _require(text, "hidden_size")
    attention = attention_shape(config, tensor_parallel_size)
    qo, kv, head_dim = attention.num_qo_heads, attention.num_kv_heads, attention.head_dim
    shapes = [
        GemmShape("qkv", (qo + 2 * kv) * head_dim, hidden),
        GemmShape("o", hidden, qo * head_dim),
    ]
    if not is_moe(config):
        intermediate = _divide(_require(text, "intermediate_size"), tensor_parallel_size, "intermediate_size")
        shapes += [GemmShape("gate_up", 2 * intermediate, hidden), GemmShape("down", hidden, intermediate)]
    unique: dict[tuple[int, int], GemmShape] = {}
    for shape in shapes:
        unique.setdefault((shape.n, shape.k), shape)
    return list(unique.values())


@dataclass(frozen=True)
class MoeShape:
    """One rank's fused-MoE problem (vLLM's ``FusedMoE`` sharding).

    ``experts`` in the model; ``local_experts`` on this rank (experts / ep); ``top_k``
    experts per token; ``hidden``; ``intermediate`` per rank (moe_intermediate / tp).
    The fused GEMM1 weight is ``[local_experts, 2 * intermediate, hidden]`` (gate and
    up), GEMM2 ``[local_experts, hidden, intermediate]``.
    """

    experts: int
    local_experts: int
    top_k: int
    hidden: int
    intermediate: int
    tp_size: int
    ep_size: int


@dataclass(frozen=True)
class AttentionShape:
    """One rank's attention heads (vLLM shards query heads by tp, replicates KV heads past it)."""

    num_qo_heads: int
    num_kv_heads: int
    head_dim: int


def moe_shape(config: dict[str, Any], tensor_parallel_size: int = 1, expert_parallel_size: int = 1) -> MoeShape:
    """The per-rank fused-MoE shape of a MoE config.

    With expert parallelism (``expert_parallel_size > 1``) vLLM splits the experts and
    keeps each expert's intermediate whole; otherwise it splits the intermediate by tp.

    Raises:
        ModelConfigError: not a MoE config, a field is missing, or the split does not divide.
    """
    if not is_moe(config):
        raise ModelConfigError("model config has no experts (num_experts / num_local_experts / n_routed_experts)")
    text = _text_config(config)
    experts = _require(text, "num_experts", "num_local_experts", "n_routed_experts")
    top_k = _require(text, "num_experts_per_tok", "moe_top_k")
    hidden = _require(text, "hidden_size")
    intermediate = _require(text, "moe_intermediate_size", "intermediate_size")
    if expert_parallel_size > 1:
        local = _divide(experts, expert_parallel_size, "number of experts")
        per_rank_intermediate = intermediate
    else:
        local = experts
        per_rank_intermediate = _divide(intermediate, tensor_parallel_size, "moe_intermediate_size")
    return MoeShape(experts, local, top_k, hidden, per_rank_intermediate, tensor_parallel_size, expert_parallel_size)


def attention_shape(config: dict[str, Any], tensor_parallel_size: int = 1) -> AttentionShape:
    """Per-rank query heads, KV heads and head_dim (see :func:`dense_gemm_shapes` for the rules)."""
    text = _text_config(config)
    hidden = _require(text, "hidden_size")
    heads = _require(text, "num_attention_heads")
    kv_heads = text.get("num_key_value_heads") or heads
    head_dim = text.get("head_dim") or _divide(hidden, heads, "hidden_size / num_attention_heads")
    return AttentionShape(
        num_qo_heads=_divide(heads, tensor_parallel_size, "num_attention_heads"),
        num_kv_heads=max(1, kv_heads // tensor_parallel_size),
        head_dim=head_dim,
    )
