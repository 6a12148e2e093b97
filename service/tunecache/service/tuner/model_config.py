"""GEMM shapes of a model's decoder layers, derived from its Hugging Face ``config.json``.

No weights and no hub downloads. A node operator's ``tunecache tune`` reads a directory
or file with ``config.json``, or a model type ``transformers.AutoConfig.for_model`` knows
(its defaults), when transformers is installed (:func:`load_hf_config`). A tuning job
from the API carries its config, or names a model whose ``config.json`` lies in the
node's model config directory (:func:`load_job_model_config`): nothing a job says is
read as a path of its own.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunecache.contract import MAX_HF_CONFIG_BYTES


class ModelConfigError(ValueError):
    """The model config is missing, unreadable, or lacks a field the shapes need (named)."""


class ModelConfigUnavailable(ModelConfigError):
    """A job's model config cannot be had on this node.

    ``str(error)`` is the public message a job stores and the API shows: it names the
    model and never a path of the node nor the text of an error from reading its files;
    ``detail`` says that, for the node's log only.
    """

    def __init__(self, message: str, detail: str | None = None):
        super().__init__(message)
        self.detail = detail or message


#: One part of a model name (``org`` or ``name`` of ``org/name``) that may name a
#: directory in the node's model config directory: no ``..``, nothing hidden or empty.
_NAME_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")


def model_config_path(config_dir: Path, model: str) -> Path:
    """``<config_dir>/<org>/<name>/config.json`` for a model name ``org/name`` (or
    ``name``), resolved, symlinks followed, and required to lie inside ``config_dir``.

    Raises:
        ModelConfigUnavailable: the name is not ``/``-separated parts of letters, digits,
            ``.``, ``_`` and ``-`` starting with no ``.`` (an absolute name, ``..`` or a
            backslash never is), or its ``config.json`` is missing, not a file, or (through a
            symlink) outside ``config_dir``: all of these read "not found" to the public.
    """
    parts = model.split("/")
    if not all(_NAME_PART.fullmatch(part) for part in parts):
        raise ModelConfigUnavailable(
            f"model name {model[:200]!r} cannot name a config in the node's model config directory "
            "(it must be org/name: letters, digits, '.', '_' and '-', no part starting with '.')")
    public = f"model config for {model!r} not found in the node's model config directory"
    try:
        root = Path(config_dir).resolve(strict=True)
        path = root.joinpath(*parts, "config.json").resolve(strict=True)
    except (OSError, RuntimeError) as exc:  # missing, unreadable, a symlink loop
        raise ModelConfigUnavailable(public, f"{Path(config_dir).joinpath(*parts, 'config.json')}: {exc}") from None
    if not path.is_relative_to(root):
        raise ModelConfigUnavailable(public, f"{root.joinpath(*parts, 'config.json')} leads to {path}, outside {root}")
    if not path.is_file():
        raise ModelConfigUnavailable(public, f"{path} is not a file")
    return path


def load_job_model_config(config_dir: Path | None, model: str) -> dict[str, Any]:
    """The config of a job's model when the job carries none: ``config.json`` of ``model``
    in the node's model config directory (``TUNECACHE_MODEL_CONFIG_DIR``,
    :func:`model_config_path`); no other local path, no model type, no download.

    Raises:
        ModelConfigUnavailable: the node has no model config directory, or the config is
            not in it, or it is not a JSON object of at most ``MAX_HF_CONFIG_BYTES``.
    """
    if config_dir is None:
        raise ModelConfigUnavailable(
            f"the job carries no model config (hf_config) for {model[:200]!r} and this node has no model config "
            "directory (TUNECACHE_MODEL_CONFIG_DIR); send the model's config.json with the job")
    path = model_config_path(config_dir, model)
    unreadable = f"model config for {model!r} in the node's model config directory is not a readable JSON object"
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))  # resolved: a link now is a swap
        with os.fdopen(fd, "rb") as f:
            data = f.read(MAX_HF_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ModelConfigUnavailable(unreadable, f"{path}: {exc}") from None
    if len(data) > MAX_HF_CONFIG_BYTES:
        raise ModelConfigUnavailable(unreadable, f"{path} is larger than {MAX_HF_CONFIG_BYTES} bytes")
    try:
        config = json.loads(data)
    except ValueError as exc:  # not UTF-8, not JSON
        raise ModelConfigUnavailable(unreadable, f"{path}: {exc}") from None
    if not isinstance(config, dict):
        raise ModelConfigUnavailable(unreadable, f"{path} is not a JSON object")
    return config


@dataclass(frozen=True)
class GemmShape:
    """One linear layer as FlashInfer sees it: ``out[M, n] = x[M, k] @ W[n, k].T``.

    ``M`` is the token count (tuned over buckets up to ``max_num_batched_tokens``).
    """

    name: str
    n: int
    k: int


def load_hf_config(spec: str | Path) -> dict[str, Any]:
    """The config dict of a model, for a node operator's own commands (never for what a
    job names: see :func:`load_job_model_config`).

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


def moe_shape(config: dict[str, Any], tensor_parallel_size: int = 1, expert_parallel_size: int = 1,
              data_parallel_size: int = 1) -> MoeShape:
    """The per-rank fused-MoE shape of a MoE config.

    With expert parallelism (``expert_parallel_size > 1``) vLLM splits the experts and
    keeps each expert's intermediate whole; otherwise it splits the intermediate over the
    flattened tp x dp ranks (vLLM's ``FusedMoEParallelConfig.make``: a MoE layer is sharded
    over tensor x data parallel ranks).

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
        per_rank_intermediate = _divide(intermediate, tensor_parallel_size * data_parallel_size, "moe_intermediate_size")
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
