"""JIT module tarballs: harvested deterministically, installed atomically, hostile ones refused."""

from __future__ import annotations

import pytest

from tunecache.client.jit_install import install_jit_module
from tunecache.formats.jit_module import BadJitArtifact, module_tarball
from tests.support.jit import MTIME_NS, fake_workspace, tarball


def test_tarball_is_deterministic_and_install_keeps_mtimes(tmp_path):
    node = fake_workspace(tmp_path / "node")
    data = module_tarball(node, "batch_prefill_bf16_h128")
    assert data == module_tarball(node, "batch_prefill_bf16_h128")  # same files, same sha256
    pod = tmp_path / "pod"
    assert install_jit_module(data, pod) == "batch_prefill_bf16_h128"
    so = pod / "cached_ops" / "batch_prefill_bf16_h128" / "batch_prefill_bf16_h128.so"
    assert so.read_bytes() == b"\x7fELF fake module"
    assert so.stat().st_mtime_ns == MTIME_NS  # exact: ninja rebuilds on any difference
    assert (pod / "generated" / "batch_prefill_bf16_h128" / "prefill.cu").is_file()
    assert not (pod / "cached_ops" / "batch_prefill_bf16_h128" / "batch_prefill_bf16_h128.lock").exists()
    assert [p.name for p in pod.iterdir() if p.name.startswith(".")] == []  # no staging left behind


def test_reinstall_replaces_the_module_whole(tmp_path):
    node = fake_workspace(tmp_path / "node")
    pod = tmp_path / "pod"
    install_jit_module(module_tarball(node, "batch_prefill_bf16_h128"), pod)
    (pod / "cached_ops" / "batch_prefill_bf16_h128" / "stale.o").write_bytes(b"old")
    install_jit_module(module_tarball(node, "batch_prefill_bf16_h128"), pod)
    assert not (pod / "cached_ops" / "batch_prefill_bf16_h128" / "stale.o").exists()


@pytest.mark.parametrize(
    "members, message",
    [
        ([("cached_ops/../../escape", "file")], "unsafe path"),
        ([("/abs/file", "file")], "unsafe path"),
        ([("elsewhere/m/file", "file")], "unexpected top-level"),
        ([("cached_ops/m/link", "link")], "link or special"),
        ([("cached_ops/a/x", "file"), ("cached_ops/b/y", "file")], "exactly one module"),
        ([("cached_ops/m/m.so", "mtime_ns=soon")], "not a whole number"),
        ([("cached_ops/m/m.so", "mtime_ns=-1")], "not a whole number"),
        ([("cached_ops/m/m.so", "mtime_ns=1e30")], "not a whole number"),
        ([("cached_ops/m/m.so", f"mtime_ns={2**63}")], "not a whole number"),
        ([("cached_ops/m/m.so", "mtime_ns=" + "9" * 20)], "not a whole number"),
        ([("cached_ops/m/m.so", "mtime_ns=1" + "0" * 19)], "not a whole number"),
    ],
)
def test_hostile_tarballs_are_refused_and_nothing_is_written(tmp_path, members, message):
    with pytest.raises(BadJitArtifact, match=message):
        install_jit_module(tarball(members), tmp_path / "pod")
    assert not (tmp_path / "pod").exists() or list((tmp_path / "pod").rglob("*")) == []
