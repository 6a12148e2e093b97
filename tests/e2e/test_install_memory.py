"""A pull's memory does not grow with the warm state (the one-pass install,
``tunecache.client.unpack`` and ``tunecache.client.artifact_file``): a signed run whose Triton
cache is 96 MB of incompressible kernels installs with the peak RSS of a pull of a few kB, fresh
and again over the installed tree. Before, the artifact was held whole in memory (twice while a
tarball was scanned), so the pull's peak grew by at least the artifact's size."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import subprocess
import sys
import tarfile

from tunecache.contract import ArtifactKind

from tests.support.builders import h200_key, run_payload, signed
from tests.support.cli import tunecache_executable
from tests.support.paths import CUDNN_FILE
from tests.support.serve import as_admin

SERVER_DATABASE_INCIDENTAL = True
KERNELS, KERNEL_BYTES = 4, 24 << 20
#: The most a pull's peak RSS may grow over a pull of a few kB, whatever the warm state's size.
GROWTH_BOUND = 32 << 20


def _triton_cache() -> bytes:
    raw = io.BytesIO()
    with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=1, mtime=0) as gz, tarfile.open(fileobj=gz, mode="w|") as tar:
        for i in range(KERNELS):
            member = tarfile.TarInfo(f"{i:064x}/kernel.cubin")
            member.size = KERNEL_BYTES
            tar.addfile(member, io.BytesIO(os.urandom(KERNEL_BYTES)))
    return raw.getvalue()


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
    blob = _triton_cache()
    assert len(blob) > 3 * GROWTH_BOUND
    sha = hashlib.sha256(blob).hexdigest()
    payload = run_payload(CUDNN_FILE, h200_key())
    for data in (CUDNN_FILE.read_bytes(), blob):
        assert as_admin.put(f"{server}/v1/artifacts/{hashlib.sha256(data).hexdigest()}", content=data,
                            timeout=120).status_code in (200, 201)
    facts = ArtifactKind.TRITON_CACHE.facts
    payload["artifacts"].append({"kind": "triton_cache", "name": facts.artifact_name, "media_type": facts.media_type,
                                 "sha256": sha})
    assert as_admin.post(f"{server}/v1/tunings", json=signed(payload, node_signing_key)).status_code == 201
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
