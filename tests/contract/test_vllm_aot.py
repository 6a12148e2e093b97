"""vLLM 0.33/0.34's AOT load, which the plugin wraps (tunecache.client.boot.aot), against each
release's own code read from its wheel (nothing of it imported): the module-level
``vllm.compilation.decorators._try_load_aot_compiled_fn(model, aot_compilation_path)`` exists
with that signature, and the compiled model's ``__call__`` calls it by its global name (looked up
in the module at call time, so wrapping the module's attribute intercepts it) with the path it
names ``<cache root>/torch_compile_cache/torch_aot_compile/<hash>/rank_{rank}_{dp}/model``,
after it pointed ``TORCHINDUCTOR_CACHE_DIR`` at ``<hash>/inductor_cache``.

Which releases: those of the table with ``aot_artifact`` (``TUNECACHE_VLLM_RELEASES`` narrows
them as in test_vllm_releases.py; by default 0.34, which CI runs).
"""

from __future__ import annotations

import ast

import pytest

from tests.support.vllm_wheels import ALL, release_wheel, releases
from tunecache.engines import engine_for

release_of = engine_for("vllm").release_of

AOT_RELEASES = [v for v in ALL if release_of(v).aot_artifact]


def _aot_releases() -> list[str]:
    asked = [v for v in releases() if v in AOT_RELEASES]
    return asked or [AOT_RELEASES[-1]]


def test_the_table_places_the_aot_artifact_for_0_33_and_0_34_only():
    assert AOT_RELEASES == ["0.33.0", "0.34.0"]
    assert all(release_of(v).compile_cache for v in AOT_RELEASES)


def _module(wheel, version):
    source = wheel.read("vllm/compilation/decorators.py").decode()
    return source, ast.parse(source)


@pytest.mark.parametrize("version", _aot_releases())
def test_the_wrapped_function_exists_with_that_signature(wheels, version):  # noqa: F811
    _, tree = _module(release_wheel(wheels, version), version)
    [function] = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_try_load_aot_compiled_fn"]
    assert [a.arg for a in function.args.args] == ["model", "aot_compilation_path"]
    assert not function.args.vararg and not function.args.kwonlyargs and not function.args.kwarg


def _call_method(tree: ast.Module) -> ast.FunctionDef:
    """``__call__`` of the class ``_support_torch_compile`` decorates (a nested function there)."""
    [outer] = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_support_torch_compile"]
    [call] = [n for n in ast.walk(outer) if isinstance(n, ast.FunctionDef) and n.name == "__call__"]
    return call


@pytest.mark.parametrize("version", _aot_releases())
def test_call_looks_the_function_up_by_name_with_the_path_it_loads(wheels, version):  # noqa: F811
    source, tree = _module(release_wheel(wheels, version), version)
    call = _call_method(tree)
    calls = [n for n in ast.walk(call) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
             and n.func.id == "_try_load_aot_compiled_fn"]
    assert len(calls) == 1, "called once, by its bare (module-global) name"
    assert [ast.unparse(a) for a in calls[0].args] == ["self", "aot_compilation_path"]
    # not bound to a local name or imported into __call__ (then the module attribute would not be looked up)
    assert not [n for n in ast.walk(call) if isinstance(n, (ast.Import, ast.ImportFrom))
                and any((a.asname or a.name) == "_try_load_aot_compiled_fn" for a in n.names)]
    text = ast.get_source_segment(source, call)
    for piece in ('"torch_compile_cache"', '"torch_aot_compile"', 'f"rank_{rank}_{dp_rank}"',
                  'os.path.join(cache_dir, "model")', 'os.environ["TORCHINDUCTOR_CACHE_DIR"] = inductor_cache',
                  'os.path.join(cache_dir, "inductor_cache")'):
        assert piece in text, (version, piece)
    # Inductor's directory is pointed at before the load, and the rank directory is under the hash directory
    assert text.index("TORCHINDUCTOR_CACHE_DIR") < text.index("_try_load_aot_compiled_fn(")
    assert text.index('os.path.join(cache_dir, "inductor_cache")') < text.index('f"rank_{rank}_{dp_rank}"')


