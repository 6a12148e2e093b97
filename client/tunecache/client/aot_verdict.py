"""Before a boot (``tunecache doctor``, ``doctor --json``): whether a vLLM 0.33/0.34 run's AOT
artifact (:class:`tunecache.engines.vllm.aot.AotArtifacts`, the run summary's
``vllm_compile.aot``) will load in this image, each input that decides it named.

What still makes a pod miss the artifact, compared with what the tuner recorded, as the plugin
compares it at the boot (:func:`tunecache.client.boot.aot.refusals`):

* this image's vLLM version (``vllm.__version__``);
* vLLM's other environment factors (``vllm.envs.compile_factors()``, the placement ones apart:
  :func:`tunecache.engines.vllm.aot.env_differences`);
* torch's load gate, ``torch/_dynamo/package.py::SystemInfo.check_compatibility``: the full
  Python version, torch, the CUDA toolkit, Triton and the exact GPU name (H100 SXM and H100 NVL
  differ), read with torch's own ``SystemInfo.current()``; where this machine has no GPU, the
  toolkit is the one this torch was built for (``torch.version.cuda``) and the GPU name the one
  the pods will have (the key's: FlashInfer's, or ``--gpu-name``).

The per-pod hosts and ports vLLM hashes into the artifact's name (``VLLM_P2P_SIDE_CHANNEL_HOST``,
``..._PORT``, ``MOONCAKE_REQUESTER_LOCAL_HOSTNAME``, ...), ``CUDA_HOME``, ``VLLM_NCCL_SO_PATH`` and
``VLLM_CUDART_SO_PATH`` (:data:`tunecache.engines.vllm.aot.PLACEMENT_ENV_FACTORS`) are named
too: the plugin places the artifact under the pod's own name, so they do not stop it. The
engine variant and the device index are the engine's (its arguments, each worker's CUDA
device), told at the boot.
"""

from __future__ import annotations

import contextvars
import dataclasses
import json
import platform
from typing import Any

from tunecache.engines.vllm.aot import (COMPILE_ON_ONE_RANK, AotArtifacts, env_differences, placement_differences,
                                        system_differences)

#: The GPU name the pods will have (the key's), set by :func:`tunecache.client.preflight.preflight`
#: while it asks each destination; ``None``: this machine's own, where torch sees one.
POD_GPU_NAME: contextvars.ContextVar[str | None] = contextvars.ContextVar("tunecache_pod_gpu_name", default=None)


def vllm_here() -> tuple[str | None, dict[str, Any] | None]:
    """This image's vLLM version and ``vllm.envs.compile_factors()`` as JSON data (``None``
    each: no vLLM here, or it cannot say)."""
    try:
        import vllm

        found = str(vllm.__version__)
    except Exception:
        return None, None
    try:
        import vllm.envs as envs

        return found, json.loads(json.dumps(envs.compile_factors(), default=str))
    except Exception:
        return found, None


def system_here(gpu_name: str | None) -> dict[str, Any]:
    """torch's ``SystemInfo.current()`` as a dict (``torch/_dynamo/package.py``); on a machine
    without a GPU its toolkit and GPU name are ``None``, so they are the toolkit this torch was
    built for (``torch.version.cuda``) and ``gpu_name``. Without torch, Python's version only."""
    system: dict[str, Any] = {"python_version": platform.python_version(), "torch_version": None,
                              "toolkit_version": None, "triton_version": None, "gpu_name": gpu_name}
    try:
        import torch
        from torch._dynamo.package import SystemInfo

        system.update(dataclasses.asdict(SystemInfo.current()))
        system["toolkit_version"] = system.get("toolkit_version") or torch.version.cuda
    except Exception:
        try:
            import torch

            system.update(torch_version=str(torch.__version__), toolkit_version=torch.version.cuda)
        except Exception:
            pass
    if gpu_name:  # the pods' GPU, not this machine's
        system["gpu_name"] = gpu_name
    return json.loads(json.dumps(system, default=str))


def aot_verdict(recorded: dict[str, Any], variant: str | None, engine_args: Any, version: str | None,
                env: dict[str, Any] | None, system: dict[str, Any]) -> tuple[bool | None, str]:
    """Whether the run's AOT artifact (``recorded``: its summary's ``vllm_compile``) loads in an
    image of vLLM ``version`` with ``env`` (its ``compile_factors()``) and torch's ``system``:
    ``False`` naming each input that differs, else ``None`` (the engine's arguments and each
    worker's device decide the rest), naming the placement inputs that differ all the same."""
    try:
        record = AotArtifacts.model_validate(recorded.get("aot"))
    except Exception:
        return False, "the run's AOT record is unreadable (a tuner of another tunecache version)"
    differ: list[str] = []
    if version is None:
        differ.append("vLLM is not installed here")
    elif version != record.vllm_version:
        differ.append(f"vLLM version: tuner {record.vllm_version}, pod {version}")
    moved = placement_differences(record.env, env) if env is not None else []
    if env is not None:
        differ += env_differences(record.env, env)
    differ += [f"torch's SystemInfo would refuse it: {line}" for line in system_differences(record.system, system, True)]
    note = f"; placed under this pod's own name although these differ: {'; '.join(moved)}" if moved else ""
    if differ:
        return False, "vLLM would compile again: " + "; ".join(differ) + note
    if record.one_for_all_ranks:
        ranks = f"one artifact for all ranks and device indexes (pods set {COMPILE_ON_ONE_RANK}=1)"
    else:
        ranks = "each rank's artifact on the device index it compiled on: " + ", ".join(
            f"rank {e.rank} on cuda:{e.device_index if e.device_index is not None else '?'}" for e in record.ranks)
    tuned = (f"tuned with engine arguments {json.dumps(engine_args, sort_keys=True)}" if engine_args
             else "tuned with the node's engine arguments")
    return None, (f"vLLM version, environment factors and torch's SystemInfo (Python, torch, CUDA toolkit, Triton, "
                  f"GPU {record.system.get('gpu_name')!r}) match; {ranks}; engine variant {variant or 'unknown'} "
                  f"({tuned}): a pod booted with the same engine arguments loads it, one with others gets its own "
                  f"variant's run or compiles (the plugin says which){note}")


def run_aot_verdict(run: Any) -> tuple[bool | None, str]:
    """:func:`aot_verdict` of a stored run (:class:`tunecache.contract.TuningRunRead`) in this
    image, for the pods' GPU (:data:`POD_GPU_NAME`)."""
    version, env = vllm_here()
    return aot_verdict(run.summary.get("vllm_compile") or {}, run.variant, run.summary.get("engine_args"), version, env,
                       system_here(POD_GPU_NAME.get()))
