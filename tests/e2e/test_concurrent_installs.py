"""The workers of one pod install at the same moment: several processes unpack the same JIT
module into one FlashInfer workspace, the same DeepGEMM cache into one directory, the same
rank files under one root. Every install succeeds, the result is whole, nothing is left
behind (no ``.old-*`` copies, no staging directories)."""

from __future__ import annotations

import io
import multiprocessing
import tarfile
import traceback

from tests.support.paths import CUDNN_FILE
from tests.support.jit import fake_workspace
from tunecache.client.jit_install import install_jit_module
from tunecache.client.layouts import install_deep_gemm_cache, install_vllm_rank_files, vllm_rank_file_name
from tunecache.formats.jit_module import module_tarball

PROCESSES = 8
ROUNDS = 15
CONFIG_HASH = "ab" * 32


def _deep_gemm_tarball() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in (("cache/kernel.a/kernel.cubin", b"cubin-a"), ("cache/kernel.b/kernel.cubin", b"cubin-b")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _installer(barrier, jit: bytes, deep_gemm: bytes, root, failures) -> None:
    for _ in range(ROUNDS):
        barrier.wait()  # every process starts each round together
        try:
            install_jit_module(jit, root / "workspace")
            install_deep_gemm_cache(deep_gemm, root / "deep_gemm" / "run-7")
            install_vllm_rank_files(CUDNN_FILE.read_bytes(), root / "vllm", CONFIG_HASH,
                                    [vllm_rank_file_name(0, 0), vllm_rank_file_name(0, 1)])
        except Exception:
            failures.put(traceback.format_exc())


def test_a_pods_workers_install_the_same_things_at_once(tmp_path):
    node = fake_workspace(tmp_path / "node")
    jit = module_tarball(node, "batch_prefill_bf16_h128")
    context = multiprocessing.get_context("spawn")
    barrier, failures = context.Barrier(PROCESSES), context.Queue()
    workers = [context.Process(target=_installer, args=(barrier, jit, _deep_gemm_tarball(), tmp_path, failures))
               for _ in range(PROCESSES)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
    errors = []
    while not failures.empty():
        errors.append(failures.get())
    assert not errors, f"{len(errors)} of {PROCESSES * ROUNDS} rounds failed:\n{errors[0]}"
    assert all(worker.exitcode == 0 for worker in workers)

    workspace = tmp_path / "workspace"
    assert (workspace / "cached_ops" / "batch_prefill_bf16_h128" / "batch_prefill_bf16_h128.so").read_bytes() \
        == b"\x7fELF fake module"
    assert (tmp_path / "deep_gemm" / "run-7" / "cache" / "kernel.b" / "kernel.cubin").read_bytes() == b"cubin-b"
    assert (tmp_path / "vllm" / CONFIG_HASH / "autotune_configs_dp0_rank1.json").read_bytes() == CUDNN_FILE.read_bytes()
    leftovers = [p for p in tmp_path.rglob(".*") if p.name.startswith((".tunecache-", ".batch_prefill", ".run-7", f".{CONFIG_HASH}"))]
    assert leftovers == []
