"""A boot's attestation: counts from the files the boot wrote and from vLLM's own counter."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

from tunecache.client.attestation import count_files, count_vllm, written_since
from tunecache.contract import compiled_summary as shown
from tunecache.contract import CompiledKind


def _touch(path, mtime_ns=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x")
    if mtime_ns is not None:
        os.utime(path, ns=(mtime_ns, mtime_ns))
    return path


def test_only_what_the_boot_wrote_counts(tmp_path):
    started = time.time_ns()
    # a file's time comes from the kernel's coarse clock, which can lag time.time_ns() by a
    # tick: a file written at once could carry a time before `started` (this test failed so, once)
    time.sleep(0.05)
    before = started - 10**9  # installed from a run: the node's file times, before the boot
    _touch(tmp_path / "ws" / "cached_ops" / "sampling" / "sampling.so")
    _touch(tmp_path / "ws" / "cached_ops" / "prefill" / "prefill.so", before)
    _touch(tmp_path / "triton" / "A" / "k.cubin")
    _touch(tmp_path / "vc" / "torch_compile_cache" / "torch_aot_compile" / "h" / "inductor_cache" / "triton" / "0" / "B" / "k.cubin")
    _touch(tmp_path / "triton" / "C" / "old.cubin", before)
    (tmp_path / "dg" / "cache" / "kernel.fp8_gemm.abc").mkdir(parents=True)
    _touch(tmp_path / "vc" / "modelinfos" / "vllm-model_executor-models-llama-LlamaForCausalLM.json")
    counts = count_files(started, workspace=tmp_path / "ws", deep_gemm_dir=tmp_path / "dg", vllm_cache_root=tmp_path / "vc",
                         triton_dirs=[tmp_path / "triton", tmp_path / "vc" / "torch_compile_cache", tmp_path / "triton", None])
    assert counts == {CompiledKind.FLASHINFER_JIT_MODULES: 1, CompiledKind.TRITON_KERNELS: 2,
                      CompiledKind.DEEP_GEMM_KERNELS: 1, CompiledKind.MODEL_INSPECTIONS: 1}
    assert written_since([tmp_path / "missing", None], "*", started) == 0


def test_vllms_counter_and_the_line():
    # a warm boot as vLLM 0.25 counts it on the H200: one Dynamo trace, 30 identical layers
    # through num_inductor_compiles that reused a loaded graph, nothing saved: nothing compiled
    warm = SimpleNamespace(num_graphs_seen=1, num_inductor_compiles=30, num_compiled_artifacts_saved=0,
                           num_aot_compiles=0, num_compiled_artifacts_loaded=2)
    assert shown(count_vllm(warm)) == "nothing"
    counter = SimpleNamespace(num_graphs_seen=3, num_inductor_compiles=31, num_compiled_artifacts_saved=2, num_aot_compiles=1,
                              num_compiled_artifacts_loaded=0)
    counts = count_vllm(counter)
    assert counts == {CompiledKind.INDUCTOR_GRAPHS: 2, CompiledKind.AOT_COMPILES: 1}
    assert shown(counts) == "2 inductor_graphs, 1 aot_compiles"
    assert shown({kind: 0 for kind in CompiledKind}) == "nothing"


def _counts_in_a_new_process(before: str) -> dict:
    """``in_process_counts()`` in a fresh interpreter after ``before`` ran, and whether FlashInfer
    was imported by the end."""
    import json
    import subprocess
    import sys

    code = (f"{before}\nimport json, sys\nfrom tunecache.client.attestation import in_process_counts\n"
            "counts = in_process_counts()\n"
            "print(json.dumps({'counts': counts, 'flashinfer': 'flashinfer' in sys.modules}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_a_worker_that_never_loaded_flashinfer_counts_no_autotuned_ops_without_importing_it():
    """The attestation runs as the worker returns to vLLM: importing FlashInfer there (torch,
    torch._inductor) would delay every boot that never used it by seconds."""
    seen = _counts_in_a_new_process("")
    assert seen["counts"].get(CompiledKind.AUTOTUNE_OPS.value) == 0
    assert seen["flashinfer"] is False


def test_the_ops_flashinfers_own_autotuner_profiled_are_counted():
    seen = _counts_in_a_new_process(
        "from flashinfer.autotuner import AutoTuner\n"
        "AutoTuner.get().stats.tuned_op_total_configs = {'fused_moe': 12, 'gemm_fp8': 4}")
    assert seen["counts"][CompiledKind.AUTOTUNE_OPS.value] == 2
