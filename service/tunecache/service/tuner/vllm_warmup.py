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
  ``jit_spec_registry``) and those any of vLLM's processes built during the run;
* the rest of the boot's warm state (issue "the whole warm state"): vLLM's torch.compile
  cache (``$VLLM_CACHE_ROOT/torch_compile_cache/``) with the factors that named its
  directories (:class:`tunecache.engines.vllm.compile_cache.CompileFactors`, from the backbone's
  ``cache_key_factors.json`` and, in the engine's worker, ``VllmConfig`` and vLLM's
  ``_model_hash_key``), vLLM's model-inspection cache (``$VLLM_CACHE_ROOT/modelinfos/``) and
  Triton's cache (``TRITON_CACHE_DIR``), each a tarball of its own kind.

``TUNECACHE_VLLM_ENGINE_ARGS`` (a JSON object of ``vllm.LLM`` keyword arguments, e.g.
``{"attention_backend": "FLASHINFER"}``) gives the node's engine the fleet's other engine
settings, those that decide which kernels warm up; the arguments above come from the key
and this module and cannot be given there. It is the node operator's (set where the tuner
runs, like the image and the rest of its environment), so it is not held to the allow-list
of the engine variants' arguments: those come from requests (a job's, a report's) and are
checked here again, right before ``vllm.LLM`` (:func:`variant_engine_args`).

The engine boots as the fleet's do: vLLM's default torch.compile and CUDA graphs (unless
the node's engine arguments say ``"enforce_eager": true``), with ``served_model_name`` = the
key's model. vLLM hashes ``ModelConfig.model`` (here the scratch directory holding the
config) into its compile-cache names; a pod's vLLM plugin puts the cache under the names its
own config gives when that is the only difference.

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
from tunecache.contract.engine_args import check_engine_args
from tunecache.contract.identity import KEY_ENGINE_ARGS
from tunecache.service.tuner.harvest import (
    COMPILE_FACTS_FILE,
    ENGINE,
    HARVESTERS,
    Artifact,
    DeepGemmCacheHarvester,
    FlashInferV2StoreHarvester,
    VllmRankFilesHarvester,
)
from tunecache.service.tuner.jit_artifacts import built_since, harvest_flashinfer_jit
from tunecache.service.tuner.stages import TuneSpec

_RANK_FILE = re.compile(r"^autotune_configs_dp(\d+)_rank(\d+)\.json$")

