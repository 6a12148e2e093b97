"""TileLang's, the CuTe DSL's and TVM-FFI's caches (vLLM 0.33/0.34's JIT warmup), from the
tuner's harvest to a pod's own directories: each harvested from the directory the tuner's
environment points the package at, installed by kind through :meth:`InstallTarget.of` into
the directory the package computes under another HOME and TMPDIR, merged file by file; a
hostile tarball refused with nothing written; a cache built with another package version left
out and named."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from tunecache.client.install import install
from tunecache.client.jit_caches import CuteDslCache, TileLangCache, TvmFfiCache
from tunecache.client.pipeline import WARM_STATE, InstallTarget, destinations_of
from tunecache.client.warm_state import BadWarmStateArtifact
from tunecache.contract import ArtifactKind
from tunecache.engines import engine_for
from tunecache.service.tuner.vllm_warmup import harvest_warm_state

KINDS = (ArtifactKind.TILELANG_CACHE, ArtifactKind.CUTE_DSL_CACHE, ArtifactKind.TVM_FFI_CACHE)
VARIABLES = ("TILELANG_CACHE_DIR", "CUTE_DSL_CACHE_DIR", "TVM_FFI_CACHE_DIR")
#: What each package writes, relative to its cache directory (names from each package's own code).
FILES = {
    "TILELANG_CACHE_DIR": {"kernels/3f2a/kernel_lib.so": b"tilelang so", "kernels/3f2a/params.pkl": b"params"},
    "CUTE_DSL_CACHE_DIR": {"cute_dsl_9c1e.mlir": b"mlir bytecode"},
    "TVM_FFI_CACHE_DIR": {"flashinfer_ops_77ab/flashinfer_ops.so": b"ffi so", "flashinfer_ops_77ab/build.ninja": b"n"},
}


def tuner_scratch(tmp_path: Path) -> Path:
    """A tuner's scratch after vLLM's warmup: each package wrote where the tuner's environment pointed it."""
    scratch = tmp_path / "scratch"
    environment = engine_for("vllm").harvest_environment(scratch)
    for variable, files in FILES.items():
        for name, body in files.items():
            path = Path(environment[variable]) / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(body)
    return scratch


def fetched_of(tmp_path: Path) -> tuple[list[dict], SimpleNamespace]:
    out = tmp_path / "out"
    out.mkdir()
    artifacts, _ = harvest_warm_state(tuner_scratch(tmp_path), out)
    run = SimpleNamespace(id=7, entries=0, artifact=lambda kind: SimpleNamespace(sha256="0" * 64))
    return artifacts, SimpleNamespace(warm_state={ArtifactKind(a.kind): (out / a.path).read_bytes()
                                                  for a in artifacts}, run=run, signed_by=None, drift={})


@pytest.fixture
def other_pod(tmp_path, monkeypatch) -> Path:
    """A pod with another HOME, TMPDIR and user, none of the packages' variables set."""
    for variable in VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "pod-home"))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "pod-tmp"))
    monkeypatch.setenv("USER", "podder")
    return tmp_path


def test_each_cache_is_harvested_from_where_the_tuner_points_its_package(tmp_path):
    artifacts, _ = fetched_of(tmp_path)
    assert [(a.kind, a.name) for a in artifacts if ArtifactKind(a.kind) in KINDS] == [
        ("tilelang_cache", "tilelang-cache.tar.gz"), ("cute_dsl_cache", "cute-dsl-cache.tar.gz"),
        ("tvm_ffi_cache", "tvm-ffi-cache.tar.gz")]
    for kind in KINDS:  # compiled code: only from a signed run, left out where its package differs
        assert kind.facts.executable and kind.facts.depends_on and kind in WARM_STATE


