"""A real ``VllmConfig`` of each release CI runs (0.25 and 0.34), built on the CPU with that
release's own code (tests/contract/vllm_config_probe.py, in an environment of that release:
tests/support/vllm_envs.py; a tiny model config written here, no weights), on a tuning node and on
pods unlike it: another HOME, another ``VLLM_CACHE_ROOT``, another package prefix (vLLM imported
through another path) and the weights in another directory.

* **0.25** (directories renamed by tunecache): the AOT directory name the pod's tunecache computes
  from the node's record (``pod_compile_factors``, ``pod_dir_names``) is the one the pod's own
  vLLM computes, though the pod's differs from the node's; the pod's ``differences`` are none.
* **0.34** (the AOT path is vLLM's own: tunecache places the artifact at the path
  ``_try_load_aot_compiled_fn`` receives): another HOME, cache root and package prefix change no
  name vLLM computes; the engine variant tunecache computes from ``VllmConfig.compile_factors()``
  is the node's on every such pod (the weights' directory too, where vLLM's own AOT name
  differs), and a pod of another ``max_model_len`` is named as another variant, field by field;
  the rank directory tunecache reads (``rank_facts``) is the one ``decorators.py`` builds.

The backbone directory (0.25-0.32, ``torch_compile_cache/<hash[:10]>``) needs a compiled graph
(the traced files' code hash and Inductor's compiler hash), which a config alone does not give:
its formula is checked against the release's source in test_vllm_releases.py instead.

Which releases: 0.25.0 and 0.34.0 (``TUNECACHE_VLLM_RELEASES`` narrows them, as in
test_vllm_releases.py). Each environment is built once (torch's CPU build, vLLM without its
dependencies, the pinned packages of tests/contract/vllm_envs/); a probe takes 10-40 s, and the
node's probe of a release is run once for the module's tests.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.support.vllm_wheels import releases
from tests.contract.vllm_config_probe import MARK
from tests.support.paths import ROOT
from tests.support.vllm_envs import release_python

CONFIG_RELEASES = ["0.25.0", "0.34.0"]
PROBE = Path(__file__).with_name("vllm_config_probe.py")
TINY_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 128,
              "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu",
              "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


def _config_releases() -> list[str]:
    return [v for v in releases() if v in CONFIG_RELEASES] or CONFIG_RELEASES


def _model(directory: Path) -> Path:
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(TINY_LLAMA))
    return directory


def _probe(python: Path, where: Path, role: str, model: Path, max_model_len: int = 256, node: dict | None = None,
           prefix: Path | None = None) -> dict:
    """The probe as ``role`` with HOME and ``VLLM_CACHE_ROOT`` under ``where``; with ``prefix``,
    the release's packages imported through that other path (a link to its site-packages)."""
    home = where / "home"
    home.mkdir(parents=True, exist_ok=True)
    env = {key: value for key, value in os.environ.items() if not key.startswith(("VLLM_", "TUNECACHE_"))}
    env.update({"HOME": str(home), "VLLM_CACHE_ROOT": str(where / "vllm-cache"), "PYTHONPATH": str(ROOT / "client"),
                "XDG_CACHE_HOME": str(home / ".cache"), "XDG_CONFIG_HOME": str(home / ".config")})
    command = [str(python)]
    if prefix is not None:
        site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, check=True).stdout.strip()
        prefix.parent.mkdir(parents=True, exist_ok=True)
        prefix.symlink_to(site, target_is_directory=True)
        env["PYTHONPATH"] = f"{prefix}{os.pathsep}{ROOT / 'client'}"
        command.append("-S")  # no site: the release is found only through ``prefix``
    command += [str(PROBE), role, str(model), str(max_model_len)]
    if node is not None:
        (where / "node.json").write_text(json.dumps(node))
        command.append(str(where / "node.json"))
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, cwd=where)
    lines = [line[len(MARK):] for line in done.stdout.splitlines() if line.startswith(MARK)]
    assert done.returncode == 0 and lines, (done.stdout[-2000:], done.stderr[-3000:])
    result = json.loads(lines[-1])
    if prefix is not None:
        assert result["vllm_file"].startswith(str(prefix)), result["vllm_file"]
    return result


