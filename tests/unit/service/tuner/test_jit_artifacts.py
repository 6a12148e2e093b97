"""JIT module tarballs: harvested deterministically, installed atomically, hostile ones refused."""

from __future__ import annotations

import io
import os
import tarfile

import pytest

from tunecache.client.jit_install import MTIME_NS_HEADER, BadJitArtifact, install_jit_module
from tunecache.service.tuner.jit_artifacts import module_tarball


def fake_workspace(root, module="batch_prefill_bf16_h128"):
    """A FlashInfer workspace laid out as flashinfer/jit/core.py writes it (files made up here)."""
    ops = root / "cached_ops" / module
    ops.mkdir(parents=True)
    (ops / f"{module}.so").write_bytes(b"\x7fELF fake module")
    (ops / "build.ninja").write_text("rule nvcc\n")
    (ops / ".ninja_log").write_text("# ninja log v6\n")
    (ops / "prefill.cuda.o").write_bytes(b"object")
    (ops / f"{module}.lock").write_text("")
    gen = root / "generated" / module
    gen.mkdir(parents=True)
    (gen / "prefill.cu").write_text("// generated source\n")
    for path in [*ops.iterdir(), *gen.iterdir()]:
        os.utime(path, ns=(MTIME_NS, MTIME_NS))
    return root


#: A time a float cannot hold to the nanosecond (ninja compares nanoseconds).
MTIME_NS = 1_700_000_000_123_456_789


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


def tarball(members):
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for name, kind in members:
            info = tarfile.TarInfo(name)
            if kind == "link":
                info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
                tar.addfile(info)
            elif kind.startswith("mtime_ns="):  # a file whose exact-time header is what follows
                info.size, info.pax_headers = 1, {MTIME_NS_HEADER: kind.removeprefix("mtime_ns=")}
                tar.addfile(info, io.BytesIO(b"x"))
            else:
                info.size = 1
                tar.addfile(info, io.BytesIO(b"x"))
    return raw.getvalue()


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
    ],
)
def test_hostile_tarballs_are_refused_and_nothing_is_written(tmp_path, members, message):
    with pytest.raises(BadJitArtifact, match=message):
        install_jit_module(tarball(members), tmp_path / "pod")
    assert not (tmp_path / "pod").exists() or list((tmp_path / "pod").rglob("*")) == []
