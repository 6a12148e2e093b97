"""The vLLM releases tunecache knows, and what of a boot's warm state it installs for each: the
table the vLLM adaptor (:class:`tunecache.engines.vllm.adaptor.VllmAdaptor`) reads. A new release is
one more row here, checked by the contract tests against its own wheel.

vLLM promises stability for ``LLM``, ``AsyncLLM`` and ``LLMEngine`` only (vllm#32455); what the
plugin hooks and reads moved between releases, and no function of vLLM tells which layout a
release has, so the release's version picks it here. Each row is checked against that
release's own code by ``tests/contract/test_vllm_releases.py`` (the functions and methods named
exist, the plugin's hook targets among them,
:meth:`tunecache.engines.vllm.adaptor.VllmAdaptor.hook_targets`; the markers of the autotune
layout are in ``kernel_warmup.flashinfer_autotune``; vLLM's ``hash_factors`` hashes as :func:`tunecache.engines.vllm.compile_cache.env_hash` does).

FlashInfer autotune files (``vllm/model_executor/warmup/``):

* ``single-process`` (0.25, 0.26): one ``autotune_configs.json``
  (``resolve_flashinfer_autotune_file``), read by a single-process engine only; an engine of
  several processes tunes every rank itself (nothing to install tactics into);
* ``broadcast`` (0.27-0.31): the same file, read by rank 0 and broadcast to the others, in any
  engine;
* ``per-rank`` (0.32): ``autotune_configs_dp{dp}_rank{rank}.json`` beside that file, one per
  rank, loaded only when every rank's matches;
* ``root`` (0.33, 0.34): ``flashinfer_autotune_root()/<hash>/flashinfer_autotune_filename(dp,
  rank)``, and FlashInfer's v2 store for a single rank (``use_flashinfer_autotune_v2``).

The compile cache: 0.25-0.32 under the directory names the pod computes from each sub-config's
``compute_hash()`` (:mod:`tunecache.client.boot.staged`); 0.33 and 0.34 (torch 2.14's mega AOT
artifact, loaded alone) at the exact path vLLM's ``_try_load_aot_compiled_fn`` receives, with
the device index, the engine variant (0.34: ``VllmConfig.compile_factors()``, field by field)
and torch's ``SystemInfo`` compared first (:mod:`tunecache.client.boot.aot`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class VllmRelease:
    """What tunecache does for one vLLM minor release."""

    minor: tuple[int, int]
    autotune_layout: str
    """``single-process``, ``broadcast``, ``per-rank`` or ``root`` (see the module)."""
    compile_cache: bool
    """Whether the compile cache (and the engine variants) install for it."""
    tested: str
    """How it was tested: ``H200 boots`` and/or ``contract test``."""
    not_supported: str = ""
    """What it does not get, and why (one line; empty: everything)."""
    aot_artifact: bool = False
    """Whether its compile cache is the mega AOT artifact, placed at the path vLLM loads
    (:mod:`tunecache.client.boot.aot`; 0.33, 0.34), rather than directories named from the
    factors (0.25-0.32, :mod:`tunecache.client.boot.staged`)."""
    warmup_cache_store: bool = False
    """Whether its ``vllm preload`` takes shared warmup-cache stores (``--warmup-cache-stores``,
    ``weight_cache/artifact_store.py::STORE_BACKENDS``; 0.34), so the plugin adds tunecache's
    (:mod:`tunecache.client.preload_store`)."""

    deep_gemm_block_ms: tuple[int, ...] = (64, 128, 256)
    """The block Ms its DeepGEMM warmup compiles for
    (``vllm/model_executor/warmup/deep_gemm_warmup.py::_generate_optimal_warmup_m_values``:
    ``[64, 128, 256]`` up to 0.33, ``range(16, 257, 16)`` in 0.34): a DeepGEMM cache covers the
    releases of the set that made it only (:mod:`tunecache.engines.vllm.deep_gemm`)."""

    @property
    def name(self) -> str:
        return f"{self.minor[0]}.{self.minor[1]}"


RELEASES: dict[tuple[int, int], VllmRelease] = {r.minor: r for r in (
    VllmRelease((0, 25), "single-process", True, "H200 boots (compile, graphs, every pod setup) and contract test",
                "tactics in an engine of several processes (this vLLM tunes every rank itself and reads no file)"),
    VllmRelease((0, 26), "single-process", True, "contract test",
                "tactics in an engine of several processes (this vLLM tunes every rank itself and reads no file)"),
    VllmRelease((0, 27), "broadcast", True, "contract test"),
    VllmRelease((0, 28), "broadcast", True, "contract test"),
    VllmRelease((0, 29), "broadcast", True, "contract test"),
    VllmRelease((0, 30), "broadcast", True, "contract test"),
    VllmRelease((0, 31), "broadcast", True, "contract test"),
    VllmRelease((0, 32), "per-rank", True, "contract test"),
    VllmRelease((0, 33), "root", True, "contract test, stand-in", aot_artifact=True),
    VllmRelease((0, 34), "root", True, "contract test, stand-in", aot_artifact=True, warmup_cache_store=True,
                deep_gemm_block_ms=tuple(range(16, 257, 16))),
)}