@pytest.fixture(scope="module", params=_config_releases())
def release(request) -> tuple[str, Path]:
    return request.param, release_python(request.param)


@pytest.fixture(scope="module")
def node_probe(tmp_path_factory):
    """The tuning node's probe of a release, run once for this module's tests (a probe takes
    10-40 s): ``node_probe(version)`` is (its result, its directory, the weights' directory)."""
    probed: dict[str, tuple[dict, Path, Path]] = {}

    def probe(version: str) -> tuple[dict, Path, Path]:
        if version not in probed:
            where = tmp_path_factory.mktemp(f"vllm-{version}-node")
            weights = _model(where / "weights")
            probed[version] = (_probe(release_python(version), where / "node", "node", weights), where / "node", weights)
        return probed[version]

    return probe


def test_vllm_builds_its_config_on_the_cpu_with_its_own_code(release, node_probe):
    version, _ = release
    node, where, _ = node_probe(version)
    assert node["vllm_version"] == version and node["platform"].startswith("cpu")
    assert node["has_compute_hash"] is (version == "0.25.0")  # 0.34 removed every compute_hash()
    assert node["vllm"]["cache_root"] == str(where / "vllm-cache")
    assert node["tunecache_rank_dir"] == node["vllm"]["rank_dir"] == "rank_0_0"
    if version == "0.25.0":  # the tuner's record names the node's AOT directory as vLLM does
        assert node["tunecache_node_aot_dir"] == node["vllm"]["aot_dir"]


@pytest.mark.parametrize("version", ["0.25.0"])
def test_025_a_pod_unlike_the_node_computes_the_aot_name_its_own_vllm_computes(version, node_probe, tmp_path):
    if version not in _config_releases():
        pytest.skip(f"TUNECACHE_VLLM_RELEASES leaves out {version}")
    python = release_python(version)
    node, _, _ = node_probe(version)
    pod = _probe(python, tmp_path / "pod", "pod", _model(tmp_path / "pod-weights"), node=node,
                 prefix=tmp_path / "other-prefix" / "site-packages")
    assert pod["differences"] == []
    assert pod["tunecache_aot_dir"] == f"torch_aot_compile/{pod['vllm']['aot_dir']}"
    # the rename is needed: 0.25 hashes VLLM_CONFIG_ROOT (under HOME) and the weights' directory
    assert pod["vllm"]["aot_dir"] != node["vllm"]["aot_dir"]


@pytest.mark.parametrize("version", ["0.34.0"])
def test_034_vllm_names_the_aot_directory_alike_and_tunecache_the_same_variant_on_pods_unlike_the_node(
        version, node_probe, tmp_path):
    if version not in _config_releases():
        pytest.skip(f"TUNECACHE_VLLM_RELEASES leaves out {version}")
    python = release_python(version)
    node, _, weights = node_probe(version)  # the pods below read the node's weights unless named otherwise
    moved = _probe(python, tmp_path / "pod", "pod", weights, node=node, prefix=tmp_path / "other-prefix" / "site-packages")
    # another HOME, cache root and package prefix: vLLM's own AOT name is the node's
    assert moved["vllm"]["aot_dir"] == node["vllm"]["aot_dir"]
    assert moved["variant_differences"] == [] and moved["variant"] == node["variant"]
    elsewhere = _probe(python, tmp_path / "pod-2", "pod", _model(tmp_path / "other-weights"), node=node)
    # the weights' directory is in compile_factors(): vLLM names another directory (the path it
    # hands _try_load_aot_compiled_fn), the engine variant is the node's (the model as the key names it)
    assert elsewhere["vllm"]["aot_dir"] != node["vllm"]["aot_dir"]
    assert elsewhere["variant_differences"] == []
    shorter = _probe(python, tmp_path / "pod-3", "pod", weights, max_model_len=128, node=node)
    assert shorter["variant"] != node["variant"]
    assert any("max_model_len" in line for line in shorter["variant_differences"]), shorter["variant_differences"]

