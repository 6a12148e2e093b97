"""The reference sequence: vLLM itself warms up the model, tunecache harvests what it wrote.

When vllm is installed on the node, the child starts vLLM for the model with
``load_format="dummy"`` (shapes from the config, random weights), the key's
``max_num_batched_tokens`` and parallel sizes, and every cache vLLM writes pointed into
a scratch directory. vLLM's own ``kernel_warmup`` (``vllm/model_executor/warmup/
kernel_warmup.py``: DeepGEMM warmup, FlashInfer autotune, FlashInfer attention warmup)
then runs and saves:

* per-rank FlashInfer v1 files ``<VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR>/<hash>/
  autotune_configs_dp{dp}_rank{rank}.json`` (``flashinfer_autotune_cache.py``:
  ``flashinfer_autotune_root``, ``flashinfer_autotune_filename``; with the override set,
  vLLM puts ``<hash>`` directly under it), for multi-rank runs;
* FlashInfer's v2 store ``<VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR>/v2/<env_hash>/`` for
  single-rank runs (``use_flashinfer_autotune_v2``);
* vLLM 0.25 (the release that pins torch 2.11 and FlashInfer 0.6.13) instead writes one
  ``<VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR>/<hash>/autotune_configs.json``
  (``resolve_flashinfer_autotune_file``), for single-process engines only;
* DeepGEMM's JIT cache in ``DG_JIT_CACHE_DIR`` (vLLM sets it to
  ``$VLLM_CACHE_ROOT/deep_gemm`` only when unset: ``vllm/utils/deep_gemm.py::_lazy_init``);
* FlashInfer JIT modules in the node's FlashInfer workspace: those the engine loaded
  (the engine runs in the script's process, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``; FlashInfer's
  ``jit_spec_registry``) and those any of vLLM's processes built during the run.

``TUNECACHE_VLLM_ENGINE_ARGS`` (a JSON object of ``vllm.LLM`` keyword arguments, e.g.
``{"attention_backend": "FLASHINFER"}``) gives the node's engine the fleet's other engine
settings, those that decide which kernels warm up; the arguments above come from the key
and this module and cannot be given there.

The engine is built with ``enforce_eager=True`` (no torch.compile, no CUDA graphs: neither
is part of what the run stores, and both cost minutes) and ``served_model_name`` = the
key's model.

tunecache's own warmup stages (:mod:`tunecache.service.tuner.stages`) are what runs on nodes without vLLM.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tunecache.contract import ArtifactKind
from tunecache.service.tuner.jit_artifacts import built_since, deep_gemm_artifact, harvest_flashinfer_jit, tar_directory
from tunecache.service.tuner.stages import TuneSpec

_RANK_FILE = re.compile(r"^autotune_configs_dp(\d+)_rank(\d+)\.json$")

#: What the vLLM process runs: build the engine (its kernel_warmup runs inside), then exit.
_SCRIPT = """
import json, sys, time
from pathlib import Path
from vllm import LLM
args = json.loads(sys.argv[1])
started = time.monotonic()
LLM(**args)
print(f"tunecache: vLLM engine built, kernel_warmup done ({time.monotonic() - started:.1f} s)", flush=True)
try:  # the FlashInfer JIT modules this process's engine used
    from flashinfer.jit import env
    from tunecache.service.tuner.jit_artifacts import used_jit_modules
    used = used_jit_modules(Path(env.FLASHINFER_WORKSPACE_DIR))
except Exception:  # the run is vLLM's files either way; modules built meanwhile are still found
    used = []
