"""Install layouts against the paths vLLM 0.33 and FlashInfer 0.7.4 read, with the real H200 files.

vLLM is not installable in CI (its wheel pins another torch), so its path functions are
mirrored and pinned here: ``vllm/model_executor/warmup/flashinfer_autotune_cache.py``
(``flashinfer_autotune_root``, ``flashinfer_autotune_filename``) and the all-ranks check
of ``vllm/model_executor/warmup/kernel_warmup.py`` (``_all_ranks_have_matching_cache``).
FlashInfer's v2 store is checked with FlashInfer's own code.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.support.paths import CUBLASLT_FILE, CUDNN_FILE
from tunecache.client.layouts import install_v2_store, install_vllm_rank_files
from tunecache.engines.vllm.paths import vllm_autotune_root, vllm_rank_file_name
from tests.support.jit import deep_gemm_tarball
from tests.support.torch_tests import IMPORTS_TORCH

CONFIG_HASH = "ab" * 32


def vllm_fingerprint(path: Path):
    """vLLM 0.33 _all_ranks_have_matching_cache: (_metadata as sorted JSON, number of other keys)."""
    configs = json.loads(path.read_text())
    return json.dumps(configs.pop("_metadata"), sort_keys=True), len(configs)


def test_rank_file_names_are_vllms():
    assert vllm_rank_file_name(0, 3) == "autotune_configs_dp0_rank3.json"
    assert vllm_rank_file_name(2, 0) == "autotune_configs_dp2_rank0.json"


def without_flashinfer(monkeypatch) -> None:
    """This process as a pod whose image has no FlashInfer (nor vLLM): importing it fails."""
    for name in ["flashinfer", *[n for n in sys.modules if n.startswith("flashinfer.")]]:
        monkeypatch.setitem(sys.modules, name, None)


@IMPORTS_TORCH
def test_root_follows_vllms_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR", str(tmp_path / "override"))
    assert vllm_autotune_root() == tmp_path / "override"
    monkeypatch.delenv("VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR")
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm-cache"))
    jit_env = pytest.importorskip("flashinfer.jit.env", reason="flashinfer-python is not installed")
    workspace = Path(jit_env.FLASHINFER_WORKSPACE_DIR)  # vLLM uses its last two parts
    assert vllm_autotune_root() == tmp_path / "vllm-cache" / "flashinfer_autotune_cache" / workspace.parent.name / workspace.name


@IMPORTS_TORCH
def test_default_root_is_under_xdg_cache(monkeypatch, tmp_path):
    pytest.importorskip("flashinfer.jit.env", reason="flashinfer-python is not installed")
    for name in ("VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR", "VLLM_CACHE_ROOT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert str(vllm_autotune_root()).startswith(str(tmp_path / "xdg" / "vllm" / "flashinfer_autotune_cache"))


def test_without_vllm_and_flashinfer_only_the_pods_own_setting_gives_the_root(monkeypatch, tmp_path):
    """Nothing but this pod's environment names the root: no version/arch from anywhere else."""
    without_flashinfer(monkeypatch)
    monkeypatch.delenv("VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR", raising=False)
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm-cache"))
    with pytest.raises(ValueError, match="cannot tell FlashInfer's version/arch directory here"):
        vllm_autotune_root()
    monkeypatch.setenv("VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR", str(tmp_path / "pod-root"))
    assert vllm_autotune_root() == tmp_path / "pod-root"
    assert not (tmp_path / "vllm-cache").exists()


def test_every_rank_gets_a_matching_file_at_once(tmp_path):
    root = tmp_path / "root"
    stale = root / CONFIG_HASH / "autotune_configs_dp0_rank7.json"
    stale.parent.mkdir(parents=True)
    stale.write_text("{}")
    ranks = [(0, 0), (0, 1), (1, 0), (1, 1)]
    paths = install_vllm_rank_files(CUDNN_FILE.read_bytes(), root, CONFIG_HASH,
                                    [vllm_rank_file_name(d, r) for d, r in ranks])
    assert sorted(p.name for p in (root / CONFIG_HASH).iterdir()) == sorted(vllm_rank_file_name(d, r) for d, r in ranks)
    assert len({vllm_fingerprint(p) for p in paths}) == 1  # vLLM loads only if all ranks agree
    assert all(p.read_bytes() == CUDNN_FILE.read_bytes() for p in paths)
    assert [p.name for p in root.iterdir()] == [CONFIG_HASH]  # no staging or old directory left


@IMPORTS_TORCH
def test_v2_store_is_readable_by_flashinfer(tmp_path):
    autotune_cache = pytest.importorskip("flashinfer.autotune_cache", reason="flashinfer-python is not installed")
    target = install_v2_store(CUBLASLT_FILE.read_bytes(), tmp_path / "v2root")
    doc = json.loads(CUBLASLT_FILE.read_text())
    store = autotune_cache.ManagedAutotuneCache(doc["_metadata"], root=tmp_path / "v2root")
    assert target == store.env_dir
    entries = {k: v for k, v in doc.items() if not k.startswith("_")}
    for key, (runner, tactic, policy, *_selection) in entries.items():
        hit = store.lookup(key)
        assert hit is not None and (hit.runner, hit.tactic, hit.profiling_policy) == (runner, tactic, tuple(policy))
    assert len(list(store.entries_dir.glob("*.json"))) == len(entries) == 42
    assert json.loads((store.env_dir / "manifest.json").read_text())["cache_schema"] == "v2"


def test_deep_gemm_kernels_merge_into_the_pods_own_cache_directory(tmp_path, monkeypatch):
    """DeepGEMM reads DG_JIT_CACHE_DIR as one directory (``cache/kernel.<name>.<hash>/``,
    csrc/jit/compiler.hpp): a run's kernels are merged in, whole; kernels already there stay."""
    from tunecache.client.layouts import install_deep_gemm_cache
    from tunecache.engines.vllm.paths import deep_gemm_cache_dir

    monkeypatch.delenv("DG_JIT_CACHE_DIR", raising=False)
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm"))
    assert deep_gemm_cache_dir() == tmp_path / "vllm" / "deep_gemm"  # vLLM's default
    monkeypatch.setenv("DG_JIT_CACHE_DIR", str(tmp_path / "dg"))
    cache = deep_gemm_cache_dir()
    assert cache == tmp_path / "dg"
    own = cache / "cache" / "kernel.mine.11" / "kernel.cubin"
    own.parent.mkdir(parents=True)
    own.write_bytes(b"compiled here")
    data = deep_gemm_tarball([("cache/kernel.a.22/kernel.cubin", b"a"), ("cache/kernel.a.22/kernel.cu", b"src"),
                              ("cache/kernel.mine.11/kernel.cubin", b"the run's"), ("tmp/x/kernel.cubin", b"partial")])
    assert install_deep_gemm_cache(data, cache) == ["kernel.a.22"]
    assert (cache / "cache" / "kernel.a.22" / "kernel.cubin").read_bytes() == b"a"
    assert own.read_bytes() == b"compiled here" and not (cache / "tmp").exists()
    assert sorted(p.name for p in (cache / "cache").iterdir()) == ["kernel.a.22", "kernel.mine.11"]  # no staging left
    assert install_deep_gemm_cache(data, cache) == []  # installing again changes nothing
    with pytest.raises(ValueError, match="unsafe entry"):
        install_deep_gemm_cache(deep_gemm_tarball([("../escape", b"x")]), tmp_path / "other")
    assert not (tmp_path / "escape").exists()
