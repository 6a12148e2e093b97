"""The tuner's harvesters, one registered against each artifact kind of the contract."""

import tarfile

import pytest

from tunecache.client.pipeline import destinations_of
from tunecache.contract import KINDS, ArtifactKind
from tunecache.service.tuner.harvest import (
    HARVESTERS,
    DirectoryTarball,
    FlashInferJitHarvester,
    Harvester,
    TritonCacheHarvester,
    harvests,
)


def test_every_kind_has_one_harvester_of_its_own_and_a_destination_where_pods_install_it():
    assert set(HARVESTERS) == set(KINDS)
    assert all(cls.kind is kind and issubclass(cls, Harvester) for kind, cls in HARVESTERS.items())
    assert len(set(HARVESTERS.values())) == len(HARVESTERS)
    assert all(bool(destinations_of(kind)) for kind, facts in KINDS.items() if facts.installed)


def test_a_kind_has_one_harvester():
    with pytest.raises(ValueError, match="has a harvester already: TritonCacheHarvester"):
        harvests(ArtifactKind.TRITON_CACHE)(type("Another", (Harvester,), {}))
    assert HARVESTERS[ArtifactKind.TRITON_CACHE] is TritonCacheHarvester


def test_artifact_descriptions_are_the_ones_recorded(tmp_path):
    assert FlashInferJitHarvester().module_artifact("m").model_dump(mode="json", exclude_none=True) == {
        "kind": "flashinfer_jit_module", "name": "flashinfer-jit/m.tar.gz", "media_type": "application/gzip",
        "path": "jit/m.tar.gz", "module": "m"}
    assert HARVESTERS[ArtifactKind.FLASHINFER_AUTOTUNE]().artifact("autotune.json").model_dump(
        mode="json", exclude_none=True) == {
        "kind": "flashinfer_autotune_v1", "name": "autotune.json", "media_type": "application/json",
        "path": "autotune.json"}
    tarballs = {kind for kind, cls in HARVESTERS.items() if issubclass(cls, DirectoryTarball)}
    assert tarballs == {ArtifactKind.DEEP_GEMM_JIT_CACHE, ArtifactKind.FLASHINFER_V2_STORE,
                        ArtifactKind.VLLM_MODELINFOS, ArtifactKind.TRITON_CACHE, ArtifactKind.TILELANG_CACHE,
                        ArtifactKind.CUTE_DSL_CACHE, ArtifactKind.TVM_FFI_CACHE, ArtifactKind.VLLM_STARTUP_PLAN,
                        ArtifactKind.FA4_CUTE_DSL_CACHE}
    assert all(KINDS[kind].artifact_name for kind in tarballs)


def test_a_directory_kind_is_one_tarball_and_nothing_when_its_tool_wrote_nothing(tmp_path):
    scratch, out = tmp_path / "scratch", tmp_path / "out"
    out.mkdir()
    harvester = TritonCacheHarvester()
    assert harvester.environment(scratch) == {"TRITON_CACHE_DIR": str(scratch / "triton")}
    (scratch / "triton" / "empty").mkdir(parents=True)
    assert harvester.harvest(scratch, out) == ([], {})
    (scratch / "triton" / "abc").mkdir()
    (scratch / "triton" / "abc" / "k.cubin").write_bytes(b"x")
    artifacts, summary = harvester.harvest(scratch, out)
    assert ([a.model_dump(mode="json", exclude_none=True) for a in artifacts], summary) == ([{"kind": "triton_cache", "name": "triton-cache.tar.gz",
                                      "media_type": "application/gzip", "path": "triton-cache.tar.gz"}], {})
    with tarfile.open(out / "triton-cache.tar.gz") as tar:
        assert tar.getnames() == ["abc/k.cubin"]


def test_every_harvester_points_vllms_caches_where_the_adaptor_says(tmp_path):
    """The tuner's warmup runs with the adaptor's environment; each kind's harvester reads there."""
    from tunecache.engines import engine_for
    from tunecache.service.tuner.harvest import HARVESTERS

    scratch = tmp_path
    pointed = engine_for("vllm").harvest_environment(scratch)
    for kind, harvester in HARVESTERS.items():
        for variable, value in harvester().environment(scratch).items():
            assert pointed[variable] == value, kind
    assert set(pointed) == {"VLLM_CACHE_ROOT", "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR", "DG_JIT_CACHE_DIR", "TRITON_CACHE_DIR",
                            "TILELANG_CACHE_DIR", "CUTE_DSL_CACHE_DIR", "TVM_FFI_CACHE_DIR",
                            "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"}