Path(sys.argv[2]).write_text(json.dumps(used))
"""

#: Where the script writes the names of the JIT modules its engine used (in ``scratch``).
_USED_MODULES = "flashinfer-jit-used.json"


def vllm_unavailable_reason() -> str | None:
    """``None`` when vllm imports here, else why not."""
    try:
        import vllm  # noqa: F401
    except Exception as exc:  # ImportError, or a torch mismatch raising something else
        return f"vllm is not importable: {type(exc).__name__}: {exc}"
    return None


#: Where a node gives its engine the fleet's other vLLM engine arguments (JSON object).
ENGINE_ARGS_VARIABLE = "TUNECACHE_VLLM_ENGINE_ARGS"


#: ``vllm.LLM`` arguments the key and this module set (:func:`vllm_command`).
_FIXED_ARGS = frozenset({"model", "load_format", "skip_tokenizer_init", "max_num_batched_tokens", "tensor_parallel_size",
                         "data_parallel_size", "enable_expert_parallel", "dtype", "quantization", "enforce_eager",
                         "served_model_name"})


def node_engine_args() -> dict[str, Any]:
    """The node's extra ``vllm.LLM`` keyword arguments from ``TUNECACHE_VLLM_ENGINE_ARGS``
    (``{}`` when unset).

    Raises:
        ValueError: not a JSON object of identifiers, or it names an argument the key or
            this module sets (model, max_num_batched_tokens, parallel sizes, dtype, ...).
    """
    text = os.environ.get(ENGINE_ARGS_VARIABLE, "").strip()
    if not text:
        return {}
    try:
        args = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{ENGINE_ARGS_VARIABLE} is not JSON: {exc}") from None
    if not isinstance(args, dict) or not all(isinstance(k, str) and k.isidentifier() for k in args):
        raise ValueError(f"{ENGINE_ARGS_VARIABLE} must be a JSON object of vllm.LLM keyword arguments")
    fixed = sorted(set(args) & _FIXED_ARGS)
    if fixed:
        raise ValueError(f"{ENGINE_ARGS_VARIABLE} cannot set {', '.join(fixed)}: the tuning key and the vLLM warmup set them")
    return args


def vllm_command(spec: TuneSpec, scratch: Path, python: str = sys.executable) -> tuple[list[str], dict[str, str]]:
    """The command line and environment additions that run vLLM's warmup for ``spec``.

    ``scratch`` receives ``model/config.json`` (the spec's HF config, so no hub access),
    ``vllm-cache/`` (``VLLM_CACHE_ROOT``), ``flashinfer-autotune/``
    (``VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR``) and ``deep_gemm/`` (``DG_JIT_CACHE_DIR``).
    The model is loaded with ``load_format="dummy"`` and ``skip_tokenizer_init=True``,
    with the node's :func:`node_engine_args` added.

    Raises:
        ValueError: ``TUNECACHE_VLLM_ENGINE_ARGS`` is invalid (:func:`node_engine_args`).
    """
    extra = node_engine_args()
    model_dir = scratch / "model"
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(spec.hf_config))
    llm_args: dict[str, Any] = {
        "model": str(model_dir),
        "load_format": "dummy",
        "skip_tokenizer_init": True,
        "max_num_batched_tokens": spec.deployment.max_num_batched_tokens,
        "tensor_parallel_size": spec.deployment.tensor_parallel_size,
        "enable_expert_parallel": spec.deployment.expert_parallel_size > 1,
        "dtype": spec.deployment.dtype,
        "enforce_eager": True,
        "served_model_name": spec.deployment.model,
    }
    if spec.deployment.quantization != "auto":
        llm_args["quantization"] = spec.deployment.quantization
    llm_args.update(extra)
    env = {
        "VLLM_CACHE_ROOT": str(scratch / "vllm-cache"),
        "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR": str(scratch / "flashinfer-autotune"),
        "DG_JIT_CACHE_DIR": str(scratch / "deep_gemm"),
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    }
    return [python, "-c", _SCRIPT, json.dumps(llm_args), str(scratch / _USED_MODULES)], env


def harvest_vllm_cache(scratch: Path, out_dir: Path) -> dict[str, Any]:
    """Collect what vLLM wrote under ``scratch`` (see :func:`vllm_command`) into ``out_dir``.

    Returns ``{"autotune_file": path or None, "artifacts": [...], "ranks": [(dp, rank), ...]}``:
    every per-rank v1 file as a ``vllm_flashinfer_autotune_v1`` artifact named
    ``vllm/<hash>/<file>``, the lowest rank's file also as the run's FlashInfer file (vLLM
    0.25's single ``autotune_configs.json`` is rank ``(0, 0)``'s), the v2 store and the
    DeepGEMM cache as tarballs. Artifact ``path`` values are relative to ``out_dir``.
    """
    artifacts: list[dict[str, Any]] = []
    rank_files: list[tuple[int, int, Path]] = []
    root = scratch / "flashinfer-autotune"
    for path in sorted(root.glob("*/autotune_configs_dp*_rank*.json")):
        match = _RANK_FILE.match(path.name)
        if not match:
            continue
        dp, rank = int(match[1]), int(match[2])
        target = out_dir / "vllm" / path.parent.name / path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(path.read_bytes())
        rank_files.append((dp, rank, target))
        kind = ArtifactKind.VLLM_RANK_FILE
        artifacts.append({"kind": kind.value, "name": f"vllm/{path.parent.name}/{path.name}",
                          "media_type": kind.media_type, "path": str(target.relative_to(out_dir))})
    if not rank_files:  # vLLM 0.25: one file of a single-process engine
        single = sorted(root.glob("*/autotune_configs.json"))
        if single:
            target = out_dir / "vllm" / single[0].parent.name / single[0].name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(single[0].read_bytes())
            rank_files.append((0, 0, target))
    v2 = root / "v2"
    if v2.is_dir() and any(p.is_file() for p in v2.rglob("*")):
        kind, name = ArtifactKind.FLASHINFER_V2_STORE, "flashinfer-autotune-v2.tar.gz"
        (out_dir / name).write_bytes(tar_directory(v2))
        artifacts.append({"kind": kind.value, "name": name, "media_type": kind.media_type, "path": name})
    artifacts.extend(deep_gemm_artifact(scratch / "deep_gemm", out_dir))
    rank_files.sort()
    return {
        "autotune_file": rank_files[0][2] if rank_files else None,
        "artifacts": artifacts,
        "ranks": [(dp, rank) for dp, rank, _ in rank_files],
    }


def run_vllm_warmup(spec: TuneSpec, scratch: Path, out_dir: Path, python: str = sys.executable) -> dict[str, Any]:
    """Run vLLM's warmup for ``spec`` (:func:`vllm_command`) and harvest it (:func:`harvest_vllm_cache`).

    vLLM's output goes to this process's stderr (the tuner log).

    Raises:
        RuntimeError: vLLM exited non-zero, or wrote no v1 FlashInfer file (a single-rank
            vLLM 0.33 keeps FlashInfer's v2 store only, a multi-rank vLLM 0.25 no file;
            tunecache's runs need the v1 file: use the stages warmup there). A
            single-process engine that wrote nothing tuned nothing: the run gets a file
            of no entries (:func:`_untuned_autotune_file`).
        ValueError: ``data_parallel_size`` > 1: one ``vllm.LLM`` engine runs a single
            data-parallel rank, so the stages warmup tunes those shapes.
    """
    if spec.deployment.data_parallel_size > 1:
        raise ValueError("the vLLM warmup runs one engine (data_parallel_size 1); "
                         "use the stages warmup for data_parallel_size > 1")
    command, env = vllm_command(spec, scratch, python)
    started_ns = time.time_ns()
    result = subprocess.run(command, env={**os.environ, **env}, stdout=sys.stderr, stderr=sys.stderr)
    if result.returncode != 0:
        raise RuntimeError(f"vLLM exited with status {result.returncode} (see the tuner log)")
    harvested = harvest_vllm_cache(scratch, out_dir)
    harvested["jit"] = _harvest_jit(scratch, out_dir, started_ns)
    harvested["artifacts"].extend({k: a[k] for k in ("kind", "name", "media_type", "path")} for a in harvested["jit"])
    has_v2 = any(a["kind"] == ArtifactKind.FLASHINFER_V2_STORE.value for a in harvested["artifacts"])
    if harvested["autotune_file"] is None and not has_v2 and spec.deployment.tensor_parallel_size == 1:
        # A single-process engine writes its file (0.25) or v2 store (0.33) only when it tuned an
        # op: nothing means nothing was tunable (e.g. a bf16 dense model on sm90). The run keeps
        # the JIT modules and the DeepGEMM cache, with an autotune file of no entries.
        harvested["autotune_file"] = _untuned_autotune_file(out_dir)
        harvested["ranks"] = [(0, 0)]
    if harvested["autotune_file"] is None:
        raise RuntimeError(
            "vLLM wrote no FlashInfer autotune file that it reads back (vLLM 0.33 keeps a single-rank engine's "
            "tunings in FlashInfer's v2 store; vLLM 0.25 tunes a multi-rank engine without a file); "
            "use the stages warmup (tune --warmup stages) for this key"
        )
    return harvested


def _untuned_autotune_file(out_dir: Path) -> Path:
    """A FlashInfer autotune file with this node's ``_metadata`` and no entries, written by
    FlashInfer itself: ``flashinfer.autotuner.AutoTuner.save_configs`` of a new tuner (not
    the process's ``AutoTuner.get()``, which may hold configs loaded earlier), which has
    tuned and loaded nothing."""
    from flashinfer.autotuner import AutoTuner

    path = out_dir / "vllm" / "untuned" / "autotune_configs.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    AutoTuner().save_configs(str(path))
    return path


def _harvest_jit(scratch: Path, out_dir: Path, started_ns: int) -> list[dict[str, Any]]:
    """The FlashInfer JIT modules vLLM's engine used (listed by the script) or that were
    built in this node's workspace since ``started_ns``, as artifacts
    (:func:`tunecache.service.tuner.jit_artifacts.harvest_flashinfer_jit`); ``[]`` where
    flashinfer is not importable."""
    try:
        from flashinfer.jit import env as jit_env
    except ImportError:
        return []
    try:
        used = json.loads((scratch / _USED_MODULES).read_text())
    except (OSError, ValueError):
        used = []
    modules = sorted(set(used) | set(built_since(Path(jit_env.FLASHINFER_WORKSPACE_DIR), started_ns)))
    return harvest_flashinfer_jit(out_dir, modules)
