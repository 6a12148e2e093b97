"""The artifact kinds' table (tunecache.contract.KINDS) and the pod's destinations registered against it."""

import pytest

from tunecache.client.destinations import DESTINATIONS, Destination, registers
from tunecache.client.install import WARM_STATE_KINDS
from tunecache.client.jit_install import JitWorkspace
from tunecache.client.layouts import DeepGemmCache, FlashInferFile, FlashInferV2Store, VllmRankFiles
from tunecache.client.pipeline import destinations_of
from tunecache.client.warm_state import TritonCache, VllmCacheRoot
from tunecache.contract import JSON_MEDIA_TYPE, KINDS, TAR_GZ_MEDIA_TYPE, ArtifactKind, kinds_where
from tunecache.formats.dependencies import DISTRIBUTIONS


def test_every_kind_has_one_entry_under_its_own_name():
    assert set(KINDS) == set(ArtifactKind) and len(KINDS) == len(ArtifactKind)
    assert all(facts.kind is kind for kind, facts in KINDS.items())
    assert len({kind.value for kind in KINDS}) == len(KINDS)
    names = [facts.artifact_name for facts in KINDS.values() if facts.artifact_name]
    assert len(names) == len(set(names))


def test_media_types_are_the_ones_stored():
    assert {kind for kind in ArtifactKind if kind.media_type == JSON_MEDIA_TYPE} == {
        ArtifactKind.FLASHINFER_AUTOTUNE, ArtifactKind.VLLM_RANK_FILE}
    assert all(kind.media_type == TAR_GZ_MEDIA_TYPE for kind in ArtifactKind
               if kind not in (ArtifactKind.FLASHINFER_AUTOTUNE, ArtifactKind.VLLM_RANK_FILE))
    assert ArtifactKind.TRITON_CACHE.facts is KINDS[ArtifactKind.TRITON_CACHE]


def test_doctor_lists_kinds_in_the_tables_order_the_tactics_first_then_as_installed():
    assert list(KINDS) == [ArtifactKind.FLASHINFER_AUTOTUNE, ArtifactKind.FLASHINFER_JIT_MODULE,
                           ArtifactKind.DEEP_GEMM_JIT_CACHE, ArtifactKind.VLLM_RANK_FILE, ArtifactKind.FLASHINFER_V2_STORE,
                           ArtifactKind.TRITON_CACHE, ArtifactKind.VLLM_MODELINFOS, ArtifactKind.VLLM_COMPILE_CACHE,
                           ArtifactKind.TILELANG_CACHE, ArtifactKind.CUTE_DSL_CACHE, ArtifactKind.TVM_FFI_CACHE,
                           ArtifactKind.VLLM_STARTUP_PLAN, ArtifactKind.FA4_CUTE_DSL_CACHE]


