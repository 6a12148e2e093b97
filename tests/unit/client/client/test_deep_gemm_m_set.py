"""A DeepGEMM cache covers only the vLLM releases whose warmup M set made it
(tunecache.engines.vllm.deep_gemm): 0.34 warms up ``range(16, 257, 16)``, earlier releases
``[64, 128, 256]`` (``deep_gemm_warmup.py::_generate_optimal_warmup_m_values``, checked against
the wheels by tests/contract/test_vllm_releases.py). The run records its set; a pod of another
set leaves the cache out and says why, in the install and before it (doctor)."""

from __future__ import annotations

import io
import tarfile
from types import SimpleNamespace

from tunecache.client.layouts import DeepGemmCache
from tunecache.contract import ArtifactKind
from tunecache.engines.vllm.deep_gemm import M_SET_FIELD, STAGE_BLOCK_MS, m_set_record


def fetched_with_deep_gemm(tmp_path, summary):
    kernel = tmp_path / "made" / "cache" / "kernel.fp8_gemm_nt.0123abcd"
    kernel.mkdir(parents=True)
    (kernel / "kernel.cubin").write_bytes(b"cubin")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(tmp_path / "made" / "cache", arcname="cache")
    return SimpleNamespace(deep_gemm=buffer.getvalue(), run=SimpleNamespace(summary=summary))


def test_a_cache_of_the_pods_m_set_is_merged(tmp_path):
    fetched = fetched_with_deep_gemm(tmp_path, {M_SET_FIELD: m_set_record(STAGE_BLOCK_MS, "tunecache's stage")})
    written = DeepGemmCache(tmp_path / "dg", vllm_version="0.33.0").stage(fetched)()
    assert written["warm_state"] == ("DeepGEMM cache (1 kernels)",)
    assert (tmp_path / "dg" / "cache" / "kernel.fp8_gemm_nt.0123abcd" / "kernel.cubin").is_file()


def test_a_cache_of_another_m_set_is_left_out_with_the_sets_named(tmp_path):
    fetched = fetched_with_deep_gemm(tmp_path, {M_SET_FIELD: m_set_record(STAGE_BLOCK_MS, "tunecache's stage")})
    destination = DeepGemmCache(tmp_path / "dg", vllm_version="0.34.0")
    [line] = destination.stage(fetched)()["warm_state"]
    assert line == ("DeepGEMM cache not installed, made with the block Ms 64, 128, 256 (tunecache's stage), and this "
                    "vLLM 0.34.0 warms DeepGEMM up with 16..256 by 16: it covers only the releases of its own M set")
    assert not (tmp_path / "dg").exists()
    loads, why = destination.preflight(fetched.run, ArtifactKind.DEEP_GEMM_JIT_CACHE)
    assert loads is False and "16..256 by 16" in why
    # 0.34's own set covers a 0.34 pod, and no 0.33 one
    made_by_0_34 = {M_SET_FIELD: m_set_record(tuple(range(16, 257, 16)), "vLLM 0.34.0's deep_gemm_warmup")}
    assert destination.preflight(SimpleNamespace(summary=made_by_0_34), ArtifactKind.DEEP_GEMM_JIT_CACHE)[0] is True
    assert DeepGemmCache(tmp_path / "dg", vllm_version="0.33.0").preflight(
        SimpleNamespace(summary=made_by_0_34), ArtifactKind.DEEP_GEMM_JIT_CACHE)[0] is False


def test_a_run_before_the_record_installs_as_before(tmp_path):
    fetched = fetched_with_deep_gemm(tmp_path, {})
    assert DeepGemmCache(tmp_path / "dg", vllm_version="0.34.0").stage(fetched)()["warm_state"] == (
        "DeepGEMM cache (1 kernels)",)