#: What the vLLM process runs: build the engine (its kernel_warmup runs inside), then exit.
_SCRIPT = """
import json, sys, time
from pathlib import Path
from vllm import LLM
from tunecache.service.tuner.vllm_warmup import compile_facts, watch_traced_files
args = json.loads(sys.argv[1])
try:  # an eager engine, or a vLLM without this compile backend, compiles nothing to record
    traced = watch_traced_files()
except Exception:
    traced = set()
started = time.monotonic()
llm = LLM(**args)
print(f"tunecache: vLLM engine built, kernel_warmup done ({time.monotonic() - started:.1f} s)", flush=True)
try:  # every registered model's inspection, where the release can (0.34)
    from tunecache.service.tuner.vllm_warmup import fill_model_info_cache
    fill_model_info_cache()
except Exception as exc:
    print(f"tunecache: model inspections not filled: {type(exc).__name__}: {exc}", file=sys.stderr)
try:  # what named the compile cache's directories, from the engine's own worker
    facts = llm.collective_rpc(compile_facts)[0]
    facts["traced_files"] = sorted(traced)
    from tunecache.service.tuner.aot_harvest import aot_rank_facts
    facts["aot_ranks"] = llm.collective_rpc(aot_rank_facts)  # each rank's device index (vLLM 0.33/0.34)
except Exception as exc:
    facts = {"error": f"{type(exc).__name__}: {exc}"}
Path(sys.argv[3]).write_text(json.dumps(facts))
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


def fill_model_info_cache() -> bool:
    """Fill vLLM's model-inspection cache (``$VLLM_CACHE_ROOT/modelinfos/``, harvested as
    ``vllm_modelinfos``) with every model vLLM registers, not only the tuned one, where the
    release has ``vllm/model_executor/models/registry.py::_ModelRegistry.fill_model_info_cache``
    (0.34: one subprocess inspects them all, each entry keyed by its module's relative paths and
    bytes, so a pod of any architecture in the same image finds its own). ``False``: a release
    without it (the tuned model's inspection is cached by the boot as before), or it failed
    (said on stderr). Runs in the tuner's vLLM process only."""
    try:
        from vllm.model_executor.models.registry import ModelRegistry
    except Exception as exc:
        print(f"tunecache: model inspections not filled: {type(exc).__name__}: {exc}", file=sys.stderr)
        return False
    fill = getattr(ModelRegistry, "fill_model_info_cache", None)
    if not callable(fill):
        return False
    fill()  # best effort in vLLM: a model that fails to inspect is left to the boot that needs it
    return True


def watch_traced_files() -> set[str]:
    """The source files vLLM's torch.compile traces, as a set that fills while vLLM compiles:
    ``VllmBackend.__call__`` (``vllm/compilation/backends.py``) hashes
    ``compilation_config.traced_files`` into its cache name and then clears it, so they are
    copied on the way in. Runs in the tuner's vLLM process only."""
    from vllm.compilation import backends

    seen: set[str] = set()
    original = backends.VllmBackend.__call__

    def __call__(self, graph, example_inputs):  # noqa: N807 - the wrapped method's name
        seen.update(str(f) for f in self.compilation_config.traced_files if f != "<string>")
        return original(self, graph, example_inputs)

    backends.VllmBackend.__call__ = __call__
    return seen


def compile_facts(worker: Any) -> dict[str, Any]:
    """In the engine's worker (``LLM.collective_rpc``): the factors of its compile cache that
    ``cache_key_factors.json`` does not hold: vLLM's version, each sub-config's
    ``compute_hash()`` (:func:`tunecache.engines.vllm.compile_cache.config_hashes`),
    ``ModelConfig.model``, the AOT factors past the config hash
    (``vllm.compilation.caching.aot_compile_hash_factors``) and the compiled module's
    ``vllm.compilation.decorators._model_hash_key``."""
    import vllm
    import vllm.envs as envs
    from vllm.compilation.caching import aot_compile_hash_factors
    from vllm.compilation.decorators import _model_hash_key

    from tunecache.engines.vllm.compile_cache import config_hashes, variant_factors

    config = worker.vllm_config
    model = worker.model_runner.model
    # every module @support_torch_compile made (its __init__ sets this flag) is a compiled one
    keys = sorted({_model_hash_key(m.forward) for m in model.modules()
                   if hasattr(m, "was_aot_compile_fn_loaded_from_disk")})
    served = config.model_config.served_model_name
    served = served[0] if isinstance(served, (list, tuple)) else served
    factors = aot_compile_hash_factors(config)
    variant = variant_factors(config, envs.compile_factors(), vllm.__version__, str(served or config.model_config.model))
    return {
        "vllm_version": vllm.__version__,
        "config_hashes": config_hashes(config),
        "model": str(config.model_config.model),
        "aot_extra": [str(f) for f in factors[2:]],
        "aot_extra_repr": [repr(f) for f in factors[2:]],  # as str() of vLLM's list writes each
        "model_hash_key": keys[0] if len(keys) == 1 else None,
        "variant_factors": variant.model_dump(mode="json"),
    }


def vllm_unavailable_reason(python: str = sys.executable, env: dict[str, str] | None = None) -> str | None:
    """``None`` when ``python`` (with ``env``) finds a ``vllm`` package to import, else why not.
    Asked of that interpreter (``importlib.util.find_spec``, without importing vLLM), as the
    engine runs there."""
    probe = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('vllm') else 3)"
    try:
        found = subprocess.run([python, "-c", probe], env=env, capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{python} cannot be run: {type(exc).__name__}: {exc}"
    return None if found.returncode == 0 else f"no vllm package for {python}"


#: Where a node gives its engine the fleet's other vLLM engine arguments (JSON object).
ENGINE_ARGS_VARIABLE = "TUNECACHE_VLLM_ENGINE_ARGS"


#: ``vllm.LLM`` arguments the key and this module set (:func:`vllm_command`).
_FIXED_ARGS = KEY_ENGINE_ARGS


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


def variant_engine_args(args: dict[str, Any]) -> dict[str, Any]:
    """An engine variant's ``vllm.LLM`` arguments (a job's or ``tune --engine-args``), which go
    over the node's :func:`node_engine_args`: checked again against the contract's allow-list
    (:func:`tunecache.contract.engine_args.check_engine_args`), whatever built the spec.

    Raises:
        ValueError: an argument, or a field of a nested one, is not allowed (the message names
            it), or its value is out of its bounds.
    """
    return dict(check_engine_args(dict(args)))


def vllm_command(spec: TuneSpec, scratch: Path, python: str = sys.executable) -> tuple[list[str], dict[str, str]]:
    """The command line and environment additions that run vLLM's warmup for ``spec``.

    ``scratch`` receives ``model/config.json`` (the spec's HF config, so no hub access) and
    the directories vLLM's adaptor points its caches at
    (:meth:`tunecache.engines.vllm.adaptor.VllmAdaptor.harvest_environment`, which every kind's
    harvester reads, :meth:`tunecache.service.tuner.harvest.Harvester.environment`:
    ``vllm-cache/`` for ``VLLM_CACHE_ROOT``, ``flashinfer-autotune/`` for
    ``VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR``, ``deep_gemm/`` for ``DG_JIT_CACHE_DIR``, ``triton/``
    for ``TRITON_CACHE_DIR``).
    The model is loaded with ``load_format="dummy"`` and ``skip_tokenizer_init=True``,
    with the node's :func:`node_engine_args` added and the spec's variant arguments
    (``spec.engine_args``) over them.

    Raises:
        ValueError: ``TUNECACHE_VLLM_ENGINE_ARGS`` is invalid (:func:`node_engine_args`), or the
            spec's engine arguments are not all allowed (:func:`variant_engine_args`); nothing
            is written then.
    """
    extra = {**node_engine_args(), **variant_engine_args(spec.engine_args)}
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
        "served_model_name": spec.deployment.model,
    }
    if spec.deployment.quantization != "auto":
        llm_args["quantization"] = spec.deployment.quantization
    llm_args.update(extra)
    env = ENGINE.harvest_environment(scratch)  # every kind's harvester reads where the adaptor points it
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    return [python, "-c", _SCRIPT, json.dumps(llm_args), str(scratch / _USED_MODULES), str(scratch / COMPILE_FACTS_FILE)], env


