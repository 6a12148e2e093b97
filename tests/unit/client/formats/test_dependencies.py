"""What a run's executable kinds were built with, against a pod's packages (tunecache.formats.dependencies)."""

from __future__ import annotations

import io
import tarfile

from tunecache.contract import ArtifactKind
from tunecache.formats.dependencies import NOT_INSTALLED, drift, installed_versions, missing_include_dirs


def test_each_kind_built_with_other_packages_is_named_with_each_difference():
    node = {"torch": "2.11.0", "triton": "3.6.0", "apache-tvm-ffi": "0.1.9"}
    assert drift(node, dict(node)) == {}
    found = drift(node, {"torch": "2.12.0", "triton": "3.6.0", "apache-tvm-ffi": NOT_INSTALLED})
    assert found == {ArtifactKind.VLLM_COMPILE_CACHE: "torch: node 2.11.0, pod 2.12.0",
                     ArtifactKind.FLASHINFER_JIT_MODULE: "apache-tvm-ffi: node 0.1.9, pod (not installed)",
                     ArtifactKind.TVM_FFI_CACHE: "apache-tvm-ffi: node 0.1.9, pod (not installed)"}
    assert drift({"triton": "3.6.0"}, {"triton": "3.7.0"}) == {
        ArtifactKind.VLLM_COMPILE_CACHE: "triton: node 3.6.0, pod 3.7.0",
        ArtifactKind.TRITON_CACHE: "triton: node 3.6.0, pod 3.7.0"}
    assert drift(None, {}) == {} and drift("junk", {}) == {}  # a run recorded before: nothing to compare
    assert set(installed_versions()) == {"torch", "triton", "apache-tvm-ffi", "nvidia-cutlass-dsl", "tilelang"}


def test_include_directories_a_module_names_and_the_pod_lacks(tmp_path):
    here = tmp_path / "include"
    here.mkdir()
    ninja = (f"cflags = -O3 -I{here} -isystem /opt/gone/tvm_ffi/include -Irelative/dir\n"
             f"cuda_cflags = -I {here} -isystem /opt/gone/cccl\n").encode()
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        info = tarfile.TarInfo("cached_ops/norm/build.ninja")
        info.size = len(ninja)
        tar.addfile(info, io.BytesIO(ninja))
    raw.seek(0)
    with tarfile.open(fileobj=raw, mode="r:gz") as tar:
        assert missing_include_dirs(tar, "norm") == ["/opt/gone/tvm_ffi/include", "/opt/gone/cccl"]
        assert missing_include_dirs(tar, "other") == []
