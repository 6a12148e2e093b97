"""The tuning node's absolute paths inside a relocated compile cache (vllm#52154): what the tuner
records of them, what a pod rewrites, and what the install report and doctor say of the rest."""

from __future__ import annotations

import json
from types import SimpleNamespace

from tests.unit.client.client.test_warm_state import CODE_HASH, COMPILER_HASH, ENV, node_scratch, pod
from tunecache.client.install import install
from tunecache.client.pipeline import InstallTarget
from tunecache.client.warm_state import VllmCacheRoot, compile_cache_verdict
from tunecache.contract import ArtifactKind
from tunecache.engines.vllm.compile_cache import aot_dir_name, backbone_dir_name, env_hash
from tunecache.engines.vllm.compile_paths import LOADS, NOT_RELOCATABLE, TEXT, relocation, rewrite_paths
from tunecache.service.tuner.vllm_warmup import harvest_warm_state

MODEL_KEY = "k" * 64


def _with_node_paths(tmp_path):
    """The node's scratch, its compile cache naming the node's paths where vLLM and Inductor do."""
    scratch, backbone, aot = node_scratch(tmp_path)
    compiled = scratch / "vllm-cache" / "torch_compile_cache"
    aot_dir = compiled / "torch_aot_compile" / aot
    code = aot_dir / "inductor_cache" / "ab" / "cabcdef.py"
    code.parent.mkdir(parents=True)
    code.write_text(f"# kernel path: {aot_dir}/inductor_cache/xy/cxy.py\ncall = None\n")
    (aot_dir / "rank_0_0" / "model").write_bytes(b"\x80\x04 co_filename " + str(aot_dir).encode() + b"\x00")
    (aot_dir / "inductor_cache" / "other.bin").write_bytes(b"\x00 opened at " + str(compiled).encode())
    record = compiled / backbone / "rank_0_0" / "backbone" / "cache_key_factors.json"
    record.write_text(json.dumps({"env": {**ENV, "VLLM_CONFIG_ROOT": "/root/.config/vllm"}, "config_hash": "c" * 64,
                                  "code_hash": CODE_HASH, "compiler_hash": COMPILER_HASH}))
    return scratch, compiled, backbone, aot


def test_each_kind_of_file_is_rewritten_left_as_it_loads_or_not_relocatable():
    assert relocation("0123456789/rank_0_0/backbone/cache_key_factors.json") == TEXT
    assert relocation(f"torch_aot_compile/{'a' * 64}/inductor_cache/ab/cabc.py") == TEXT
    assert relocation(f"torch_aot_compile/{'a' * 64}/rank_1_0/model") == LOADS
    assert relocation("0123456789/rank_0_0/backbone/artifact_compile_range_1_2048_subgraph_0") == LOADS
    assert relocation(f"torch_aot_compile/{'a' * 64}/inductor_cache/fxgraph/xy/fabc/entry") == LOADS
    assert relocation(f"torch_aot_compile/{'a' * 64}/inductor_cache/other.bin") == NOT_RELOCATABLE
    assert rewrite_paths("/n/c/dir/x /n/c/y", {"/n/c": "/p/c", "/n/c/dir": "/p/c/DIR"}) == ("/p/c/DIR/x /p/c/y", 2)


def test_node_paths_in_a_relocated_compile_cache_are_rewritten_or_reported(tmp_path):
    scratch, compiled, backbone, aot = _with_node_paths(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    artifacts, summary = harvest_warm_state(scratch, out)
    # the tuner records where its cache was and which files name it
    assert summary["cache_dir"] == str(compiled)
    assert summary["node_paths"] == {
        f"torch_aot_compile/{aot}/inductor_cache/other.bin": NOT_RELOCATABLE,
        f"torch_aot_compile/{aot}/inductor_cache/ab/cabcdef.py": TEXT,
        f"torch_aot_compile/{aot}/inductor_cache/triton/0/HASHA/__grp__triton_poi_fused_0.json": TEXT,
        f"torch_aot_compile/{aot}/rank_0_0/model": LOADS,
    }
    fetched = SimpleNamespace(warm_state={ArtifactKind(a.kind): (out / a.path).read_bytes() for a in artifacts})
    import shutil

    shutil.rmtree(scratch)  # the tuner's work directory is gone before any pod boots

    root = tmp_path / "pod" / "vllm-cache"
    factors = pod(env={**ENV, "VLLM_CONFIG_ROOT": "/home/pod/.config/vllm"})
    run = SimpleNamespace(id=7, entries=0, artifact=lambda kind: SimpleNamespace(sha256="0" * 64))
    result = install(SimpleNamespace(**vars(fetched), run=run, signed_by=None),
                     InstallTarget.of([ArtifactKind.VLLM_COMPILE_CACHE],
                                      at={ArtifactKind.VLLM_COMPILE_CACHE: VllmCacheRoot(root, factors)}))
    pod_env_hash = env_hash(factors.env)
    pod_backbone = backbone_dir_name(pod_env_hash, "p" * 64, CODE_HASH, COMPILER_HASH)
    pod_aot = aot_dir_name(pod_env_hash, "p" * 64, [], MODEL_KEY)
    installed = root / "torch_compile_cache"
    pod_aot_dir = installed / "torch_aot_compile" / pod_aot

    # text: no node path left, each pointed at the pod's own directory (the Triton group file by its own rewrite)
    texts = [p for p in installed.rglob("*") if p.suffix in (".py", ".json")]
    assert texts and not [p for p in texts if str(compiled) in p.read_text()]
    assert (pod_aot_dir / "inductor_cache" / "ab" / "cabcdef.py").read_text().startswith(
        f"# kernel path: {pod_aot_dir}/inductor_cache/xy/cxy.py\n")
    # vLLM's record of the backbone's factors is the pod's own, as its vLLM writes it
    record = json.loads((installed / pod_backbone / "rank_0_0" / "backbone" / "cache_key_factors.json").read_text())
    assert record == {"env": factors.env, "config_hash": "p" * 64, "code_hash": CODE_HASH, "compiler_hash": COMPILER_HASH}
    # binary: left as they are, and said
    assert str(compiled).encode() in (pod_aot_dir / "rank_0_0" / "model").read_bytes()
    said = [line for line in result.warm_state if line.startswith("compile cache")]
    assert said == [
        f"compile cache (2 of 2 directories; 2 files pointed at this pod's paths; not relocatable: 1 files name the "
        f"tuning node's paths, which vLLM or torch may open (torch_aot_compile/{pod_aot}/inductor_cache/other.bin); "
        "1 artifacts name the tuning node's paths and load without them (model))"]

    # doctor (the stored run's summary, before anything is fetched) names the same file
    verdict = compile_cache_verdict(SimpleNamespace(summary={"vllm_compile": summary}, variant=None))[1]
    assert f"not relocatable: 1 files name the tuning node's paths, which vLLM or torch may open " \
           f"(torch_aot_compile/{aot}/inductor_cache/other.bin)" in verdict
