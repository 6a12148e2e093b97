"""vLLM's adaptor: what tunecache asks of vLLM, with the release branches inside it.

Each answer is read from the release's row (:data:`tunecache.engines.vllm.releases.RELEASES`)
or from the compile cache's naming (:mod:`tunecache.engines.vllm.compile_cache`); the pod's
hooks (``tunecache.client.boot.hooks``) wrap :meth:`VllmAdaptor.hook_targets`, the tuner points
vLLM's caches with :meth:`VllmAdaptor.harvest_environment`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import ClassVar

from tunecache.engines.base import EngineAdaptor, HookTarget
from tunecache.engines.vllm import compile_cache
from tunecache.engines.vllm.releases import RELEASES, VllmRelease

#: The functions the plugin wraps, in every release tunecache knows (0.25-0.34): the engine's
#: main process builds its config in the first; a worker loads its model, profiles (its first
#: forward pass, where torch.compile loads or compiles) and warms up in the next three;
#: ``kernel_warmup`` and ``flashinfer_autotune`` are where FlashInfer's tactics are read.
HOOK_TARGETS: tuple[HookTarget, ...] = (
    HookTarget("engine_config", "vllm.engine.arg_utils", "EngineArgs.create_engine_config"),
    HookTarget("load_model", "vllm.v1.worker.gpu_worker", "Worker.load_model"),
    HookTarget("first_forward", "vllm.v1.worker.gpu_worker", "Worker.determine_available_memory"),
    HookTarget("warm_up", "vllm.v1.worker.gpu_worker", "Worker.compile_or_warm_up_model"),
    HookTarget("kernel_warmup", "vllm.model_executor.warmup.kernel_warmup", "kernel_warmup"),
    HookTarget("flashinfer_autotune", "vllm.model_executor.warmup.kernel_warmup", "flashinfer_autotune"),
)
#: What releases with the mega AOT artifact (0.33, 0.34: :attr:`VllmRelease.aot_artifact`) add:
#: the function the compiled model's ``__call__`` looks up by its global name with the exact
#: path vLLM is about to load (the compile cache is placed there first).
AOT_HOOK_TARGETS: tuple[HookTarget, ...] = (
    HookTarget("aot_load", "vllm.compilation.decorators", "_try_load_aot_compiled_fn"),
)
#: What releases whose ``vllm preload`` takes warmup-cache stores add (0.34:
#: :attr:`VllmRelease.warmup_cache_store`): the backends' table, where tunecache's store is one
#: entry, and the function each spawned preload daemon runs (which loads no plugins), wrapped
#: so that the daemon registers the store too (:mod:`tunecache.client.preload_store`).
PRELOAD_HOOK_TARGETS: tuple[HookTarget, ...] = (
    HookTarget("warmup_cache_stores", "vllm.model_executor.model_loader.weight_cache.artifact_store", "STORE_BACKENDS"),
    HookTarget("preload_daemon", "vllm.model_executor.model_loader.weight_cache.daemon", "_run_daemon"),
)

#: Where the tuner points each of vLLM's caches while it runs vLLM's warmup, under its scratch
#: directory: variable -> directory. ``VLLM_CACHE_ROOT`` holds ``torch_compile_cache/`` and
#: ``modelinfos/``; ``VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR`` the per-rank files and the v2 store;
#: DeepGEMM's and Triton's caches are pointed apart so that each is harvested as its own kind, and
#: so are the caches 0.33/0.34's JIT warmup fills (``model_executor/warmup/jit_warmup*.py``):
#: TileLang's (``tilelang.env``: ``TILELANG_CACHE_DIR``), the CuTe DSL's
#: (``cutlass.base_dsl.cache_helpers.get_default_generated_ir_path``: ``CUTE_DSL_CACHE_DIR``) and
#: TVM-FFI's (``tvm_ffi.cpp.extension``: ``TVM_FFI_CACHE_DIR``); FlashAttention 4's CuTe DSL cache
#: (``vllm/vllm_flash_attn/cute/cache_utils.py::get_cache_path``: ``FLASH_ATTENTION_CUTE_DSL_CACHE_DIR``),
#: written only where the fleet sets ``FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1``.
HARVEST_DIRS: dict[str, str] = {
    "VLLM_CACHE_ROOT": "vllm-cache",
    "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR": "flashinfer-autotune",
    "DG_JIT_CACHE_DIR": "deep_gemm",
    "TRITON_CACHE_DIR": "triton",
    "TILELANG_CACHE_DIR": "tilelang",
    "CUTE_DSL_CACHE_DIR": "cute-dsl",
    "TVM_FFI_CACHE_DIR": "tvm-ffi",
    "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR": "fa4-cute-dsl",
}


class VllmAdaptor(EngineAdaptor):
    """vLLM 0.25-0.34 (:data:`~tunecache.engines.vllm.releases.RELEASES`)."""

    name: ClassVar[str] = "vllm"

    def release_of(self, version: str) -> VllmRelease | None:
        match = re.match(r"^(\d+)\.(\d+)", version or "")
        return RELEASES.get((int(match[1]), int(match[2]))) if match else None

    def known_range(self) -> str:
        minors = sorted(RELEASES)
        return f"{minors[0][0]}.{minors[0][1]}-{minors[-1][0]}.{minors[-1][1]}"

    def this_release(self) -> tuple[str, VllmRelease | None]:
        import vllm

        version = str(getattr(vllm, "__version__", ""))
        return version, self.release_of(version)

    def autotune_layout(self, release: VllmRelease) -> str:
        return release.autotune_layout

    def hook_targets(self, release: VllmRelease) -> tuple[HookTarget, ...]:
        return (HOOK_TARGETS + (AOT_HOOK_TARGETS if release.aot_artifact else ())
                + (PRELOAD_HOOK_TARGETS if release.warmup_cache_store else ()))

    def hook_target(self, release: VllmRelease, role: str) -> HookTarget:
        """The hook target of ``release`` for ``role``.

        Raises:
            KeyError: ``release`` has none for it."""
        [found] = [target for target in self.hook_targets(release) if target.role == role] or [None]
        if found is None:
            raise KeyError(f"vLLM {getattr(release, 'name', '(unknown release)')} has no hook target for {role!r}")
        return found

    def compile_cache_names(self, node: compile_cache.CompileFactors,
                            pod: compile_cache.PodCompileFactors | None = None) -> dict[str, str]:
        if pod is not None:
            return compile_cache.pod_dir_names(node, pod)
        return {n: n for n in ([node.backbone_dir] if node.backbone_dir else [])
                + ([f"{compile_cache.AOT_DIR}/{node.aot_dir}"] if node.aot_dir else [])}

    def compile_cache_differences(self, node: compile_cache.CompileFactors,
                                  pod: compile_cache.PodCompileFactors) -> list[str]:
        return compile_cache.differences(node, pod)

    def harvest_environment(self, scratch: Path) -> dict[str, str]:
        return {variable: str(scratch / directory) for variable, directory in HARVEST_DIRS.items()}

    def harvest_dir(self, variable: str) -> str:
        return HARVEST_DIRS[variable]
