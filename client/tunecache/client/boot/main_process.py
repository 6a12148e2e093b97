"""The boot's first phase, in the engine's main process: the run's warm state installed before
vLLM inspects the model and long before any worker exists.

From the plugin's hook on ``EngineArgs.create_engine_config`` (:mod:`tunecache.client.boot.hooks`),
:class:`WarmBoot` looks up the pod's key (from the engine arguments, or from vLLM's config when
they do not give ``max_num_batched_tokens``), fetches the run within the install deadline and
installs what every worker shares: the FlashInfer JIT modules (as an AOT directory), the
DeepGEMM cache, Triton's cache and vLLM's model-inspection cache. The compile cache is only
staged (:mod:`tunecache.client.boot.staged`): vLLM settles parts of its config (the KV-cache
block size among them) in the engine core, so only a worker's config gives the names its vLLM
will look for. What the workers need is handed over in the environment they inherit
(:class:`tunecache.client.boot.handoff.Handoff`). Logs one line; nothing here raises.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tunecache.client.atomic import write_atomically
from tunecache.client.boot.coordination import install_deadline
from tunecache.client.boot.handoff import Handoff
from tunecache.client.boot.staged import unpack_staged
from tunecache.store.http import TunecacheClient
from tunecache.client.install import FetchedTuning, InstallResult, fetch_tuning, install
from tunecache.client.jit_install import JitWorkspace
from tunecache.client.pipeline import BOOT_KINDS, InstallTarget
from tunecache.engines.vllm.paths import vllm_cache_root
from tunecache.contract import ArtifactKind, EnvironmentMetadata, TuningKey
from tunecache.signing import load_trusted_keys

if TYPE_CHECKING:  # the pod's settings, imported only where it is booted (not with the plugin)
    from tunecache.client.settings import ClientSettings

log = logging.getLogger("vllm.plugins.tunecache")


@dataclass
class WarmBoot:
    """The engine main process's install of one boot's warm state (the vLLM plugin's
    ``create_engine_config`` hook), :meth:`before` the model is inspected (or, when the key
    is known only from vLLM's config, :meth:`after`): the FlashInfer JIT modules, the
    DeepGEMM cache, Triton's cache and vLLM's model-inspection cache installed, the compile
    cache staged for the workers (vLLM settles parts of its config, the KV-cache block size
    among them, in the engine core, so only a worker's config gives the names its vLLM will
    look for). Logs one line; nothing here raises."""

    settings: ClientSettings
    started: float
    key: TuningKey | None = None
    fetched: FetchedTuning | None = None
    result: InstallResult | None = None
    failure: str | None = None
    no_compile_cache: str | None = None
    """Why this vLLM gets no compile cache (:mod:`tunecache.engines.vllm.releases`); ``None``: it does."""

    @classmethod
    def before(cls, settings: ClientSettings, key: TuningKey | None, environment: EnvironmentMetadata | None,
               no_compile_cache: str | None = None) -> WarmBoot:
        boot = cls(settings, time.monotonic(), key, no_compile_cache=no_compile_cache)
        if key is not None and environment is not None:
            boot._fetch_and_install(environment, "")
        return boot

    def after(self, key: TuningKey | None, environment: EnvironmentMetadata | None) -> None:
        """When nothing was looked up before (the key needed vLLM's config), do it now."""
        if self.fetched is None and self.failure is None and key is not None and environment is not None:
            self.key = key
            self._fetch_and_install(environment, " (max_num_batched_tokens was not given to vLLM, so the key was "
                                                 "known only after vLLM inspected the model)")

    def _fetch_and_install(self, environment: EnvironmentMetadata, note: str) -> None:
        try:
            deadline = install_deadline(self.settings)
            trusted = load_trusted_keys(self.settings.trusted_keys) if self.settings.trusted_keys else None
            # the same pipeline as `tunecache pull --warm-state`: every kind a boot compiles, into this
            # pod's own directories, but the compile cache, which is staged for the workers (their own
            # configs name it), and the tactics, which the workers install; the workers load the JIT
            # modules through FlashInfer's AOT path (use_staged_aot_dir)
            kinds = tuple(kind for kind in BOOT_KINDS if kind is not ArtifactKind.VLLM_COMPILE_CACHE)
            target = InstallTarget.of(kinds, at={ArtifactKind.FLASHINFER_JIT_MODULE: JitWorkspace(loads_as_aot=True)})
            with TunecacheClient.from_settings(self.settings) as client:
                self.fetched = fetch_tuning(client, self.key, environment, trusted_keys=trusted,
                                            deadline_s=self.started + deadline - time.monotonic(),
                                            **target.fetch_options())
            if self.fetched.executable_refused:
                self.failure, self.fetched = self.fetched.executable_refused, None
            else:
                self.result = install(self.fetched, target)
                Handoff(deep_gemm_dir=self.result.deep_gemm_dir, flashinfer_aot_dir=self.result.jit_aot_dir).hand_over()
                if self.result.triton_cache_dir is not None and not os.environ.get("TRITON_CACHE_DIR", "").strip():
                    # Inductor reads Triton kernels from TRITON_CACHE_DIR when it is set, else from
                    # <TORCHINDUCTOR_CACHE_DIR>/triton/<device> (torch._inductor.runtime.
                    # cache_dir_utils.triton_cache_dir), and vLLM 0.25 points TORCHINDUCTOR_CACHE_DIR
                    # into each compile directory when it loads it (vllm/compilation/decorators.py):
                    # without this the engine writes again the kernels installed in Triton's default
                    # (19 on the H200, 2026-12-03). Triton's own default is this directory already.
                    os.environ["TRITON_CACHE_DIR"] = str(self.result.triton_cache_dir)
                Handoff(warm_state_run=self.fetched.run.id).hand_over()
                Handoff(compile_cache=self._stage_compile_cache(vllm_cache_root())).hand_over()
        except Exception as exc:  # whatever happens, vLLM boots as it would without tunecache
            self.fetched, self.result = None, None
            self.failure = InstallResult.of_failure(exc).reason
        self._log(note)

    def _stage_compile_cache(self, root: Path) -> Path | None:
        """Write the run's compile cache beside the cache root for the workers and unpack it
        there on a thread of its own (:func:`unpack_staged`), while vLLM goes on inspecting the
        model and starting its engine core: a worker then only renames its directories into
        place (:func:`install_staged_compile_cache`)."""
        data = self.fetched.warm_state.get(ArtifactKind.VLLM_COMPILE_CACHE) if self.fetched else None
        if data is None or self.fetched.drift.get(ArtifactKind.VLLM_COMPILE_CACHE) or self.no_compile_cache:
            return None
        path = root / ".tunecache" / f"compile-cache-run-{self.fetched.run.id}.tar.gz"
        write_atomically(path, data)
        threading.Thread(target=unpack_staged, args=(path, data), name="tunecache-unpack", daemon=True).start()
        return path

    def _log(self, note: str) -> None:
        took = time.monotonic() - self.started
        if self.result is None:
            log.info("tunecache: no warm state installed (%.1f s): %s%s", took, self.failure or "nothing looked up", note)
            return
        parts = [f"{len(self.result.jit_modules)} JIT modules", *self.result.warm_state]
        if self.result.deep_gemm_dir is not None:
            parts.append(f"DeepGEMM cache into {self.result.deep_gemm_dir}")
        if Handoff.from_environment().compile_cache:
            parts.append("compile cache staged for the workers")
        elif self.no_compile_cache and self.fetched is not None and self.fetched.warm_state.get(
                ArtifactKind.VLLM_COMPILE_CACHE):
            parts.append(f"compile cache not installed: {self.no_compile_cache}")
        elif self.fetched is not None and self.fetched.drift.get(ArtifactKind.VLLM_COMPILE_CACHE):
            parts.append(f"compile cache not installed, built with other packages "
                         f"({self.fetched.drift[ArtifactKind.VLLM_COMPILE_CACHE]})")
        skipped = f"; {self.result.jit_skipped}" if self.result.jit_skipped else ""
        if self.result.transfer:
            parts.append(f"artifacts {self.result.transfer}")
        log.info("tunecache: warm state of run %s installed for %s in %.1f s: %s%s%s", self.fetched.run.id,
                 self.key.model if self.key else "?", took, ", ".join(parts), skipped, note)
