"""The warm state's new kinds, from the tuner's harvest to a pod's directories: vLLM's compile
cache (under the names the pod's own factors give), its model-inspection cache and Triton's
cache (group files pointed at the pod's paths); hostile or corrupt tarballs refused with
nothing written; a differing factor named and the compile cache left out."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from tunecache.client.install import install
from tunecache.client.pipeline import InstallTarget
from tunecache.client.warm_state import BadWarmStateArtifact, TritonCache, VllmCacheRoot, read_compile_factors
from tunecache.contract import ArtifactKind
from tunecache.engines.vllm.compile_cache import (
    CompileFactors,
    PodCompileFactors,
    aot_dir_name,
    backbone_dir_name,
    env_hash,
    node_dir_names,
)
from tunecache.service.tuner.vllm_warmup import harvest_warm_state

ENV = {"VLLM_USE_AOT_COMPILE": True}
CONFIG_HASH, CODE_HASH, COMPILER_HASH, MODEL_KEY = "c" * 64, "d" * 64, "e" * 64, "k" * 64
NODE_MODEL = "/node/work/vllm-scratch/model"


def node_scratch(tmp_path: Path) -> tuple[Path, str, str]:
    """A tuner's scratch as vLLM 0.25 leaves it after one compile-and-graphs boot."""
    scratch = tmp_path / "scratch"
    backbone = backbone_dir_name(env_hash(ENV), CONFIG_HASH, CODE_HASH, COMPILER_HASH)
    aot = aot_dir_name(env_hash(ENV), CONFIG_HASH, [], MODEL_KEY)
    compiled = scratch / "vllm-cache" / "torch_compile_cache"
    local = compiled / backbone / "rank_0_0" / "backbone"
    local.mkdir(parents=True)
    (local / "cache_key_factors.json").write_text(json.dumps(
        {"env": ENV, "config_hash": CONFIG_HASH, "code_hash": CODE_HASH, "compiler_hash": COMPILER_HASH}))
    (local / "artifact_compile_range_1_2048_subgraph_0").write_bytes(b"inductor artifact")
    kernel = compiled / "torch_aot_compile" / aot / "inductor_cache" / "triton" / "0" / "HASHA"
    kernel.mkdir(parents=True)
    (kernel / "triton_poi_fused_0.cubin").write_bytes(b"cubin")
    (kernel / "__grp__triton_poi_fused_0.json").write_text(json.dumps(
        {"child_paths": {"triton_poi_fused_0.cubin": f"{kernel}/triton_poi_fused_0.cubin"}}))
    (compiled / "torch_aot_compile" / aot / "rank_0_0").mkdir()
    (compiled / "torch_aot_compile" / aot / "rank_0_0" / "model").write_bytes(b"aot model")
    infos = scratch / "vllm-cache" / "modelinfos"
    infos.mkdir()
    (infos / "vllm-model_executor-models-llama-LlamaForCausalLM.json").write_text('{"hash": "h", "modelinfo": {}}')
    triton = scratch / "triton" / "HASHB"
    triton.mkdir(parents=True)
    (triton / "_fwd_kernel.cubin").write_bytes(b"cubin b")
    (triton / "__grp___fwd_kernel.json").write_text(json.dumps(
        {"child_paths": {"_fwd_kernel.cubin": f"{triton}/_fwd_kernel.cubin"}}))
    (scratch / "compile-facts.json").write_text(json.dumps(
        {"vllm_version": "0.25.0", "config_hashes": {"model_config": "m" * 64}, "model": NODE_MODEL,
         "aot_extra": [], "model_hash_key": MODEL_KEY, "traced_files": []}))
    return scratch, backbone, aot


