"""The compile cache's factors: what a pod compares, and the names it installs under."""

from __future__ import annotations

from tunecache.engines.vllm.compile_cache import (
    CompileFactors,
    PodCompileFactors,
    aot_dir_name,
    backbone_dir_name,
    differences,
    env_hash,
    node_dir_names,
    pod_dir_names,
)

ENV = {"VLLM_USE_AOT_COMPILE": True, "VLLM_PP_LAYER_PARTITION": None}


def node_factors(**changes) -> CompileFactors:
    fields = dict(vllm_version="0.25.0", env=ENV, config_hash="c" * 64,
                  config_hashes={"model_config": "m" * 64, "scheduler_config": "s" * 64},
                  model="/node/scratch/model", code_hash="d" * 64, compiler_hash="e" * 64,
                  traced_files={"/site/vllm/model_executor/models/llama.py": "f" * 64},
                  aot_extra=[], model_hash_key="k" * 64)
    fields.update(changes)
    factors = CompileFactors(**fields)
    names = node_dir_names(factors)
    return factors.model_copy(update={"backbone_dir": names.get("backbone"), "aot_dir": names.get("aot")})


def pod_factors(node: CompileFactors, **changes) -> PodCompileFactors:
    fields = dict(vllm_version=node.vllm_version, env=dict(node.env), config_hash="p" * 64,
                  config_hash_as_node=node.config_hash, config_hashes_as_node=dict(node.config_hashes),
                  traced_files=dict(node.traced_files))
    fields.update(changes)
    return PodCompileFactors(**fields)


def test_where_the_model_lives_is_no_difference_and_names_follow_the_pods_config():
    node = node_factors()
    pod = pod_factors(node)  # its own model path: its own config hash, the node's with the node's path
    assert differences(node, pod) == []
    names = pod_dir_names(node, pod)
    assert names == {
        node.backbone_dir: backbone_dir_name(env_hash(ENV), "p" * 64, "d" * 64, "e" * 64),
        f"torch_aot_compile/{node.aot_dir}": "torch_aot_compile/" + aot_dir_name(env_hash(ENV), "p" * 64, [], "k" * 64),
    }
    assert len(names[node.backbone_dir]) == 10 and len(node.aot_dir) == 64


def test_a_pod_with_the_nodes_factors_gets_the_nodes_names():
    node = node_factors()
    pod = pod_factors(node, config_hash=node.config_hash)
    assert pod_dir_names(node, pod) == {node.backbone_dir: node.backbone_dir,
                                        f"torch_aot_compile/{node.aot_dir}": f"torch_aot_compile/{node.aot_dir}"}


def test_each_differing_factor_is_named_in_one_line():
    node = node_factors()
    pod = pod_factors(node, vllm_version="0.26.0", env={**ENV, "VLLM_USE_AOT_COMPILE": False, "VLLM_NEW": "1"},
                      config_hash_as_node="x" * 64, config_hashes_as_node={**node.config_hashes, "scheduler_config": "t" * 64},
                      traced_files={"/site/vllm/model_executor/models/llama.py": None})
    lines = differences(node, pod)
    assert lines[0] == "vLLM version: node 0.25.0, pod 0.26.0"
    assert "environment VLLM_NEW: node '(unset)', pod '1'" in lines
    assert "environment VLLM_USE_AOT_COMPILE: node true, pod false" in lines
    assert any(line.startswith("vLLM config scheduler_config: its hash differs") for line in lines)
    assert not any("model_config" in line for line in lines)
    assert lines[-1].startswith("traced source /site/vllm/model_executor/models/llama.py: not on this pod")
    assert len(lines) == 5


def test_a_config_difference_outside_the_named_sub_configs_is_still_named():
    node = node_factors()
    lines = differences(node, pod_factors(node, config_hash_as_node="x" * 64))
    assert lines == [f"vLLM config hash: node {'c' * 12}, pod {'x' * 12}"]


def test_changed_traced_source_is_named():
    node = node_factors()
    lines = differences(node, pod_factors(node, traced_files={"/site/vllm/model_executor/models/llama.py": "0" * 64}))
    assert lines == ["traced source /site/vllm/model_executor/models/llama.py: its content differs"]


