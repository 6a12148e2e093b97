"""Every tarball a pod unpacks is bounded in bytes and entries before anything is written
(issue 21: a 2 MB gzip declaring a 2 GiB file, 100,000 small files), and so are the
server's answers as they expand."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
import time

import httpx
import pytest

from tests.support.builders import h200_key
from tests.support.jit import deep_gemm_tarball, fake_workspace
from tunecache.store.http import AnswerTooLarge, TunecacheClient
from tunecache.client.jit_install import install_jit_module
from tunecache.client.layouts import install_deep_gemm_cache, install_v2_store
from tunecache.client.warm_state import BadWarmStateArtifact, merge_entries
from tunecache.formats.jit_module import BadJitArtifact, module_tarball
from tunecache.formats.tarball import DEFAULT_MAX_UNPACK_BYTES, DEFAULT_MAX_UNPACK_FILES, open_bounded
from tests.support.paths import CUDNN_FILE
from tests.support.builders import file_environment
from tests.support.torch_tests import IMPORTS_TORCH


def _files(count: int, size: int = 1, prefix: str = "cache/kernel.a/") -> bytes:
    """A gzip'd tar of ``count`` files of ``size`` zero bytes each (zeros: a few kB of gzip)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for n in range(count):
            info = tarfile.TarInfo(f"{prefix}f{n}")
            info.size = size
            tar.addfile(info, io.BytesIO(bytes(size)))
    return raw.getvalue()


def _declared(size: int) -> bytes:
    """A gzip'd tar whose one file declares ``size`` bytes and holds none of them: what a
    reader that honours the header finds first (the data would follow)."""
    info = tarfile.TarInfo("cache/kernel.a/huge")
    info.size = size
    return gzip.compress(info.tobuf(format=tarfile.PAX_FORMAT))


def test_the_defaults_hold_what_a_warm_state_holds():
    assert DEFAULT_MAX_UNPACK_BYTES == 1 << 30 and DEFAULT_MAX_UNPACK_FILES == 20_000
    with open_bounded(_files(150, 1024), "compile cache", ValueError) as tar:
        assert len(tar.getmembers()) == 150


def test_a_declared_2_gib_file_is_refused_at_its_header(monkeypatch):
    started = time.monotonic()
    with pytest.raises(ValueError, match=r"more than 1,073,741,824 bytes \(TUNECACHE_MAX_UNPACK_BYTES\)"):
        open_bounded(_declared(2 << 30), "DeepGEMM cache", ValueError)
    assert time.monotonic() - started < 5  # nothing of the 2 GiB was read


def test_bytes_and_entries_follow_their_settings(monkeypatch):
    monkeypatch.setenv("TUNECACHE_MAX_UNPACK_BYTES", str(1 << 20))
    bomb = _files(1, 8 << 20)  # 8 MiB of zeros: about 8 kB of gzip
    assert len(bomb) < 64 << 10
    with pytest.raises(BadWarmStateArtifact, match="Triton cache artifact unpacks to more than 1,048,576 bytes"):
        open_bounded(bomb, "Triton cache", BadWarmStateArtifact)
    monkeypatch.setenv("TUNECACHE_MAX_UNPACK_FILES", "100")
    with open_bounded(_files(100), "x", ValueError) as tar:
        assert len(tar.getmembers()) == 100
    with pytest.raises(ValueError, match=r"more than 100 entries \(TUNECACHE_MAX_UNPACK_FILES\)"):
        open_bounded(_files(101), "x", ValueError)
    monkeypatch.setenv("TUNECACHE_MAX_UNPACK_FILES", "not a number")  # ignored: the default holds
    with open_bounded(_files(101), "x", ValueError) as tar:
        assert len(tar.getmembers()) == 101
    with pytest.raises(ValueError, match="x artifact is not a gzipped tarball"):
        open_bounded(b"\x1f\x8b not really", "x", ValueError)


def test_every_install_refuses_past_the_bounds_and_writes_nothing(monkeypatch, tmp_path):
    monkeypatch.setenv("TUNECACHE_MAX_UNPACK_FILES", "10")
    many = _files(11)
    with pytest.raises(ValueError, match="DeepGEMM cache artifact holds more than 10 entries"):
        install_deep_gemm_cache(many, tmp_path / "dg")
    assert not (tmp_path / "dg").exists()
    with pytest.raises(BadWarmStateArtifact, match="compile cache artifact holds more than 10 entries"):
        merge_entries(many, "compile cache", tmp_path / "vc", lambda staged: {})
    assert not (tmp_path / "vc").exists()
    module = module_tarball(fake_workspace(tmp_path / "ws"), "batch_prefill_bf16_h128")
    monkeypatch.setenv("TUNECACHE_MAX_UNPACK_FILES", "3")  # the module holds more entries than that
    with pytest.raises(BadJitArtifact, match="JIT artifact holds more than 3 entries"):
        install_jit_module(module, tmp_path / "pod-ws")
    assert not (tmp_path / "pod-ws").exists()
    monkeypatch.delenv("TUNECACHE_MAX_UNPACK_FILES")
    assert install_jit_module(module, tmp_path / "pod-ws") == "batch_prefill_bf16_h128"
    assert install_deep_gemm_cache(deep_gemm_tarball([("cache/kernel.a/kernel.cubin", b"k")]), tmp_path / "dg") == ["kernel.a"]