def test_the_facts_other_modules_relied_on():
    # everything but the tactics installs only from a trusted, dated signature
    assert set(kinds_where(executable=True)) == set(ArtifactKind) - {
        ArtifactKind.FLASHINFER_AUTOTUNE, ArtifactKind.VLLM_RANK_FILE, ArtifactKind.FLASHINFER_V2_STORE}
    assert kinds_where(required=True) == (ArtifactKind.FLASHINFER_AUTOTUNE,)
    assert set(WARM_STATE_KINDS) == {ArtifactKind.VLLM_MODELINFOS, ArtifactKind.VLLM_COMPILE_CACHE,
                                     ArtifactKind.TRITON_CACHE, ArtifactKind.TILELANG_CACHE,
                                     ArtifactKind.CUTE_DSL_CACHE, ArtifactKind.TVM_FFI_CACHE,
                                     ArtifactKind.VLLM_STARTUP_PLAN, ArtifactKind.FA4_CUTE_DSL_CACHE}
    assert kinds_where(fetch_option="jit") == (ArtifactKind.FLASHINFER_JIT_MODULE,)
    assert kinds_where(fetch_option="deep_gemm") == (ArtifactKind.DEEP_GEMM_JIT_CACHE,)
    assert kinds_where(of_variant=True) == (ArtifactKind.TRITON_CACHE,)
    assert DISTRIBUTIONS == {
        "torch": (ArtifactKind.VLLM_COMPILE_CACHE,),
        "triton": (ArtifactKind.TRITON_CACHE, ArtifactKind.VLLM_COMPILE_CACHE),
        "apache-tvm-ffi": (ArtifactKind.FLASHINFER_JIT_MODULE, ArtifactKind.TVM_FFI_CACHE),
        "nvidia-cutlass-dsl": (ArtifactKind.CUTE_DSL_CACHE,),
        "tilelang": (ArtifactKind.TILELANG_CACHE,),
    }
    assert {kind: facts.artifact_name for kind, facts in KINDS.items() if facts.artifact_name} == {
        ArtifactKind.DEEP_GEMM_JIT_CACHE: "deep-gemm-jit-cache.tar.gz",
        ArtifactKind.FLASHINFER_V2_STORE: "flashinfer-autotune-v2.tar.gz",
        ArtifactKind.VLLM_COMPILE_CACHE: "vllm-compile-cache.tar.gz",
        ArtifactKind.VLLM_MODELINFOS: "vllm-modelinfos.tar.gz",
        ArtifactKind.TRITON_CACHE: "triton-cache.tar.gz",
        ArtifactKind.TILELANG_CACHE: "tilelang-cache.tar.gz",
        ArtifactKind.CUTE_DSL_CACHE: "cute-dsl-cache.tar.gz",
        ArtifactKind.TVM_FFI_CACHE: "tvm-ffi-cache.tar.gz",
        ArtifactKind.VLLM_STARTUP_PLAN: "vllm-startup-plan.tar.gz",
        ArtifactKind.FA4_CUTE_DSL_CACHE: "fa4-cute-dsl-cache.tar.gz",
    }


def test_every_kind_a_pod_installs_has_a_destination_and_no_other_kind_has_one():
    for kind, facts in KINDS.items():
        assert bool(destinations_of(kind)) is facts.installed, kind
    assert destinations_of(ArtifactKind.FLASHINFER_AUTOTUNE) == (FlashInferFile, VllmRankFiles, FlashInferV2Store)
    assert destinations_of(ArtifactKind.FLASHINFER_JIT_MODULE) == (JitWorkspace,)
    assert destinations_of(ArtifactKind.DEEP_GEMM_JIT_CACHE) == (DeepGemmCache,)
    assert destinations_of(ArtifactKind.TRITON_CACHE) == (TritonCache,)
    assert destinations_of(ArtifactKind.VLLM_COMPILE_CACHE) == destinations_of(ArtifactKind.VLLM_MODELINFOS) == (
        VllmCacheRoot,)
    assert VllmCacheRoot.kinds == (ArtifactKind.VLLM_MODELINFOS, ArtifactKind.VLLM_COMPILE_CACHE)
    assert all(issubclass(cls, Destination) and kind in cls.kinds
               for kind, classes in DESTINATIONS.items() for cls in classes)


def test_executable_destinations_tell_doctor_where_with_this_pods_defaults(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setenv("DG_JIT_CACHE_DIR", str(tmp_path / "dg"))
    for kind in kinds_where(executable=True):
        assert all(cls() is not None for cls in destinations_of(kind))  # made with this pod's own directories
    loads, detail = TritonCache().preflight(None, ArtifactKind.TRITON_CACHE)
    assert (loads, detail) == (True, f"merged into {tmp_path / 'triton'}, its group files pointed at this pod's paths")
    assert DeepGemmCache().preflight(None, ArtifactKind.DEEP_GEMM_JIT_CACHE) == (True, f"merged into {tmp_path / 'dg'}")


def test_a_kind_kept_with_the_run_only_cannot_get_a_destination():
    with pytest.raises(ValueError, match="kept with the run only"):
        registers(ArtifactKind.VLLM_RANK_FILE)(type("Elsewhere", (Destination,), {}))
    assert destinations_of(ArtifactKind.VLLM_RANK_FILE) == ()