def harvested(tmp_path: Path):
    scratch, backbone, aot = node_scratch(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    artifacts, summary = harvest_warm_state(scratch, out)
    fetched = SimpleNamespace(warm_state={ArtifactKind(a.kind): (out / a.path).read_bytes() for a in artifacts})
    return artifacts, summary, fetched, backbone, aot


def pod(config_hash: str = "p" * 64, **changes) -> PodCompileFactors:
    fields = dict(vllm_version="0.25.0", env=dict(ENV), config_hash=config_hash, config_hash_as_node=CONFIG_HASH,
                  config_hashes_as_node={"model_config": "m" * 64})
    fields.update(changes)
    return PodCompileFactors(**fields)


def test_the_harvest_stores_each_kind_with_the_factors_signed_inside(tmp_path):
    artifacts, summary, fetched, backbone, aot = harvested(tmp_path)
    assert [(a.kind, a.name) for a in artifacts] == [
        ("vllm_compile_cache", "vllm-compile-cache.tar.gz"), ("vllm_modelinfos", "vllm-modelinfos.tar.gz"),
        ("triton_cache", "triton-cache.tar.gz")]
    factors = read_compile_factors(fetched.warm_state[ArtifactKind.VLLM_COMPILE_CACHE])
    assert (factors.backbone_dir, factors.aot_dir, factors.model, factors.model_hash_key) == (backbone, aot, NODE_MODEL,
                                                                                              MODEL_KEY)
    assert summary["names_checked"] == {"backbone": True, "aot": True}  # the recorded factors give vLLM's own names
    assert node_dir_names(factors) == {"backbone": backbone, "aot": aot}


def test_a_pod_gets_every_kind_under_its_own_names_with_triton_paths_of_its_own(tmp_path):
    _, _, fetched, backbone, aot = harvested(tmp_path)
    root, triton = tmp_path / "pod" / "vllm-cache", tmp_path / "pod" / "triton"
    factors = pod()
    run = SimpleNamespace(id=7, entries=0, artifact=lambda kind: SimpleNamespace(sha256="0" * 64))
    result = install(SimpleNamespace(**vars(fetched), run=run, signed_by=None),
                     InstallTarget.of([ArtifactKind.TRITON_CACHE, ArtifactKind.VLLM_MODELINFOS, ArtifactKind.VLLM_COMPILE_CACHE],
                                      at={ArtifactKind.VLLM_COMPILE_CACHE: VllmCacheRoot(root, factors),
                                          ArtifactKind.TRITON_CACHE: triton}))
    pod_backbone = backbone_dir_name(env_hash(ENV), "p" * 64, CODE_HASH, COMPILER_HASH)
    pod_aot = aot_dir_name(env_hash(ENV), "p" * 64, [], MODEL_KEY)
    assert result.warm_state == ("Triton cache (1 kernels)", "modelinfos (1 files)",
                                 "compile cache (2 of 2 directories; 1 files pointed at this pod's paths)")  # its factors
    assert result.compile_cache_skipped is None
    compiled = root / "torch_compile_cache"
    assert sorted(p.name for p in compiled.iterdir()) == sorted([pod_backbone, "torch_aot_compile"])
    assert (compiled / pod_backbone / "rank_0_0" / "backbone" / "artifact_compile_range_1_2048_subgraph_0").read_bytes() == \
        b"inductor artifact"
    assert (compiled / "torch_aot_compile" / pod_aot / "rank_0_0" / "model").read_bytes() == b"aot model"
    group = compiled / "torch_aot_compile" / pod_aot / "inductor_cache" / "triton" / "0" / "HASHA" / "__grp__triton_poi_fused_0.json"
    assert json.loads(group.read_text())["child_paths"] == {"triton_poi_fused_0.cubin": str(group.parent / "triton_poi_fused_0.cubin")}
    own = json.loads((triton / "HASHB" / "__grp___fwd_kernel.json").read_text())["child_paths"]
    assert own == {"_fwd_kernel.cubin": str(triton / "HASHB" / "_fwd_kernel.cubin")}
    assert (root / "modelinfos" / "vllm-model_executor-models-llama-LlamaForCausalLM.json").is_file()
    assert not [p for p in (root / "torch_compile_cache").iterdir() if p.name.startswith(".")]  # no staging left


def test_a_differing_factor_is_named_and_the_compile_cache_left_out(tmp_path):
    _, _, fetched, _, _ = harvested(tmp_path)
    root = tmp_path / "pod" / "vllm-cache"
    commit = VllmCacheRoot(root, pod(env={"VLLM_USE_AOT_COMPILE": False})).stage(fetched)
    written = commit()
    assert written["compile_cache_skipped"] == ("compile cache not installed, vLLM would not use it: environment "
                                                "VLLM_USE_AOT_COMPILE: node true, pod false")
    assert written["warm_state"] == ("modelinfos (1 files)",)
    assert not (root / "torch_compile_cache").exists()


def test_an_entry_the_pod_has_is_left_as_it_is(tmp_path):
    _, _, fetched, _, _ = harvested(tmp_path)
    triton = tmp_path / "pod" / "triton"
    (triton / "HASHB").mkdir(parents=True)
    (triton / "HASHB" / "mine").write_bytes(b"pod's own")
    assert TritonCache(triton).stage(fetched)()["warm_state"] == ("Triton cache (0 kernels)",)
    assert sorted(p.name for p in (triton / "HASHB").iterdir()) == ["mine"]


def _tarball(name: str, kind: str = "file") -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        member = tarfile.TarInfo(name)
        if kind == "link":
            member.type, member.linkname = tarfile.SYMTYPE, "/etc/passwd"
            tar.addfile(member)
        else:
            member.size = 1
            tar.addfile(member, io.BytesIO(b"x"))
    return raw.getvalue()


@pytest.mark.parametrize("data, message", [
    (_tarball("../escape"), "unsafe entry"),
    (_tarball("/abs"), "unsafe entry"),
    (_tarball("HASH/link", "link"), "unsafe entry"),
    (b"\x1f\x8b partial gzip", "not a gzipped tarball"),
    (_tarball("HASH/k.cubin")[:40], "not a gzipped tarball"),
], ids=["dot-dot", "absolute", "link", "not-gzip", "cut-short"])  # named: the tarballs' bytes hold gzip's time
def test_hostile_or_corrupt_tarballs_are_refused_before_anything_is_written(tmp_path, data, message):
    triton = tmp_path / "pod" / "triton"
    root = tmp_path / "pod" / "vllm-cache"
    for destination in (TritonCache(triton), VllmCacheRoot(root, pod())):
        fetched = SimpleNamespace(warm_state={ArtifactKind.TRITON_CACHE: data, ArtifactKind.VLLM_MODELINFOS: data,
                                              ArtifactKind.VLLM_COMPILE_CACHE: data})
        with pytest.raises(BadWarmStateArtifact, match=message):
            destination.stage(fetched)
    assert not triton.exists() and not root.exists()


def test_factors_that_do_not_parse_are_refused(tmp_path):
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        member = tarfile.TarInfo("tunecache-compile-factors.json")
        member.size = 2
        tar.addfile(member, io.BytesIO(b"{}"))
    with pytest.raises(BadWarmStateArtifact, match="unreadable"):
        read_compile_factors(raw.getvalue())
    assert CompileFactors.model_fields["vllm_version"].is_required()


@pytest.mark.parametrize("field, value", [("backbone_dir", "../../../../tmp/x"), ("aot_dir", "../escape"),
                                          ("backbone_dir", "/etc/cron.d")])
def test_directory_names_in_the_factors_are_vllms_digests_or_refused(tmp_path, field, value):
    """A pod that cannot compute its own names (an init container) installs under the node's
    recorded names: a signed ``backbone_dir`` with ``..`` moved a directory of the pod's."""
    doc = {"vllm_version": "0.25.0", "env": ENV, "config_hash": CONFIG_HASH, "model": NODE_MODEL,
           "backbone_dir": "0123456789", "aot_dir": "a" * 64, field: value}
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        member = tarfile.TarInfo("tunecache-compile-factors.json")
        body = json.dumps(doc).encode()
        member.size = len(body)
        tar.addfile(member, io.BytesIO(body))
    root = tmp_path / "pod" / "vllm-cache"
    with pytest.raises(BadWarmStateArtifact, match=f"unreadable: {field}: String should match pattern"):
        VllmCacheRoot(root).stage(SimpleNamespace(warm_state={ArtifactKind.VLLM_COMPILE_CACHE: raw.getvalue()}))
    assert not root.exists()


def test_a_compile_directory_whose_index_names_a_missing_artifact_is_removed_again(tmp_path):
    """vLLM ends its start on an artifact its index names and that is not there; without the
    directory it compiles. So such a directory is taken out again, and that is said."""
    import pprint

    from tunecache.client.warm_state import relocate_compile_dirs

    compiled = tmp_path / "torch_compile_cache"
    good, bad = compiled / "aaaaaaaaaa" / "rank_0_0" / "backbone", compiled / "bbbbbbbbbb" / "rank_0_0" / "backbone"
    for directory, artifact in ((good, "artifact_a"), (bad, None)):
        directory.mkdir(parents=True)
        if artifact:
            (directory / artifact).write_bytes(b"x")
        (directory / "vllm_compile_cache.py").write_text(pprint.pformat(
            {((1, 8), 0, "inductor_standalone"): {"graph_handle": ("k", f"/node/x/{artifact or 'artifact_b'}"),
                                                   "cache_key": "c"}}))
    said = relocate_compile_dirs(compiled, ["aaaaaaaaaa", "bbbbbbbbbb"])
    assert said.startswith("compile cache directory removed again, vLLM would fail opening what it names: "
                           "bbbbbbbbbb (its index names 1 artifacts it lacks: /node/x/artifact_b)")
    assert (compiled / "aaaaaaaaaa").is_dir() and not (compiled / "bbbbbbbbbb").exists()
    assert str(good / "artifact_a") in (good / "vllm_compile_cache.py").read_text()


def test_without_triton_cache_dir_the_kernels_go_where_inductor_looks_too(tmp_path, monkeypatch):
    """With TRITON_CACHE_DIR unset, Inductor keeps its kernels under its own cache
    (``<TORCHINDUCTOR_CACHE_DIR>/triton/0``), not Triton's ``~/.triton/cache``: a pod with another
    HOME wrote 19 kernels there on the H200 while loading the compile cache. Both get them."""
    from tunecache.client.warm_state import inductor_triton_dir

    _, _, fetched, _, _ = harvested(tmp_path)
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    assert inductor_triton_dir() == tmp_path / "inductor" / "triton" / "0"
    written = TritonCache().stage(fetched)()
    assert written["warm_state"] == ("Triton cache (1 kernels)",)
    for directory in (tmp_path / "home" / ".triton" / "cache", tmp_path / "inductor" / "triton" / "0"):
        group = json.loads((directory / "HASHB" / "__grp___fwd_kernel.json").read_text())["child_paths"]
        assert group == {"_fwd_kernel.cubin": str(directory / "HASHB" / "_fwd_kernel.cubin")}
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    assert inductor_triton_dir() is None  # Inductor uses Triton's cache then


def test_the_triton_cache_is_inflated_once_for_both_of_its_directories(tmp_path, monkeypatch):
    """Triton's directory and Inductor's get the same kernels from one pass over the tarball:
    the second is a copy of what the first unpacked and checked, modification times kept, each
    directory's group files pointed at its own paths; no staging directory is left."""
    from tunecache.client import unpack

    _, _, fetched, _, _ = harvested(tmp_path)
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    passes = []
    real = unpack.stream_bounded
    monkeypatch.setattr(unpack, "stream_bounded", lambda *args, **kw: passes.append(args[1]) or real(*args, **kw))
    TritonCache().stage(fetched)()
    assert passes == ["triton_cache"]
    triton, inductor = tmp_path / "home" / ".triton" / "cache", tmp_path / "inductor" / "triton" / "0"
    kernel = Path("HASHB") / "_fwd_kernel.cubin"
    assert (triton / kernel).read_bytes() == (inductor / kernel).read_bytes()
    assert (triton / kernel).stat().st_mtime_ns == (inductor / kernel).stat().st_mtime_ns
    assert (triton / "HASHB").stat().st_mtime_ns == (inductor / "HASHB").stat().st_mtime_ns
    for directory in (triton, inductor):
        group = json.loads((directory / "HASHB" / "__grp___fwd_kernel.json").read_text())["child_paths"]
        assert group == {"_fwd_kernel.cubin": str(directory / kernel)}
        assert not [p for p in directory.iterdir() if p.name.startswith(".tunecache-")]


def test_the_main_process_unpacks_the_staged_compile_cache_for_its_workers_and_says_when_it_could_not(tmp_path,
                                                                                                      monkeypatch):
    import os
    import time

    from tunecache.client import report
    from tunecache.client.atomic import STALE_AFTER_S
    from tunecache.client.boot import staged as pod

    _, _, fetched, backbone, _ = harvested(tmp_path)
    data = fetched.warm_state[ArtifactKind.VLLM_COMPILE_CACHE]
    staged = tmp_path / "root" / ".tunecache" / "compile-cache-run-7.tar.gz"
    staged.parent.mkdir(parents=True)
    monkeypatch.setenv("TUNECACHE_BOOT_ID", "boot-aaaaaaaa")
    monkeypatch.setattr(report, "_boot_id", None)  # this process's boot, made from the variable
    stale = staged.parent / "compile-cache-run-7-boot-old"
    stale.mkdir()
    os.utime(stale, (time.time() - 2 * STALE_AFTER_S,) * 2)
    beside = staged.parent / "compile-cache-run-7-boot-other"  # another engine's, booting now
    beside.mkdir()
    pod.unpack_staged(staged, data)
    unpacked = pod.unpacked_dir(staged)
    assert unpacked.name == "compile-cache-run-7-boot-aaaaaaaa" and (unpacked / backbone).is_dir()
    assert pod._wait_unpacked(staged) == unpacked
    assert not stale.exists() and beside.exists()
    monkeypatch.setenv("TUNECACHE_BOOT_ID", "boot-bbbbbbbb")
    monkeypatch.setattr(report, "_boot_id", None)
    pod.unpack_staged(staged, b"not a tarball")
    failed = staged.parent / "compile-cache-run-7-boot-bbbbbbbb.failed"
    assert failed.read_text().startswith("BadWarmStateArtifact: ")
    assert pod._wait_unpacked(staged) is None  # the worker unpacks the tarball itself