@IMPORTS_TORCH
def test_the_v2_store_is_bounded_by_its_entries(monkeypatch, tmp_path):
    pytest.importorskip("flashinfer.autotune_cache", reason="flashinfer-python is not installed")
    doc = json.loads(CUDNN_FILE.read_text())
    entries = sum(1 for key in doc if not key.startswith("_"))
    monkeypatch.setenv("TUNECACHE_MAX_UNPACK_FILES", str(entries - 1))
    with pytest.raises(ValueError, match=f"autotune file of {entries} entries: the v2 store would take more than"):
        install_v2_store(CUDNN_FILE.read_bytes(), tmp_path / "root")
    assert not (tmp_path / "root").exists()
    monkeypatch.setenv("TUNECACHE_MAX_UNPACK_FILES", str(entries))
    assert install_v2_store(CUDNN_FILE.read_bytes(), tmp_path / "root").is_dir()


def test_a_lookup_answer_that_expands_past_its_bound_is_refused(monkeypatch):
    """A server's answer of a few kB of gzip that expands to 20 MiB: read as it expands,
    refused at TUNECACHE_MAX_ANSWER_BYTES (16 MiB), never held whole."""
    bomb = gzip.compress(b'{"id": 1, "padding": "' + b" " * (20 << 20) + b'"}')
    assert len(bomb) < 1 << 20
    served = []

    def answer(request: httpx.Request) -> httpx.Response:
        served.append(request.url.path)
        return httpx.Response(200, content=bomb, headers={"content-encoding": "gzip", "content-type": "application/json"})

    with TunecacheClient("http://tunecache.test", transport=httpx.MockTransport(answer), attempts=3) as client:
        with pytest.raises(AnswerTooLarge, match=r"sent more than 16,777,216 bytes for POST /v1/tunings/lookup "
                                                 r"\(TUNECACHE_MAX_ANSWER_BYTES\)"):
            client.lookup(h200_key(), file_environment(CUDNN_FILE))
    assert served == ["/v1/tunings/lookup"]  # not retried: the same server would send the same
    monkeypatch.setenv("TUNECACHE_MAX_ANSWER_BYTES", str(32 << 20))
    with TunecacheClient("http://tunecache.test", transport=httpx.MockTransport(answer), attempts=1) as client:
        with pytest.raises(Exception) as raised:  # read whole now, and then not a run
            client.lookup(h200_key(), file_environment(CUDNN_FILE))
    assert not isinstance(raised.value, AnswerTooLarge)


def _pax_header(size: int) -> bytes:
    """A gzip'd tar whose one file carries a pax header of about ``size`` bytes (one
    ``comment`` record of repeated letters: a few kB of gzip)."""
    value = "a" * size
    record = f" comment={value}\n"
    length = len(record) + len(str(len(record)))
    length += len(str(length)) - len(str(len(record)))
    header = f"{length}{record}".encode()
    raw = io.BytesIO()
    with gzip.GzipFile(fileobj=raw, mode="wb") as gz:
        info = tarfile.TarInfo("././@PaxHeader")
        info.type, info.size = tarfile.XHDTYPE, len(header)
        gz.write(info.tobuf(format=tarfile.USTAR_FORMAT))
        gz.write(header + bytes(-len(header) % 512))
        member = tarfile.TarInfo("cached_ops/m/m.so")
        member.size = 1
        gz.write(member.tobuf(format=tarfile.USTAR_FORMAT) + b"x" + bytes(511) + bytes(1024))
    return raw.getvalue()


def test_an_extended_header_is_bounded_before_tarfile_reads_it():
    """A 2.3 MB tarball with a huge pax header took 1.7 GiB before any bound tripped: tarfile
    reads an extended header whole before it returns the entry. Refused at its header now."""
    small = _pax_header(1000)
    with open_bounded(small, "JIT", BadJitArtifact) as tar:  # an ordinary pax header still reads
        assert tar.getnames() == ["cached_ops/m/m.so"] and tar.getmembers()[0].pax_headers["comment"] == "a" * 1000
    huge = _pax_header(64 << 20)
    assert len(huge) < 200_000
    with pytest.raises(BadJitArtifact, match=r"^JIT artifact holds an extended header of 67,1\d\d,\d\d\d bytes "
                                             r"\(at most 1,048,576\)$"):
        open_bounded(huge, "JIT", BadJitArtifact)