def _environment_variables(source: str) -> set[str]:
    """The names of ``vllm/envs.py``'s ``environment_variables`` dict."""
    for node in ast.parse(source).body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        if isinstance(target, ast.Name) and target.id == "environment_variables" and isinstance(node.value, ast.Dict):
            return {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
    raise AssertionError("no environment_variables dict in vllm/envs.py")


def _ignored_factors(source: str) -> set[str]:
    """The names ``vllm/envs.py::compile_factors`` leaves out (its ``ignored_factors`` set)."""
    [function] = [n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == "compile_factors"]
    return {e.value for n in ast.walk(function) if isinstance(n, ast.Set) for e in n.elts if isinstance(e, ast.Constant)}


@pytest.mark.parametrize("version", _aot_releases())
def test_every_per_pod_host_port_and_library_path_vllm_hashes_is_a_placement_factor(wheels, version):  # noqa: F811
    """What ``envs.compile_factors()`` hashes and is where a pod is or reaches its peers (hosts,
    ports, addresses, library paths, ``CUDA_HOME``) changes only the AOT name: each is named as
    such at the install and by doctor (tunecache.engines.vllm.aot.PLACEMENT_ENV_FACTORS)."""
    import re

    from tunecache.engines.vllm.aot import PLACEMENT_ENV_FACTORS

    source = release_wheel(wheels, version).read("vllm/envs.py").decode()
    hashed = _environment_variables(source) - _ignored_factors(source)
    per_pod = {n for n in hashed if re.search(r"(_HOST|_HOSTNAME|_PORT|_IP|_SO_PATH)$|^CUDA_HOME$", n)}
    assert {"VLLM_P2P_SIDE_CHANNEL_HOST", "VLLM_P2P_SIDE_CHANNEL_PORT", "MOONCAKE_REQUESTER_LOCAL_HOSTNAME",
            "CUDA_HOME", "VLLM_NCCL_SO_PATH", "VLLM_CUDART_SO_PATH"} <= per_pod
    assert per_pod <= set(PLACEMENT_ENV_FACTORS), sorted(per_pod - set(PLACEMENT_ENV_FACTORS))


def test_0_34s_variant_is_vllm_configs_compile_factors_one_entry_per_sub_config(wheels):  # noqa: F811
    """tunecache.engines.vllm.aot.config_factor_groups reads 0.34's ``VllmConfig.compile_factors()``
    as one dict per sub-config (``config/vllm.py``), ``ModelConfig.model`` among the fields it
    hashes (so a variant sets it to the served model's name) and the tokenizer's place not."""
    wheel = release_wheel(wheels, "0.34.0")
    source = wheel.read("vllm/config/vllm.py").decode()
    [config] = [n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "VllmConfig"]
    [method] = [n for n in config.body if isinstance(n, ast.FunctionDef) and n.name == "compile_factors"]
    [factors] = [n.value for n in ast.walk(method) if isinstance(n, ast.AnnAssign) and isinstance(n.value, ast.Dict)]
    groups = {k.value: ast.unparse(v) for k, v in zip(factors.keys, factors.values)}
    assert groups["model"] == "get_factors(self.model_config)" and groups["cache"] == "get_factors(self.cache_config)"
    assert all(v.startswith("get_factors(self.") for v in groups.values())
    model = wheel.read("vllm/config/model.py").decode()
    [model_class] = [n for n in ast.parse(model).body if isinstance(n, ast.ClassDef) and n.name == "ModelConfig"]
    [model_factors] = [n for n in model_class.body if isinstance(n, ast.FunctionDef) and n.name == "compile_factors"]
    ignored = {e.value for n in ast.walk(model_factors) if isinstance(n, ast.Set) for e in n.elts
               if isinstance(e, ast.Constant)}
    assert "tokenizer" in ignored and "hf_config_path" in ignored and "model" not in ignored
    assert "max_model_len" not in ignored


@pytest.mark.parametrize("version", _aot_releases())
def test_the_startup_plan_is_read_by_fingerprint_where_and_when_tunecache_places_it(wheels, version):  # noqa: F811
    """tunecache.client.startup_plan, against ``vllm/v1/worker/startup_plan.py`` of the release: a
    worker's fingerprint is ``compute_plan_fingerprint(vllm_config, rank, world_size)`` (16 hex
    digits, vLLM's version and device in it), the plan's path ``_plan_path(fingerprint)`` under
    ``VLLM_CACHE_ROOT/startup_plan/``, ``_load_plan`` refuses another schema or fingerprint inside,
    and ``Worker.determine_available_memory`` (which the plugin wraps) applies it first."""
    from tunecache.engines.vllm.startup_plan import (
        PLAN_DIR,
        PLAN_SCHEMAS,
        plan_file_name,
    )

    wheel = release_wheel(wheels, version)
    source = wheel.read("vllm/v1/worker/startup_plan.py").decode()
    tree = ast.parse(source)
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert [a.arg for a in functions["compute_plan_fingerprint"].args.args] == ["vllm_config", "rank", "world_size"]
    fingerprint = ast.get_source_segment(source, functions["compute_plan_fingerprint"])
    config = '"vllm_config": hash_config(vllm_config)' if version >= "0.34" else '"vllm_config": vllm_config.compute_hash()'
    for piece in ('"vllm": vllm_version', config, '"device_name"',
                  '"device_total_memory"', '"torch": torch.__version__', '"rank": rank', "return digest[:16]"):
        assert piece in fingerprint, piece
    path = ast.get_source_segment(source, functions["_plan_path"])
    assert f'"{PLAN_DIR}"' in path and 'f"{}"'.format(plan_file_name("{fingerprint}")) in path
    [schema] = [n.value.value for n in tree.body if isinstance(n, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "PLAN_SCHEMA_VERSION" for t in n.targets)]
    assert schema == PLAN_SCHEMAS[version.rsplit(".", 1)[0]]
    load = ast.get_source_segment(source, functions["_load_plan"])
    assert 'plan.get("schema") != PLAN_SCHEMA_VERSION' in load and 'plan.get("fingerprint") != fingerprint' in load
    worker = wheel.read("vllm/v1/worker/gpu_worker.py").decode()
    [worker_class] = [n for n in ast.parse(worker).body if isinstance(n, ast.ClassDef) and n.name == "Worker"]
    [method] = [n for n in worker_class.body if isinstance(n, ast.FunctionDef) and n.name == "determine_available_memory"]
    first = next(s for s in method.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)))
    assert ast.unparse(first) == "maybe_apply_startup_plan(self)"


