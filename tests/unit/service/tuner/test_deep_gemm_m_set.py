"""The tuner records the DeepGEMM warmup M set its run's DeepGEMM cache was made with
(tunecache.engines.vllm.deep_gemm.M_SET_FIELD): its vLLM release's, from the table checked
against each wheel."""

from __future__ import annotations

from tunecache.contract import ArtifactKind
from tunecache.engines.vllm.deep_gemm import M_SET_FIELD


def test_the_tuners_vllm_warmup_records_its_releases_m_set():
    from tunecache.service.tuner.child import vllm_m_set
    from tunecache.service.tuner.result import HarvestedArtifact

    deep_gemm = HarvestedArtifact(kind=ArtifactKind.DEEP_GEMM_JIT_CACHE, name="deep-gemm.tar.gz",
                                  media_type=ArtifactKind.DEEP_GEMM_JIT_CACHE.media_type, path="deep-gemm.tar.gz")
    harvested = {"vllm_compile": {"vllm_version": "0.34.0"}, "artifacts": [deep_gemm]}
    assert vllm_m_set(harvested) == {M_SET_FIELD: {"block_ms": list(range(16, 257, 16)),
                                                   "made_by": "vLLM 0.34.0's deep_gemm_warmup"}}
    assert vllm_m_set({**harvested, "artifacts": []}) == {}  # no DeepGEMM cache, nothing to say