def test_a_directory_without_its_factors_keeps_the_nodes_name_only_for_equal_hashes():
    node = node_factors(model_hash_key=None)
    assert f"torch_aot_compile/{node.aot_dir}" not in pod_dir_names(node, pod_factors(node))
    node = node.model_copy(update={"aot_dir": "a" * 64})
    same = pod_factors(node, config_hash=node.config_hash)
    assert pod_dir_names(node, same)[f"torch_aot_compile/{'a' * 64}"] == f"torch_aot_compile/{'a' * 64}"


def test_placement_factors_of_the_environment_are_no_difference_and_the_pods_values_name_the_directories():
    """Another HOME: vLLM 0.25 hashes VLLM_CONFIG_ROOT and VLLM_XLA_CACHE_PATH, whose defaults
    derive from it, into both names; the pod gets the cache under the names its values give."""
    node = node_factors(env={**ENV, "VLLM_CONFIG_ROOT": "/root/.config/vllm",
                             "VLLM_XLA_CACHE_PATH": "/root/.cache/vllm/xla_cache"})
    pod_env = {**ENV, "VLLM_CONFIG_ROOT": "/home/pod/.config/vllm", "VLLM_XLA_CACHE_PATH": "/home/pod/.cache/vllm/xla_cache"}
    pod = pod_factors(node, env=pod_env)
    assert differences(node, pod) == []
    names = pod_dir_names(node, pod)
    assert names[node.backbone_dir] == backbone_dir_name(env_hash(pod_env), "p" * 64, "d" * 64, "e" * 64)
    assert names[f"torch_aot_compile/{node.aot_dir}"] == "torch_aot_compile/" + aot_dir_name(env_hash(pod_env), "p" * 64,
                                                                                              [], "k" * 64)
    assert env_hash(pod_env) != env_hash(node.env)
    # any other variable still differs
    assert differences(node, pod_factors(node, env={**pod_env, "VLLM_USE_AOT_COMPILE": False})) == [
        "environment VLLM_USE_AOT_COMPILE: node true, pod false"]


def _package(prefix, text="class LlamaModel: ...\n"):
    source = prefix / "tc_relocated_pkg" / "models" / "llama.py"
    source.parent.mkdir(parents=True)
    (prefix / "tc_relocated_pkg" / "__init__.py").write_text("")
    source.write_text(text)
    return source


def test_traced_sources_under_another_prefix_are_found_where_the_pod_imports_them_and_name_its_backbone(
        tmp_path, monkeypatch):
    """The pod's packages under another prefix: each traced file is looked up where this pod
    imports its package from, and the code hash is vLLM's formula over the pod's paths."""
    import hashlib
    import sys

    from tunecache.engines.vllm.compile_cache import (
        code_hash,
        file_digests,
        locate_here,
        traced_files_here,
    )

    node_file = _package(tmp_path / "node-prefix" / "site-packages")
    pod_file = _package(tmp_path / "pod-prefix" / "site-packages")
    node_traced = {str(node_file): file_digests([str(node_file)])[str(node_file)]}
    monkeypatch.syspath_prepend(str(tmp_path / "pod-prefix" / "site-packages"))
    monkeypatch.delitem(sys.modules, "tc_relocated_pkg", raising=False)
    # the node's path still exists on this machine, but the pod imports the package from its own prefix
    assert locate_here(str(node_file)) == str(pod_file)
    digests, moved, own = traced_files_here(node_traced)
    assert digests == node_traced and moved == {str(node_file): str(pod_file)}
    expected = hashlib.sha256("\n".join([str(pod_file), pod_file.read_text()]).encode()).hexdigest()  # backends.py
    assert own == code_hash([str(pod_file)]) == expected
    node = node_factors(traced_files=node_traced)
    pod = pod_factors(node, traced_files=digests, traced_here=moved, code_hash=own)
    assert differences(node, pod) == []
    assert pod_dir_names(node, pod)[node.backbone_dir] == backbone_dir_name(env_hash(ENV), "p" * 64, own, "e" * 64)


