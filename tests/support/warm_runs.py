"""A signed run whose warm state is a Triton cache of random kernels, recorded through a real
server's API: what the tests of big warm states pull (``tunecache pull --warm-state``)."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import tarfile

from tunecache.contract import ArtifactKind

from tests.support.builders import h200_key, run_payload, signed
from tests.support.paths import CUDNN_FILE
from tests.support.serve import as_admin


def triton_cache(kernels: int, kernel_bytes: int) -> bytes:
    """A gzip'd Triton cache of ``kernels`` directories, each one ``kernel.cubin`` of
    ``kernel_bytes`` random bytes (as incompressible as a built kernel)."""
    raw = io.BytesIO()
    with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=1, mtime=0) as gz, tarfile.open(fileobj=gz, mode="w|") as tar:
        for i in range(kernels):
            member = tarfile.TarInfo(f"{i:064x}/kernel.cubin")
            member.size = kernel_bytes
            tar.addfile(member, io.BytesIO(os.urandom(kernel_bytes)))
    return raw.getvalue()


def record_triton_run(server: str, signing_key, blob: bytes) -> str:
    """Upload the H200 tactics and ``blob`` (a Triton cache) to ``server`` and record a run of
    both signed by ``signing_key`` (the pods' trusted key); returns the blob's sha256."""
    sha = hashlib.sha256(blob).hexdigest()
    payload = run_payload(CUDNN_FILE, h200_key())
    for data in (CUDNN_FILE.read_bytes(), blob):
        assert as_admin.put(f"{server}/v1/artifacts/{hashlib.sha256(data).hexdigest()}", content=data,
                            timeout=120).status_code in (200, 201)
    facts = ArtifactKind.TRITON_CACHE.facts
    payload["artifacts"].append({"kind": "triton_cache", "name": facts.artifact_name, "media_type": facts.media_type,
                                 "sha256": sha})
    assert as_admin.post(f"{server}/v1/tunings", json=signed(payload, signing_key)).status_code == 201
    return sha