def test_a_pod_with_another_home_gets_each_cache_where_its_package_looks(other_pod):
    _, fetched = fetched_of(other_pod)
    result = install(fetched, InstallTarget.of(KINDS))
    assert result.warm_state == ("TileLang cache (2 files)", "CuTe DSL cache (1 files)", "TVM-FFI cache (2 files)")
    home, tmp = other_pod / "pod-home", other_pod / "pod-tmp"
    installed = {"TILELANG_CACHE_DIR": home / ".tilelang" / "cache",
                 "CUTE_DSL_CACHE_DIR": tmp / "podder" / "cutlass_python_cache",
                 "TVM_FFI_CACHE_DIR": home / ".cache" / "tvm-ffi"}
    for variable, files in FILES.items():
        for name, body in files.items():
            assert (installed[variable] / name).read_bytes() == body
    assert not [p for d in installed.values() for p in d.rglob(".*")]  # no staging left


def test_the_variable_moves_each_cache_and_a_file_the_pod_has_stays(other_pod, monkeypatch):
    _, fetched = fetched_of(other_pod)
    moved = {variable: other_pod / "moved" / variable for variable in VARIABLES}
    for variable, path in moved.items():
        monkeypatch.setenv(variable, str(path))
    mine = moved["TVM_FFI_CACHE_DIR"] / "flashinfer_ops_77ab" / "flashinfer_ops.so"
    mine.parent.mkdir(parents=True)
    mine.write_bytes(b"pod's own")
    result = install(fetched, InstallTarget.of(KINDS))
    assert result.warm_state == ("TileLang cache (2 files)", "CuTe DSL cache (1 files)", "TVM-FFI cache (1 files)")
    assert mine.read_bytes() == b"pod's own"
    assert (moved["TVM_FFI_CACHE_DIR"] / "flashinfer_ops_77ab" / "build.ninja").read_bytes() == b"n"
    assert (moved["CUTE_DSL_CACHE_DIR"] / "cute_dsl_9c1e.mlir").is_file()
    assert not (other_pod / "pod-home").exists()


def _tarball(name: str, kind: str = "file") -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        member = tarfile.TarInfo(name)
        if kind == "link":
            member.type, member.linkname = tarfile.SYMTYPE, "/etc/passwd"
            tar.addfile(member)
        else:
            member.size = 1
            tar.addfile(member, io.BytesIO(b"x"))
    return raw.getvalue()


@pytest.mark.parametrize("data, message", [
    (_tarball("../escape"), "unsafe entry"),
    (_tarball("/abs"), "unsafe entry"),
    (_tarball("kernels/link", "link"), "unsafe entry"),
    (b"\x1f\x8b partial gzip", "not a gzipped tarball"),
], ids=["dot-dot", "absolute", "link", "not-gzip"])
@pytest.mark.parametrize("kind", KINDS, ids=str)
def test_a_hostile_tarball_is_refused_before_anything_is_written(other_pod, kind, data, message):
    fetched = SimpleNamespace(warm_state={kind: data}, drift={})
    with pytest.raises(BadWarmStateArtifact, match=message):
        InstallTarget.of([kind], at={kind: other_pod / "pod"}).steps[0].stage(fetched)
    assert not (other_pod / "pod").exists() and not (other_pod / "pod-home").exists()


def test_a_cache_built_with_another_package_version_is_left_out_and_named(other_pod):
    _, fetched = fetched_of(other_pod)
    fetched.drift = {ArtifactKind.TVM_FFI_CACHE: "apache-tvm-ffi: node 0.1.9, pod 0.1.15"}
    written = TvmFfiCache().stage(fetched)()
    assert written["warm_state"] == ("TVM-FFI cache not installed, built with other packages "
                                     "(apache-tvm-ffi: node 0.1.9, pod 0.1.15)",)
    assert not (other_pod / "pod-home" / ".cache" / "tvm-ffi").exists()


def test_each_kind_has_its_destination_and_says_where_before_a_boot(other_pod):
    assert [destinations_of(kind) for kind in KINDS] == [(TileLangCache,), (CuteDslCache,), (TvmFfiCache,)]
    assert CuteDslCache().preflight(None, ArtifactKind.CUTE_DSL_CACHE) == (
        True, f"merged into {other_pod / 'pod-tmp' / 'podder' / 'cutlass_python_cache'}, file by file")