def test_a_traced_source_with_other_bytes_under_the_pods_prefix_is_named_and_gets_no_code_hash(tmp_path, monkeypatch):
    import sys

    from tunecache.engines.vllm.compile_cache import file_digests, traced_files_here

    node_file = _package(tmp_path / "node-prefix")
    _package(tmp_path / "pod-prefix", text="class LlamaModel:  # patched\n    ...\n")
    node_file_digest = file_digests([str(node_file)])[str(node_file)]
    node_file.unlink()
    monkeypatch.syspath_prepend(str(tmp_path / "pod-prefix"))
    monkeypatch.delitem(sys.modules, "tc_relocated_pkg", raising=False)
    digests, moved, own = traced_files_here({str(node_file): node_file_digest})
    assert own is None and moved
    node = node_factors(traced_files={str(node_file): node_file_digest})
    assert differences(node, pod_factors(node, traced_files=digests, traced_here=moved)) == [
        f"traced source {node_file}: its content differs"]
    assert traced_files_here({"/gone/nowhere_pkg_xyz/models/llama.py": node_file_digest})[0] == {
        "/gone/nowhere_pkg_xyz/models/llama.py": None}


def _variant_config(monkeypatch, max_model_len: int, model: str = "/node/model"):
    """A VllmConfig of two sub-configs, the model's hashing its fields through
    ``vllm.config.utils.hash_factors`` (imported on each call, as vLLM's configs do; a
    stand-in module for the test's duration)."""
    import dataclasses
    import sys
    import types

    utils = types.ModuleType("vllm.config.utils")
    utils.hash_factors = lambda items: __import__("hashlib").sha256(repr(sorted(items.items())).encode()).hexdigest()
    config = types.ModuleType("vllm.config")
    config.utils = utils
    vllm = types.ModuleType("vllm")
    vllm.config = config
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.config", config)
    monkeypatch.setitem(sys.modules, "vllm.config.utils", utils)

    @dataclasses.dataclass(frozen=True)
    class ModelConfig:
        model: str
        max_model_len: int

        def compute_hash(self):
            from vllm.config.utils import hash_factors

            return hash_factors({"model": self.model, "max_model_len": self.max_model_len})

    @dataclasses.dataclass
    class CacheConfig:
        block_size: int = 16

        def compute_hash(self):
            return str(self.block_size)

    @dataclasses.dataclass
    class VllmConfig:
        model_config: ModelConfig
        cache_config: CacheConfig

    return VllmConfig(ModelConfig(model, max_model_len), CacheConfig())


def test_a_variant_is_where_the_model_lives_left_out_and_its_fields_named(monkeypatch):
    from tunecache.engines.vllm.compile_cache import (
        variant_differences,
        variant_factors,
    )

    env = {"VLLM_USE_AOT_COMPILE": "1", "VLLM_CONFIG_ROOT": "/home/node/.config/vllm"}
    node = variant_factors(_variant_config(monkeypatch, 4096), env, "0.25.0", "meta-llama/Llama-3.1-8B")
    moved = variant_factors(_variant_config(monkeypatch, 4096, model="/pod/elsewhere"),
                            {**env, "VLLM_CONFIG_ROOT": "/home/pod/.config/vllm"}, "0.25.0", "meta-llama/Llama-3.1-8B")
    assert moved.variant == node.variant and variant_differences(node, moved) == []  # placement only
    longer = variant_factors(_variant_config(monkeypatch, 8192), env, "0.25.0", "meta-llama/Llama-3.1-8B")
    assert longer.variant != node.variant and len(longer.variant) == 16
    assert variant_differences(node, longer) == ["vLLM config model_config.max_model_len: node 4096, pod 8192"]
    other = variant_factors(_variant_config(monkeypatch, 4096), {**env, "VLLM_USE_AOT_COMPILE": "0"}, "0.26.0",
                            "meta-llama/Llama-3.1-8B")
    assert variant_differences(node, other) == ["vLLM version: node 0.25.0, pod 0.26.0",
                                                "environment VLLM_USE_AOT_COMPILE: node '1', pod '0'"]
    assert node.config_factors["model_config"]["model"] == "meta-llama/Llama-3.1-8B"  # the served name, not a path
    assert "cache_config" not in node.config_factors  # hashed otherwise: named by its hash only


