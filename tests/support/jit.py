"""FlashInfer JIT workspaces and tarballs made up for the tests (as flashinfer/jit/core.py
lays them out, as the tuner harvests them)."""

from __future__ import annotations

import io
import os
import tarfile

from tunecache.formats.jit_module import MTIME_NS_HEADER


#: A time a float cannot hold to the nanosecond (ninja compares nanoseconds).
MTIME_NS = 1_700_000_000_123_456_789


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


def deep_gemm_tarball(members):
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for name, payload in members:
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return raw.getvalue()