def harvest_vllm_cache(scratch: Path, out_dir: Path) -> dict[str, Any]:
    """Collect what vLLM wrote under ``scratch`` (see :func:`vllm_command`) into ``out_dir``.

    Returns ``{"autotune_file": path or None, "artifacts": [...], "ranks": [(dp, rank), ...]}``:
    every per-rank v1 file as a ``vllm_flashinfer_autotune_v1`` artifact named
    ``vllm/<hash>/<file>`` (with vLLM 0.33/0.34's shared ``autotune_configs.json`` beside them,
    written on SM120 by the sparse-MLA decode autotune), the lowest rank's file also as the run's FlashInfer file (vLLM
    0.25's single ``autotune_configs.json`` is rank ``(0, 0)``'s), the v2 store and the
    DeepGEMM cache as tarballs. Artifact ``path`` values are relative to ``out_dir``.
    """
    artifacts: list[Artifact] = []
    rank_files: list[tuple[int, int, Path]] = []
    harvester = VllmRankFilesHarvester()
    root = scratch / harvester.scratch_dir

    def kept(path: Path) -> Path:
        """``path`` (``<root>/<hash>/<file>``) copied to ``out_dir/vllm/<hash>/<file>``."""
        target = out_dir / "vllm" / path.parent.name / path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(path.read_bytes())
        return target

    for path in sorted(root.glob("*/autotune_configs_dp*_rank*.json")):
        match = _RANK_FILE.match(path.name)
        if not match:
            continue
        target = kept(path)
        rank_files.append((int(match[1]), int(match[2]), target))
        artifacts.append(harvester.artifact(f"vllm/{path.parent.name}/{path.name}", str(target.relative_to(out_dir))))
    single = sorted(root.glob("*/autotune_configs.json"))
    if rank_files:  # vLLM 0.33/0.34 on SM120: the sparse-MLA decode autotune's shared file, kept with the run
        for path in single:  # (a pod writes the run's file there, which holds its entries: shared_autotune_file_names)
            artifacts.append(harvester.artifact(f"vllm/{path.parent.name}/{path.name}",
                                                str(kept(path).relative_to(out_dir))))
    elif single:  # vLLM 0.25: one file of a single-process engine
        rank_files.append((0, 0, kept(single[0])))
    for tarball in (FlashInferV2StoreHarvester(), DeepGemmCacheHarvester()):
        artifacts.extend(tarball.harvest(scratch, out_dir)[0])
    rank_files.sort()
    return {
        "autotune_file": rank_files[0][2] if rank_files else None,
        "artifacts": artifacts,
        "ranks": [(dp, rank) for dp, rank, _ in rank_files],
    }


