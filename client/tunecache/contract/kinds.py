"""Artifact kinds, declared once: each kind's name and the facts both sides rely on.

:data:`KINDS` holds one :class:`KindFacts` per :class:`ArtifactKind`: its media type, whether
a pod installs it only from a run signed by a trusted key with a dated signature
(``executable``), which fetch option downloads it, which packages' versions it was built
against (a pod with other versions leaves it out: :func:`tunecache.formats.dependencies.drift`),
the name of its one artifact in a run, and more. Modules that treat kinds alike iterate this
table instead of naming kinds.

Each kind has two classes besides its entry, registered against it (the way
``torch._inductor.remote_cache`` backends and MLflow's artifact repositories are): its
*harvester* on the tuner's side (``tunecache.service.tuner.harvest``: what the tuner's run
wrote, as artifacts) and its *destination* on the pod's side
(``tunecache.client.destinations``: where this pod installs it). This module is pure data:
the standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass

from tunecache.contract.identity import StrEnum


class ArtifactKind(StrEnum):
    """What an artifact of a run holds (:data:`KINDS` has each kind's facts).

    * ``flashinfer_autotune_v1``: FlashInfer's autotune cache file
      (``flashinfer.autotuner.AutoTuner.save_configs``); every succeeded run has one.
    * ``flashinfer_jit_module``: one FlashInfer JIT module (``cached_ops/<module>`` and
      ``generated/<module>``) as a gzipped tarball with nanosecond file times.
    * ``deep_gemm_jit_cache``: DeepGEMM's JIT cache directory as a gzipped tarball.
    * ``vllm_flashinfer_autotune_v1``: one of vLLM's per-rank autotune files (or 0.33/0.34's shared
      ``autotune_configs.json`` beside them, written on SM120), kept with the run.
    * ``flashinfer_autotune_v2_store``: FlashInfer's v2 store directory as a gzipped tarball.
    * ``vllm_compile_cache``: vLLM's torch.compile cache (``$VLLM_CACHE_ROOT/torch_compile_cache/``:
      the hashed directory and ``torch_aot_compile/<hash>/``) as a gzipped tarball; installed
      under the directory names the pod's own vLLM computes (:mod:`tunecache.engines.vllm.compile_cache`).
    * ``vllm_modelinfos``: vLLM's model-inspection cache (``$VLLM_CACHE_ROOT/modelinfos/``) as a
      gzipped tarball.
    * ``triton_cache``: Triton's kernel cache (``TRITON_CACHE_DIR``) as a gzipped tarball.
    * ``tilelang_cache``: TileLang's kernel cache (``TILELANG_CACHE_DIR``) as a gzipped tarball.
    * ``cute_dsl_cache``: the CuTe DSL's file cache (``nvidia-cutlass-dsl``, ``CUTE_DSL_CACHE_DIR``)
      as a gzipped tarball.
    * ``tvm_ffi_cache``: TVM-FFI's build cache (``TVM_FFI_CACHE_DIR``) as a gzipped tarball.
    * ``vllm_startup_plan``: vLLM 0.33/0.34's startup plans (``$VLLM_CACHE_ROOT/startup_plan/``, where
      ``VLLM_ENABLE_STARTUP_PLAN=1``) as a gzipped tarball; a worker places only the plan of the
      fingerprint its own vLLM computes (:mod:`tunecache.engines.vllm.startup_plan`).
    * ``fa4_cute_dsl_cache``: FlashAttention 4's CuTe DSL kernel cache (``FLASH_ATTENTION_CUTE_DSL_CACHE_DIR``,
      where ``FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1``) as a gzipped tarball.

    The compile cache, model inspections and the caches after them, with the JIT modules and the DeepGEMM cache, are the run's *warm state*:
    what a boot compiles; a pod installs them only from a run signed by a trusted key.
    """

    FLASHINFER_AUTOTUNE = "flashinfer_autotune_v1"
    FLASHINFER_JIT_MODULE = "flashinfer_jit_module"
    DEEP_GEMM_JIT_CACHE = "deep_gemm_jit_cache"
    VLLM_RANK_FILE = "vllm_flashinfer_autotune_v1"
    FLASHINFER_V2_STORE = "flashinfer_autotune_v2_store"
    VLLM_COMPILE_CACHE = "vllm_compile_cache"
    VLLM_MODELINFOS = "vllm_modelinfos"
    TRITON_CACHE = "triton_cache"
    TILELANG_CACHE = "tilelang_cache"
    CUTE_DSL_CACHE = "cute_dsl_cache"
    TVM_FFI_CACHE = "tvm_ffi_cache"
    VLLM_STARTUP_PLAN = "vllm_startup_plan"
    FA4_CUTE_DSL_CACHE = "fa4_cute_dsl_cache"

    @property
    def facts(self) -> KindFacts:
        """Its entry in :data:`KINDS`."""
        return KINDS[self]

    @property
    def media_type(self) -> str:
        """The media type its bytes are stored and served as."""
        return KINDS[self].media_type


JSON_MEDIA_TYPE = "application/json"
TAR_GZ_MEDIA_TYPE = "application/gzip"


@dataclass(frozen=True)
class KindFacts:
    """What both sides know of one artifact kind."""

    kind: ArtifactKind
    media_type: str
    """The media type its bytes are stored and served as."""
    executable: bool = False
    """Code the inference process loads, or data it trusts as much (vLLM's model inspections):
    a pod installs it only from a run signed by a trusted key with a dated signature
    (manifest format 2), never from an unsigned one."""
    fetch_option: str | None = None
    """The keyword of ``tunecache.client.install.fetch_tuning`` that downloads it (``jit``,
    ``deep_gemm``, ``warm_state``); ``None``: the tactics' file, always fetched, or a kind
    pods do not fetch."""
    depends_on: tuple[str, ...] = ()
    """The distributions (their names, as ``importlib.metadata`` knows them) whose version it
    was built against: a pod whose version of one differs leaves it out
    (:func:`tunecache.formats.dependencies.drift`)."""
    artifact_name: str | None = None
    """The name of a run's one artifact of this kind; ``None``: a run may have several, each
    named by what it holds (a JIT module, a rank's file), or the name is the recorder's."""
    required: bool = False
    """Every succeeded run has one."""
    installed: bool = True
    """A pod installs it (through its destination); ``False``: kept with the run only (a pod
    installs the tactics from the FlashInfer file, in the layout its vLLM reads)."""
    of_variant: bool = False
    """An engine variant's run brings its own, which a pod merges beside the key's run's when
    it fetches the variant's compile cache."""


#: Every artifact kind's facts, in the order ``tunecache doctor`` lists them: the tactics'
#: kinds, then the others in the order a pod's install writes them.
KINDS: dict[ArtifactKind, KindFacts] = {facts.kind: facts for facts in (
    KindFacts(ArtifactKind.FLASHINFER_AUTOTUNE, JSON_MEDIA_TYPE, required=True),
    KindFacts(ArtifactKind.FLASHINFER_JIT_MODULE, TAR_GZ_MEDIA_TYPE, executable=True, fetch_option="jit",
              depends_on=("apache-tvm-ffi",)),
    KindFacts(ArtifactKind.DEEP_GEMM_JIT_CACHE, TAR_GZ_MEDIA_TYPE, executable=True, fetch_option="deep_gemm",
              artifact_name="deep-gemm-jit-cache.tar.gz"),
    KindFacts(ArtifactKind.VLLM_RANK_FILE, JSON_MEDIA_TYPE, installed=False),
    KindFacts(ArtifactKind.FLASHINFER_V2_STORE, TAR_GZ_MEDIA_TYPE, artifact_name="flashinfer-autotune-v2.tar.gz",
              installed=False),
    KindFacts(ArtifactKind.TRITON_CACHE, TAR_GZ_MEDIA_TYPE, executable=True, fetch_option="warm_state",
              depends_on=("triton",), artifact_name="triton-cache.tar.gz", of_variant=True),
    KindFacts(ArtifactKind.VLLM_MODELINFOS, TAR_GZ_MEDIA_TYPE, executable=True, fetch_option="warm_state",
              artifact_name="vllm-modelinfos.tar.gz"),
    KindFacts(ArtifactKind.VLLM_COMPILE_CACHE, TAR_GZ_MEDIA_TYPE, executable=True, fetch_option="warm_state",
              depends_on=("torch", "triton"), artifact_name="vllm-compile-cache.tar.gz"),
    KindFacts(ArtifactKind.TILELANG_CACHE, TAR_GZ_MEDIA_TYPE, executable=True, fetch_option="warm_state",
              depends_on=("tilelang",), artifact_name="tilelang-cache.tar.gz"),
    KindFacts(ArtifactKind.CUTE_DSL_CACHE, TAR_GZ_MEDIA_TYPE, executable=True, fetch_option="warm_state",
              depends_on=("nvidia-cutlass-dsl",), artifact_name="cute-dsl-cache.tar.gz"),
    KindFacts(ArtifactKind.TVM_FFI_CACHE, TAR_GZ_MEDIA_TYPE, executable=True, fetch_option="warm_state",
              depends_on=("apache-tvm-ffi",), artifact_name="tvm-ffi-cache.tar.gz"),
    KindFacts(ArtifactKind.VLLM_STARTUP_PLAN, TAR_GZ_MEDIA_TYPE, executable=True, fetch_option="warm_state",
              artifact_name="vllm-startup-plan.tar.gz"),  # torch's version is in the fingerprint a worker checks
    # the CuTe DSL's and TVM-FFI's versions are in the source fingerprint its directories are named by
    KindFacts(ArtifactKind.FA4_CUTE_DSL_CACHE, TAR_GZ_MEDIA_TYPE, executable=True, fetch_option="warm_state",
              artifact_name="fa4-cute-dsl-cache.tar.gz"),
)}


def kinds_where(**facts: object) -> tuple[ArtifactKind, ...]:
    """The kinds whose :class:`KindFacts` have each of ``facts`` (e.g. ``fetch_option="warm_state"``),
    in :data:`KINDS`' order."""
    return tuple(kind for kind, entry in KINDS.items()
                 if all(getattr(entry, name) == value for name, value in facts.items()))
