"""A pull's memory does not grow with the warm state (the one-pass install,
``tunecache.client.unpack`` and ``tunecache.client.artifact_file``): a signed run whose Triton
cache is 96 MB of incompressible kernels installs with the peak RSS of a pull of a few kB, fresh
and again over the installed tree. Before, the artifact was held whole in memory (twice while a
tarball was scanned), so the pull's peak grew by at least the artifact's size."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support.cli import tunecache_executable
from tests.support.paths import CUDNN_FILE
from tests.support.warm_runs import record_triton_run, triton_cache

SERVER_DATABASE_INCIDENTAL = True
KERNELS, KERNEL_BYTES = 4, 24 << 20
#: The most a pull's peak RSS may grow over a pull of a few kB, whatever the warm state's size.
GROWTH_BOUND = 32 << 20


def _peak_rss(server: str, dest, *args: str) -> int:
    """Bytes of the peak RSS of one ``tunecache pull`` (its own process, measured by its parent)."""
    measure = ("import resource, subprocess, sys; code = subprocess.run(sys.argv[1:]).returncode; "
               "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(code)")
    done = subprocess.run([sys.executable, "-c", measure, tunecache_executable(), "pull", "--server", server,
                           "--model", "meta-llama/Llama-3.1-8B", "--max-num-batched-tokens", "8192",
                           "--environment", str(CUDNN_FILE), "--dest", str(dest), *args],
                          capture_output=True, text=True, env={**os.environ, "TUNECACHE_REPORT": "0"}, check=False)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip().splitlines()[-1]) * 1024


def test_a_warm_state_larger_than_the_bound_installs_in_bounded_memory(server, tmp_path, node_signing_key):
    blob = triton_cache(KERNELS, KERNEL_BYTES)
    assert len(blob) > 3 * GROWTH_BOUND
    record_triton_run(server, node_signing_key, blob)
    del blob

    small = _peak_rss(server, tmp_path / "tactics")  # the tactics alone: a few kB
    triton = tmp_path / "triton"
    warm = ["--warm-state", "--vllm-cache-root", str(tmp_path / "vllm"), "--triton-cache-dir", str(triton)]
    fresh = _peak_rss(server, tmp_path / "fresh", *warm)
    assert sorted(p.name for p in triton.iterdir()) == [f"{i:064x}" for i in range(KERNELS)]
    assert (triton / f"{0:064x}" / "kernel.cubin").stat().st_size == KERNEL_BYTES
    again = _peak_rss(server, tmp_path / "again", *warm)  # over the installed tree
    for peak in (fresh, again):
        assert peak - small < GROWTH_BOUND, (small, fresh, again)