def harvest_warm_state(scratch: Path, out_dir: Path) -> tuple[list[Artifact], dict[str, Any]]:
    """The warm-state kinds (``fetch_option`` ``warm_state`` in :data:`tunecache.contract.KINDS`:
    vLLM's compile cache, its model-inspection cache, Triton's cache) under ``scratch``
    (:func:`vllm_command`) as artifacts in ``out_dir``, each by its harvester, in
    :data:`tunecache.service.tuner.harvest.HARVESTERS`' order.

    Returns the artifacts and the run summary's ``vllm_compile`` (the compile cache's factors,
    :class:`tunecache.service.tuner.harvest.CompileCacheHarvester`; ``{}`` when vLLM compiled nothing).
    """
    artifacts: list[Artifact] = []
    summary: dict[str, Any] = {}
    for kind, harvester in HARVESTERS.items():
        if kind.facts.fetch_option != "warm_state":
            continue
        found, fields = harvester().harvest(scratch, out_dir)
        artifacts.extend(found)
        summary.update(fields)
    return artifacts, summary.get("vllm_compile", {})


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
            data-parallel rank, so the stages warmup tunes those shapes; or vLLM is not
            importable in this interpreter (:func:`vllm_unavailable_reason`): nothing is started.
    """
    if spec.deployment.data_parallel_size > 1:
        raise ValueError("the vLLM warmup runs one engine (data_parallel_size 1); "
                         "use the stages warmup for data_parallel_size > 1")
    command, env = vllm_command(spec, scratch, python)
    missing = vllm_unavailable_reason(python, {**os.environ, **env})
    if missing:
        raise ValueError(f"the vLLM warmup needs vLLM where the tuner runs ({missing}): run the tuner in the "
                         "fleet's vLLM image (the Dockerfile's BASE_IMAGE), or use the stages warmup")
    started_ns = time.time_ns()
    result = subprocess.run(command, env={**os.environ, **env}, stdout=sys.stderr, stderr=sys.stderr)
    if result.returncode != 0:
        raise RuntimeError(f"vLLM exited with status {result.returncode} (see the tuner log)")
    harvested = harvest_vllm_cache(scratch, out_dir)
    harvested["jit"] = _harvest_jit(scratch, out_dir, started_ns)
    warm_state, harvested["vllm_compile"] = harvest_warm_state(scratch, out_dir)
    harvested["artifacts"].extend(warm_state)
    harvested["artifacts"].extend(a.description() for a in harvested["jit"])
    has_v2 = any(a.kind is ArtifactKind.FLASHINFER_V2_STORE for a in harvested["artifacts"])
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


def _harvest_jit(scratch: Path, out_dir: Path, started_ns: int) -> list[Artifact]:
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