@pytest.mark.parametrize("version", _aot_releases())
def test_fa4s_cute_dsl_cache_is_where_and_as_tunecache_installs_it(wheels, version):  # noqa: F811
    """tunecache.client.jit_caches.fa4_cute_dsl_cache_dir and the ``fa4_cute_dsl_cache`` kind, against
    ``vllm/vllm_flash_attn/cute/cache_utils.py`` of the release: on only with
    ``FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1``; ``FLASH_ATTENTION_CUTE_DSL_CACHE_DIR``, else
    ``tempfile.gettempdir()/getuser()/flash_attention_cute_dsl_cache``; entries under a fingerprint
    of FA4's sources by their relative paths (no package prefix in it), ``<key sha256>.o`` beside
    ``<key sha256>.lock``."""
    wheel = release_wheel(wheels, version)
    if "vllm/vllm_flash_attn/cute/cache_utils.py" not in wheel.namelist():
        pytest.skip(f"vllm {version} ships no FlashAttention 4 CuTe DSL cache")
    source = wheel.read("vllm/vllm_flash_attn/cute/cache_utils.py").decode()
    functions = {n.name: ast.get_source_segment(source, n) for n in ast.walk(ast.parse(source))
                 if isinstance(n, ast.FunctionDef)}
    assert 'os.getenv("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "0") == "1"' in source
    assert 'os.getenv("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", None)' in source
    assert ('Path(tempfile.gettempdir()) / getuser() / "flash_attention_cute_dsl_cache"'
            in functions["get_cache_path"])
    assert "get_cache_path() / _compute_source_fingerprint()" in functions["get_jit_cache"]
    assert "src.relative_to(cute_root).as_posix()" in functions["_compute_source_fingerprint"]
    assert 'self.cache_path / f"{sha256_hex}.o"' in source and 'self.cache_path / f"{sha256_hex}.lock"' in source


def test_0_34s_model_registry_fills_every_models_inspection_keyed_by_relative_paths(wheels):  # noqa: F811
    """tunecache.service.tuner.vllm_warmup.fill_model_info_cache against 0.34's
    ``vllm/model_executor/models/registry.py``: ``ModelRegistry`` is a ``_ModelRegistry`` with
    ``fill_model_info_cache(self)``, whose entries go under ``VLLM_CACHE_ROOT/modelinfos`` keyed by
    their module's relative paths and bytes (another package prefix is no difference); 0.33 has none."""
    source = release_wheel(wheels, "0.34.0").read("vllm/model_executor/models/registry.py").decode()
    tree = ast.parse(source)
    [registry] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "_ModelRegistry"]
    [fill] = [n for n in registry.body if isinstance(n, ast.FunctionDef) and n.name == "fill_model_info_cache"]
    assert [a.arg for a in fill.args.args] == ["self"]
    assert [ast.unparse(n.value.func) for n in tree.body if isinstance(n, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "ModelRegistry" for t in n.targets)] == ["_ModelRegistry"]
    assert 'Path(envs.VLLM_CACHE_ROOT) / "modelinfos"' in source
    assert 'path.relative_to(root_path).as_posix().encode("utf-8")' in source
    if "0.33.0" in _aot_releases():
        older = release_wheel(wheels, "0.33.0").read("vllm/model_executor/models/registry.py").decode()
        assert "def fill_model_info_cache" not in older
