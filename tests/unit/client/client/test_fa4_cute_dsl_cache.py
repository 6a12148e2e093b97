"""FlashAttention 4's CuTe DSL kernel cache (vLLM 0.34's ``vllm_flash_attn/cute/cache_utils.py``,
where ``FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1``): harvested from where the tuner points
``FLASH_ATTENTION_CUTE_DSL_CACHE_DIR``, installed by kind into the directory FA4 computes on a pod
of another user and TMPDIR, merged file by file, FA4's lock files left out."""

from __future__ import annotations

import getpass
import tempfile
from types import SimpleNamespace

from tunecache.client.install import install
from tunecache.client.jit_caches import Fa4CuteDslCache, fa4_cute_dsl_cache_dir
from tunecache.client.pipeline import InstallTarget, destinations_of
from tunecache.contract import ArtifactKind
from tunecache.engines import engine_for
from tunecache.service.tuner.vllm_warmup import harvest_warm_state

KIND = ArtifactKind.FA4_CUTE_DSL_CACHE
#: ``get_jit_cache``: ``get_cache_path() / _compute_source_fingerprint() [/ name]``, then ``<key sha256>.o``
FILES = {"5e1f0c/flash_fwd/9ab3.o": b"object", "5e1f0c/flash_fwd/9ab3.lock": b""}


def harvested(tmp_path):
    scratch = tmp_path / "scratch"
    where = engine_for("vllm").harvest_environment(scratch)["FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"]
    for name, body in FILES.items():
        (tmp_path / where / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / where / name).write_bytes(body)
    out = tmp_path / "out"
    out.mkdir()
    artifacts, _ = harvest_warm_state(scratch, out)
    [artifact] = [a for a in artifacts if a.kind == KIND]
    return (out / artifact.path).read_bytes()


def test_the_directory_is_fa4s_own(monkeypatch, tmp_path):
    monkeypatch.delenv("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", raising=False)
    (tmp_path / "pod-tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "pod-tmp"))
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again, as in a fresh process
    try:
        assert fa4_cute_dsl_cache_dir() == tmp_path / "pod-tmp" / getpass.getuser() / "flash_attention_cute_dsl_cache"
    finally:
        tempfile.tempdir = None
    monkeypatch.setenv("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", str(tmp_path / "fa4"))
    assert fa4_cute_dsl_cache_dir() == tmp_path / "fa4"


def test_a_pod_gets_the_kernels_merged_where_fa4_looks_without_its_locks(tmp_path, monkeypatch):
    data = harvested(tmp_path)
    monkeypatch.setenv("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", str(tmp_path / "pod-fa4"))
    (tmp_path / "pod-fa4" / "5e1f0c" / "other").mkdir(parents=True)
    (tmp_path / "pod-fa4" / "5e1f0c" / "other" / "1.o").write_bytes(b"the pod's own")
    run = SimpleNamespace(id=7, entries=0, summary={}, artifact=lambda kind: SimpleNamespace(sha256="0" * 64))
    fetched = SimpleNamespace(warm_state={KIND: data}, drift={}, run=run, signed_by=None)
    assert destinations_of(KIND) == (Fa4CuteDslCache,)
    result = install(fetched, InstallTarget.of((KIND,)))  # by kind, as pull --warm-state and the plugin do
    assert result.warm_state == ("FlashAttention 4 CuTe DSL cache (1 files)",)
    assert (tmp_path / "pod-fa4" / "5e1f0c" / "flash_fwd" / "9ab3.o").read_bytes() == b"object"
    assert not (tmp_path / "pod-fa4" / "5e1f0c" / "flash_fwd" / "9ab3.lock").exists()
    assert (tmp_path / "pod-fa4" / "5e1f0c" / "other" / "1.o").read_bytes() == b"the pod's own"
