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
from tunecache.client.layouts import install_deep_gemm_cache, install_vllm_rank_files
from tunecache.engines.vllm.paths import vllm_rank_file_name
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


READERS = 2
SECONDS = 4.0


def _reinstaller(stop, jits: list[bytes], ranks: list[bytes], root, failures) -> None:
    """Installs two runs in turn (other rank files, another build of the module) until ``stop``."""
    turn = 0
    while not stop.is_set():
        try:
            install_jit_module(jits[turn % 2], root / "workspace")
            install_vllm_rank_files(ranks[turn % 2], root / "vllm", CONFIG_HASH,
                                    [vllm_rank_file_name(0, 0), vllm_rank_file_name(0, 1)])
        except Exception:
            failures.put(traceback.format_exc())
        turn += 1


def _reader(stop, root, seen) -> None:
    """What a booting engine sees meanwhile: each rank's file, and the module's ``.so``."""
    missing_rank = missing_so = reads = 0
    rank_dir = root / "vllm" / CONFIG_HASH
    so = root / "workspace" / "cached_ops" / "batch_prefill_bf16_h128" / "batch_prefill_bf16_h128.so"
    while not stop.is_set():
        for name in (vllm_rank_file_name(0, 0), vllm_rank_file_name(0, 1)):
            try:
                (rank_dir / name).read_bytes()
            except FileNotFoundError:
                missing_rank += 1
        try:
            so.read_bytes()
        except FileNotFoundError:
            missing_so += 1
        reads += 1
    seen.put((missing_rank, missing_so, reads))


def test_a_reader_never_finds_a_rank_file_or_a_module_missing_while_another_run_is_installed(tmp_path):
    """A re-install swaps each directory in one step (renameat2's RENAME_EXCHANGE): before, it
    renamed the old one away and the new one in, and readers found rank files and the
    module's .so missing between the two (1,162 and 755 times in a probe of 16 installers)."""
    from tunecache.client.journal import exchange

    probe = tmp_path / "probe"
    (probe / "a").mkdir(parents=True)
    (probe / "b").mkdir()
    if not exchange(probe / "a", probe / "b"):
        import pytest

        pytest.skip("this system cannot swap two directories in one step (renameat2 RENAME_EXCHANGE)")
    builds = []
    for n in range(2):
        node = fake_workspace(tmp_path / f"node-{n}")
        so = node / "cached_ops" / "batch_prefill_bf16_h128" / "batch_prefill_bf16_h128.so"
        so.write_bytes(so.read_bytes() + bytes([n]))
        builds.append(module_tarball(node, "batch_prefill_bf16_h128"))
    ranks = [CUDNN_FILE.read_bytes(), CUDNN_FILE.read_bytes().replace(b"{", b"{ ", 1)]
    install_jit_module(builds[0], tmp_path / "workspace")
    install_vllm_rank_files(ranks[0], tmp_path / "vllm", CONFIG_HASH, [vllm_rank_file_name(0, 0), vllm_rank_file_name(0, 1)])
    context = multiprocessing.get_context("spawn")
    stop, failures, seen = context.Event(), context.Queue(), context.Queue()
    processes = ([context.Process(target=_reinstaller, args=(stop, builds, ranks, tmp_path, failures)) for _ in range(4)]
                 + [context.Process(target=_reader, args=(stop, tmp_path, seen)) for _ in range(READERS)])
    for process in processes:
        process.start()
    import time

    time.sleep(SECONDS)
    stop.set()
    counts = [seen.get(timeout=60) for _ in range(READERS)]
    for process in processes:
        process.join(60)
    errors = []
    while not failures.empty():
        errors.append(failures.get())
    assert not errors, errors[0]
    assert all(reads > 100 for _, _, reads in counts), counts
    assert [(missing_rank, missing_so) for missing_rank, missing_so, _ in counts] == [(0, 0)] * READERS, counts
