"""A boot's attestation: what it still compiled, by :class:`tunecache.contract.CompiledKind`.

Counted in each vLLM worker once it warmed up (the plugin wraps the worker's
``compile_or_warm_up_model``), from what vLLM and FlashInfer count themselves and from the
files the boot wrote since it started (:attr:`Handoff.boot_started_ns`, set by the engine's
main process when it loads the plugin, inherited by its workers):

* vLLM's ``vllm.compilation.counter.compilation_counter``: ``num_compiled_artifacts_saved``
  (Inductor graphs compiled: vLLM saves each graph it had to compile; its
  ``num_inductor_compiles`` also counts the identical layers it then takes from a loaded
  graph, 30 of them in a Llama-3.1-8B boot that compiled nothing, measured on the H200) and
  ``num_aot_compiles``. Dynamo's bytecode transform is not counted: vLLM 0.25 runs it in
  every boot, one with every cache warm too;
* FlashInfer's ``AutoTuner.get().stats.tuned_op_total_configs`` (operations profiled);
* files: FlashInfer JIT modules (``*.so`` in the FlashInfer workspace), Triton kernels
  (``*.cubin`` in Triton's cache, vLLM's compile cache and Inductor's cache), DeepGEMM
  kernels (``cache/kernel.*`` directories), vLLM's model inspections (``modelinfos/*.json``).

A boot at the floor counts 0 of everything. Counts of a source that cannot be read here
(no vLLM, no FlashInfer) are left out rather than guessed.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tunecache.client.boot.handoff import Handoff
from tunecache.contract import CompiledKind

def mark_boot_started() -> int:
    """This boot's start (nanoseconds since the epoch: :attr:`Handoff.boot_started_ns`), handed
    over now if no process above did."""
    started = Handoff.from_environment().boot_started_ns
    if started is None:
        started = time.time_ns()
        Handoff(boot_started_ns=started).hand_over()
    return started


def written_since(roots: Iterable[Path | None], pattern: str, since_ns: int, directories: bool = False,
                  until_ns: int | None = None) -> int:
    """Distinct files (or directories) matching ``pattern`` under ``roots``, modified at or after
    ``since_ns`` (and, with ``until_ns``, before it)."""
    seen: set[Path] = set()
    for root in roots:
        if root is None or not root.is_dir():
            continue
        for path in root.rglob(pattern):
            try:
                if not (path.is_dir() if directories else path.is_file()):
                    continue
                mtime = path.stat().st_mtime_ns
                if mtime >= since_ns and (until_ns is None or mtime < until_ns):
                    seen.add(path.resolve())
            except OSError:
                continue
    return len(seen)


def count_files(since_ns: int, *, workspace: Path | None, triton_dirs: Iterable[Path | None],
                deep_gemm_dir: Path | None, vllm_cache_root: Path | None,
                until_ns: int | None = None) -> dict[CompiledKind, int]:
    """The counts that the files a boot wrote since ``since_ns`` (before ``until_ns``) tell."""
    return {
        CompiledKind.FLASHINFER_JIT_MODULES: written_since([workspace], "*.so", since_ns, until_ns=until_ns),
        CompiledKind.TRITON_KERNELS: written_since(triton_dirs, "*.cubin", since_ns, until_ns=until_ns),
        CompiledKind.DEEP_GEMM_KERNELS: written_since([deep_gemm_dir / "cache" if deep_gemm_dir else None], "kernel.*",
                                                      since_ns, directories=True, until_ns=until_ns),
        CompiledKind.MODEL_INSPECTIONS: written_since([vllm_cache_root / "modelinfos" if vllm_cache_root else None],
                                                      "*.json", since_ns, until_ns=until_ns),
    }


def count_vllm(counter: Any) -> dict[CompiledKind, int]:
    """The counts vLLM's ``compilation_counter`` holds."""
    return {
        CompiledKind.INDUCTOR_GRAPHS: int(getattr(counter, "num_compiled_artifacts_saved", 0)),
        CompiledKind.AOT_COMPILES: int(getattr(counter, "num_aot_compiles", 0)),
    }


def this_boot() -> dict[CompiledKind, int]:
    """What this worker's boot compiled, from vLLM, FlashInfer and the files it wrote."""
    return {**boot_files(), **in_process_counts()}


def in_process_counts() -> dict[CompiledKind, int]:
    """What vLLM's ``compilation_counter`` and FlashInfer's autotuner counted in this process
    (quick: the worker reads them when it warmed up, before it serves). FlashInfer's autotuner
    is read only where the process imported it: one that never did tuned nothing (0 ops), and
    importing it here would delay the boot by seconds (torch, ``torch._inductor``)."""
    counts: dict[CompiledKind, int] = {}
    try:
        from vllm.compilation.counter import compilation_counter

        counts.update(count_vllm(compilation_counter))
    except Exception:
        pass
    autotuner = sys.modules.get("flashinfer.autotuner")
    try:
        tuned = getattr(autotuner.AutoTuner.get().stats, "tuned_op_total_configs", {}) if autotuner is not None else {}
        counts[CompiledKind.AUTOTUNE_OPS] = len(tuned)
    except Exception:
        pass
    return counts


def boot_files(until_ns: int | None = None) -> dict[CompiledKind, int]:
    """What the files this boot wrote (since :attr:`Handoff.boot_started_ns`, before ``until_ns``)
    tell: a walk of the pod's FlashInfer workspace, Triton, Inductor, DeepGEMM and vLLM caches
    (about a second on the H200 with a warm state installed: the plugin runs it after the
    worker warmed up, in the background)."""
    from tunecache.client.jit_install import flashinfer_workspace
    from tunecache.engines.vllm.paths import deep_gemm_cache_dir, vllm_cache_root
    from tunecache.client.warm_state import inductor_triton_dir, triton_cache_dir

    since = Handoff.from_environment().boot_started_ns or 0
    root = vllm_cache_root()
    workspace = flashinfer_workspace()
    inductor = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    triton_of_inductor = inductor_triton_dir()
    return count_files(since, workspace=workspace.path if workspace else None,
                       triton_dirs=[triton_cache_dir(), root / "torch_compile_cache", Path(inductor) if inductor else None,
                                    triton_of_inductor.parent if triton_of_inductor else None],
                       deep_gemm_dir=deep_gemm_cache_dir(), vllm_cache_root=root, until_ns=until_ns)