def test_the_compile_index_handles_point_at_this_pods_artifacts(tmp_path):
    """vLLM's vllm_compile_cache.py names each artifact by the node's absolute path (vllm#52154);
    a pod's copy of the index points at its own copy of the artifact, in vLLM's own format."""
    import ast
    import pprint

    from tunecache.engines.vllm.compile_cache import relocate_compile_index

    node = "/node/scratch/vllm-cache/torch_compile_cache/d1c44ff477/rank_0_0/backbone"
    index = {((1, 2048), 0, "inductor_standalone"): {"graph_handle": ("k0", f"{node}/artifact_compile_range_1_2048_subgraph_0"),
                                                      "cache_key": "c0"},
             ((1, 2048), 1, "inductor_standalone"): {"graph_handle": ("k1", f"{node}/artifact_gone"), "cache_key": "c1"}}
    (tmp_path / "artifact_compile_range_1_2048_subgraph_0").write_bytes(b"x")
    text, moved, missing = relocate_compile_index(pprint.PrettyPrinter(indent=4).pformat(index), str(tmp_path))
    assert moved == 1 and missing == [f"{node}/artifact_gone"]
    again = ast.literal_eval(text)
    assert again[((1, 2048), 0, "inductor_standalone")]["graph_handle"] == (
        "k0", str(tmp_path / "artifact_compile_range_1_2048_subgraph_0"))
    assert relocate_compile_index(text, str(tmp_path))[1] == 0  # in place already: nothing moves
    import pytest

    with pytest.raises(ValueError):
        relocate_compile_index("__import__('os')", str(tmp_path))


def test_the_rust_frontends_path_under_another_package_prefix_is_no_difference_nor_another_variant(monkeypatch):
    """vLLM 0.25-0.34 hash VLLM_RUST_FRONTEND_PATH, whose default with VLLM_USE_RUST_FRONTEND=1 is
    <vLLM's package directory>/vllm-rs: a pod whose packages live under another prefix computed
    other names (vllm/envs.py of each release; tunecache.engines.vllm.placement)."""
    from tunecache.engines.vllm.compile_cache import variant_factors

    rust = {**ENV, "VLLM_USE_RUST_FRONTEND": True}
    node = node_factors(env={**rust, "VLLM_RUST_FRONTEND_PATH": "/usr/local/lib/python3.12/site-packages/vllm/vllm-rs"})
    pod_env = {**rust, "VLLM_RUST_FRONTEND_PATH": "/opt/venv/lib/python3.12/site-packages/vllm/vllm-rs"}
    pod = pod_factors(node, env=pod_env)
    assert differences(node, pod) == []
    assert pod_dir_names(node, pod)[node.backbone_dir] == backbone_dir_name(env_hash(pod_env), "p" * 64, "d" * 64,
                                                                            "e" * 64)
    on_node = variant_factors(_variant_config(monkeypatch, 4096), node.env, "0.25.0", "meta-llama/Llama-3.1-8B")
    on_pod = variant_factors(_variant_config(monkeypatch, 4096), pod_env, "0.25.0", "meta-llama/Llama-3.1-8B")
    assert on_pod.variant == on_node.variant and "VLLM_RUST_FRONTEND_PATH" not in on_pod.env
    # whether the frontend is on is still a factor of its own
    assert differences(node, pod_factors(node, env={**ENV, "VLLM_USE_RUST_FRONTEND": False,
                                                    "VLLM_RUST_FRONTEND_PATH": None})) == [
        "environment VLLM_USE_RUST_FRONTEND: node true, pod false"]


