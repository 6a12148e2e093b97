"""Artifacts read while they arrive (:mod:`tunecache.client.arriving`): a reader gets bytes
before the download ends and its end only once the artifact checked; a download that fails,
starts over or is cancelled stops its readers; an install staged from arriving artifacts
renames nothing in before every one checked, and stages again when a download started over.

The downloads here are functions writing a real file through :meth:`Growing.writer`, as
:meth:`~tunecache.store.http.artifacts.ArtifactsClient.download_artifact_to` does (its
``seek(0)``, ``truncate()`` before each attempt, then the parts); the HTTP side is exercised by
the e2e tests against a real server (tests/e2e/test_install_memory.py, test_node_cache.py,
test_pod_failures.py)."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from tunecache.client.arriving import (
    DownloadCancelled,
    DownloadRestarted,
    Growing,
    start_downloads,
)
from tunecache.client.artifact_file import held, spool_file
from tunecache.client.install import install
from tunecache.client.layouts import DeepGemmCache
from tunecache.client.pipeline import InstallTarget
from tunecache.contract import ArtifactKind
from tunecache.store import ArtifactCorrupt

from tests.support.jit import deep_gemm_tarball

TIMEOUT_S = 10


def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def a_reader_waits(growing: Growing) -> bool:
    """A reader waits for bytes not written yet (it read all those before)."""
    return growing._wanted > growing.written


def download(parts, growing: Growing, sha256: str, restart_after: int | None = None, corrupt: bool = False):
    """A download of ``parts`` into a spool file, as the HTTP client writes one: each part told
    to the readers; the next part only once a reader waits for it (so the reader provably read
    the ones before); ``restart_after``: that many parts, then the attempt starts over."""
    with spool_file() as f:
        out = growing.writer(f)
        out.seek(0)
        out.truncate()
        for i, part in enumerate(parts):
            if i == restart_after:
                out.seek(0)
                out.truncate()  # a transient error midway: the whole body again
                time.sleep(0.2)  # the reader stopped meanwhile: the new attempt goes on regardless
                for again in parts:
                    out.write(again)
                break
            out.write(part)
            if i + 1 < len(parts):
                wait_until(lambda: a_reader_waits(growing), "a reader to wait for the next part")
        if corrupt:
            raise ArtifactCorrupt(f"artifact {sha256} arrived hashing to something else")
        return held(f, sha256, f.tell())


def started(parts, **how):
    data = b"".join(parts)
    sha = hashlib.sha256(data).hexdigest()
    downloads = start_downloads(None, [sha], lambda _client, s, growing: download(parts, growing, s, **how), workers=1)
    return downloads, downloads.artifacts[0], data


def test_a_reader_gets_the_first_bytes_before_the_download_ends_and_its_end_after_it_checked():
    parts = [b"a" * 300_000, b"b" * 300_000, b"c" * 1000]  # parts past WAKE_BYTES: each wakes the reader
    downloads, artifact, data = started(parts)
    with artifact.open() as reader:
        first = reader.read(len(parts[0]))  # the download waits for this read before writing on
        assert first == parts[0]
        assert reader.read() == data[len(first):]
    assert downloads.settle()[0].read_bytes() == data


def test_a_failed_download_fails_its_reader_with_its_error_and_the_reader_never_sees_an_end():
    downloads, artifact, _ = started([b"x" * 300_000, b"y" * 10], corrupt=True)
    with artifact.open() as reader, pytest.raises(ArtifactCorrupt, match="hashing to something else"):
        while reader.read(65536):
            pass
    with pytest.raises(ArtifactCorrupt):
        downloads.settle()


def test_a_download_that_starts_over_stops_a_reader_past_its_first_bytes():
    downloads, artifact, data = started([b"1" * 300_000, b"2" * 300_000, b"3" * 10], restart_after=1)
    with artifact.open() as reader, pytest.raises(DownloadRestarted):
        assert reader.read(300_000) == b"1" * 300_000
        reader.read()
    assert downloads.settle()[0].read_bytes() == data  # the finished file is whole
    with artifact.open() as again:  # a reader opened now reads it from the verified file
        assert again.read() == data


def test_a_cancelled_download_stops_writing_and_its_readers():
    growing = Growing()
    with spool_file() as f:
        out = growing.writer(f)
        out.write(b"part")
        growing.cancel()
        with pytest.raises(DownloadCancelled):
            out.write(b"more")
    with pytest.raises(DownloadCancelled):
        growing.wait_for(4, growing.attempt, 1)


def fetched_deep_gemm(downloads, artifact):
    run = SimpleNamespace(id=7, entries=0, summary={}, artifact=lambda kind: SimpleNamespace(sha256="0" * 64))
    return SimpleNamespace(run=run, signed_by=None, drift={}, deep_gemm=artifact, jit_modules=(), warm_state={},
                           downloads=downloads, autotune=b"{}", settled=lambda: SimpleNamespace(
                               run=run, signed_by=None, drift={}, deep_gemm=downloads.settle()[0], jit_modules=(),
                               warm_state={}, downloads=None, autotune=b"{}"))


KERNELS = {f"kernel.k{i}.{i}": os.urandom(50_000) for i in range(40)}  # incompressible: each third of the tarball wakes a reader


def tarball_parts() -> list[bytes]:
    data = deep_gemm_tarball([(f"cache/{name}/kernel.cubin", body) for name, body in KERNELS.items()])
    third = len(data) // 3
    return [data[:third], data[third:2 * third], data[2 * third:]]


def test_an_install_from_an_arriving_artifact_that_fails_its_check_renames_nothing_in(tmp_path: Path):
    """The tarball arrives whole and unpacks; its hash then does not check: nothing reaches the
    DeepGEMM cache, no staging directory is left."""
    parts = tarball_parts()
    downloads, artifact, _ = started(parts, corrupt=True)
    cache = tmp_path / "dg"
    with pytest.raises(ArtifactCorrupt):
        install(fetched_deep_gemm(downloads, artifact), InstallTarget.of((ArtifactKind.DEEP_GEMM_JIT_CACHE,), at={
            ArtifactKind.DEEP_GEMM_JIT_CACHE: DeepGemmCache(cache)}))
    assert not (cache / "cache").exists() or list((cache / "cache").iterdir()) == []


def test_an_install_whose_download_started_over_stages_again_from_the_verified_file(tmp_path: Path):
    parts = tarball_parts()
    downloads, artifact, _ = started(parts, restart_after=1)
    cache = tmp_path / "dg"
    result = install(fetched_deep_gemm(downloads, artifact), InstallTarget.of((ArtifactKind.DEEP_GEMM_JIT_CACHE,), at={
        ArtifactKind.DEEP_GEMM_JIT_CACHE: DeepGemmCache(cache)}))
    assert result.warm_state == ("DeepGEMM cache (40 kernels)",)
    assert sorted(p.name for p in (cache / "cache").iterdir()) == sorted(KERNELS)
    assert all((cache / "cache" / name / "kernel.cubin").read_bytes() == body for name, body in KERNELS.items())


def test_readers_of_one_artifact_read_side_by_side():
    parts = [b"p" * 300_000, b"q" * 300_000]
    downloads, artifact, data = started(parts)
    got = []
    threads = [threading.Thread(target=lambda: got.append(artifact.open().read())) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT_S)
    assert got == [data, data]
    downloads.settle()


class _Client:
    """What start_downloads asks of a client for downloads side by side: a sibling per download."""

    def download_sibling(self) -> _Client:
        return self

    def close(self) -> None:
        pass


def test_a_hostile_tarball_arriving_beside_another_stops_the_install_and_the_other_download(tmp_path: Path):
    """Destinations stage side by side while their artifacts arrive: the DeepGEMM tarball holds a
    ``..`` entry and is refused as it unpacks; the Triton cache's download, still under way, is
    stopped; nothing is written anywhere."""

    hostile = deep_gemm_tarball([("cache/kernel.a.1/kernel.cubin", b"k"), ("../escape", b"x")])
    triton = [os.urandom(300_000), os.urandom(300_000)]
    shas = [hashlib.sha256(hostile).hexdigest(), hashlib.sha256(b"".join(triton)).hexdigest()]
    cancelled = threading.Event()

    def fetch(_client, sha, growing):
        if sha == shas[0]:
            return download([hostile], growing, sha)
        with spool_file() as f:
            out = growing.writer(f)
            out.write(triton[0])
            try:
                while True:  # a download that would go on until the install no longer needs it
                    time.sleep(0.01)
                    out.write(b"")
            except DownloadCancelled:
                cancelled.set()
                raise

    downloads = start_downloads(_Client(), shas, fetch, workers=2)
    run = SimpleNamespace(id=7, entries=0, summary={}, artifact=lambda kind: SimpleNamespace(sha256="0" * 64))
    fetched = SimpleNamespace(run=run, signed_by=None, drift={}, deep_gemm=downloads.artifacts[0], jit_modules=(),
                              warm_state={ArtifactKind.TRITON_CACHE: downloads.artifacts[1]}, downloads=downloads)
    target = InstallTarget.of((ArtifactKind.DEEP_GEMM_JIT_CACHE, ArtifactKind.TRITON_CACHE), at={
        ArtifactKind.DEEP_GEMM_JIT_CACHE: DeepGemmCache(tmp_path / "dg"), ArtifactKind.TRITON_CACHE: tmp_path / "triton"})
    with pytest.raises(ValueError, match="unsafe entry"):
        install(fetched, target)
    assert cancelled.wait(TIMEOUT_S)
    assert not (tmp_path / "escape").exists()
    left = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert left == [], left