def test_a_placement_factor_that_is_unset_keeps_the_variant_ids_computed_before():
    """The Rust frontend off (VLLM_RUST_FRONTEND_PATH None, every pod but those that turn it on):
    the variant is what it was before the variable was listed, so stored variant runs still match."""
    from tunecache.engines.vllm.compile_cache import VariantFactors
    from tunecache.engines.vllm.placement import variant_env

    env = {**ENV, "VLLM_RUST_FRONTEND_PATH": None, "VLLM_CONFIG_ROOT": "/root/.config/vllm"}
    kept = variant_env(env)
    assert kept == {**ENV, "VLLM_RUST_FRONTEND_PATH": None}
    before = {name: value for name, value in env.items() if name not in ("VLLM_CONFIG_ROOT", "VLLM_XLA_CACHE_PATH")}
    assert (VariantFactors(vllm_version="0.25.0", env=kept, config_hashes={}).variant
            == VariantFactors(vllm_version="0.25.0", env=before, config_hashes={}).variant)


def _config_0_34(max_model_len: int, model: str = "/models/llama", tokenizer: str = "/models/llama"):
    """A ``VllmConfig`` shaped as 0.34's: no ``compute_hash()`` anywhere, ``compile_factors()``
    one entry per sub-config (``vllm/config/vllm.py::VllmConfig.compile_factors``) and the version."""
    import dataclasses

    @dataclasses.dataclass
    class ModelConfig:
        model: str
        tokenizer: str
        max_model_len: int

        def compile_factors(self):  # get_compile_factors(self, ignored_factors={"tokenizer", ...})
            return {"model": self.model, "max_model_len": self.max_model_len}

    @dataclasses.dataclass
    class VllmConfig:
        model_config: ModelConfig

        def compile_factors(self, include_version: bool = True):
            return {"model": self.model_config.compile_factors(), "cache": {"block_size": 16}, "version": "0.34.0"}

    return VllmConfig(ModelConfig(model, tokenizer, max_model_len))


def test_a_0_34_variant_comes_from_compile_factors_field_by_field():
    """0.34 removed every ``compute_hash()``: its variant is ``VllmConfig.compile_factors()``, so
    another ``max_model_len`` is another variant, named by its field, and where the model lives is none."""
    from tunecache.engines.vllm.compile_cache import (
        variant_differences,
        variant_factors,
    )

    served = "meta-llama/Llama-3.1-8B"
    node = variant_factors(_config_0_34(4096, model="/node/work"), {}, "0.34.0", served)
    pod = variant_factors(_config_0_34(4096, model="/pod/else", tokenizer="/pod/tok"), {}, "0.34.0", served)
    longer = variant_factors(_config_0_34(8192), {}, "0.34.0", served)
    assert node.config_factors["model"] == {"model": served, "max_model_len": 4096}
    assert node.variant == pod.variant and variant_differences(node, pod) == []
    assert longer.variant != node.variant
    assert variant_differences(node, longer) == ["vLLM config model.max_model_len: node 4096, pod 8192"]


def test_the_aot_name_joins_inductors_dict_and_bytes_factors_as_vllms_str_of_its_list_does():
    """vLLM's name is ``sha256(str(factors + [model_hash_key]))``; with the mega artifact the factors
    past the config hash are ``get_inductor_factors()``'s, dicts and bytes in 0.25 (read off its
    real config: tests/contract/test_vllm_config_names.py). Their ``str()`` in quotes is not how
    the list writes them: the record's ``aot_extra_repr`` is."""
    import hashlib

    factors = ["e" * 64, "c" * 64, {"max_autotune": False, "triton.cudagraphs": True}, b"\x00torch", ("a", 1)]
    vllm_name = hashlib.sha256(str(factors + ["k" * 64]).encode()).hexdigest()
    extra = factors[2:]
    assert aot_dir_name("e" * 64, "c" * 64, [str(f) for f in extra], "k" * 64, [repr(f) for f in extra]) == vllm_name
    assert aot_dir_name("e" * 64, "c" * 64, [str(f) for f in extra], "k" * 64) != vllm_name  # the record before it
    strings = ["s1", "s2"]  # factors that are strings: a record without aot_extra_repr names them right
    assert aot_dir_name("e", "c", strings, "k") == aot_dir_name("e", "c", strings, "k", [repr(s) for s in strings]) \
        == hashlib.sha256(str(["e", "c", *strings, "k"]).encode()).hexdigest()
