"""The whole warm state through the vLLM plugin, with a stand-in `vllm` at the edge
(tests/support/vllm_stand_in.py): a run harvested from a tuning node's scratch
(:func:`tunecache.service.tuner.vllm_warmup.harvest_warm_state`), recorded signed, and a
stand-in engine booting from zero (empty cache root and Triton cache): its main process
inspects the model (vLLM's ``modelinfos`` cache), its worker settles the KV-cache block size
and then looks up its two compile-cache directories by vLLM's formulas.

Checked: every cache in place before vLLM reads it, the compile cache under the names the
worker's own config gives (another model path, a block size settled in the worker), each
differing factor named in one line with the compile cache left out, the boot's attestation
(what it still compiled) logged and reported, and an unsigned run installing none of it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import pytest

from tests.support.builders import h200_key, run_payload, signed, stored_reports
from tests.support.paths import CUDNN_FILE, LLAMA_CONFIG
from tests.support.serve import admin_token, as_admin
from tests.support.vllm_stand_in import node_scratch, run_engine, tunecache_lines, worker_env

# What this module tests happens on the pod: its server runs on SQLite only (tests/conftest.py).
SERVER_DATABASE_INCIDENTAL = True

NODE_MODEL = "/node/work/vllm-scratch/model"


def push_warm_run(server, tmp_path, signing_key, **overrides) -> int:
    """Harvest a node's scratch and record its run (tactics + warm state), signed by the node."""
    from tunecache.service.tuner.vllm_warmup import harvest_warm_state

    from tunecache.engines.vllm.compile_cache import VariantFactors

    scratch = node_scratch(tmp_path, NODE_MODEL, **overrides)
    out = tmp_path / ("harvest" + (f"-{overrides['max_model_len']}" if overrides.get("max_model_len") else ""))
    out.mkdir()
    artifacts, summary = harvest_warm_state(scratch, out)
    shutil.rmtree(scratch)  # gone, as a tuning job's scratch is: pods never read the node's paths
    assert summary["names_checked"] == {"backbone": True, "aot": True}
    payload = run_payload(CUDNN_FILE, h200_key(), variant=VariantFactors.model_validate(summary["variant_factors"]).variant)
    for blob in [CUDNN_FILE.read_bytes()] + [(out / a.path).read_bytes() for a in artifacts]:
        assert as_admin.put(f"{server}/v1/artifacts/{hashlib.sha256(blob).hexdigest()}", content=blob).status_code in (200, 201)
    payload["artifacts"] += [{"kind": a.kind, "name": a.name, "media_type": a.media_type,
                              "sha256": hashlib.sha256((out / a.path).read_bytes()).hexdigest()} for a in artifacts]
    payload["summary"]["vllm_compile"] = summary
    if overrides.get("dependencies"):  # the package versions the tuner recorded
        payload["summary"]["dependencies"] = overrides["dependencies"]
    if overrides.get("max_model_len"):  # tuned for that engine variant (tune --engine-args)
        payload["summary"]["engine_args"] = {"max_model_len": overrides["max_model_len"]}
    answer = as_admin.post(f"{server}/v1/tunings", json=signed(payload, signing_key))
    assert answer.status_code == 201, answer.text
    return answer.json()["id"]


def pod_env(tmp_path, server, **env):
    return {"TUNECACHE_URL": server, "STAND_IN_MODEL": "/models/llama", "STAND_IN_MNBT": "8192",
            "STAND_IN_BLOCK_SIZE": "32", "VLLM_USE_AOT_COMPILE": "1", "TRITON_CACHE_DIR": str(tmp_path / "pod-triton"),
            **env}


def test_a_boot_from_zero_finds_every_cache_in_place_and_attests_it_compiled_nothing(server, tmp_path,
                                                                                    node_signing_key, database_url):
    run = push_warm_run(server, tmp_path, node_signing_key, block_size=32)
    seen, log = run_engine(tmp_path, **pod_env(tmp_path, server))
    assert seen["inspect_model"] == {"cached": True}  # modelinfos installed before vLLM inspected the model
    assert seen["compile"] == {"backbone": True, "aot": True}  # under this pod's names: its model path, its block size
    lines = tunecache_lines(log, attestation=True)
    assert lines[0].startswith(f"tunecache: warm state of run {run} installed for meta-llama/Llama-3.1-8B in ")
    assert "Triton cache (1 kernels), modelinfos (1 files), compile cache staged for the workers" in lines[0]
    # its own model path, its own config hash: vLLM's cache_key_factors.json says the pod's factors
    assert lines[1].startswith(f"tunecache: compile cache (2 of 2 directories; 1 files pointed at this pod's paths) "
                               f"from run {run}, under the names this worker's vLLM config gives (rank 0, ")
    assert lines[-1] == "tunecache: this boot compiled nothing (rank 0): at the floor"
    group = tmp_path / "pod-triton" / "HASHB" / "__grp___fwd_kernel.json"
    assert json.loads(group.read_text())["child_paths"] == {"_fwd_kernel.cubin": str(group.parent / "_fwd_kernel.cubin")}
    [report] = stored_reports(database_url, 1)
    assert report.outcome == "installed" and report.compiled_total == 0
    assert set(report.compiled) >= {"flashinfer_jit_modules", "triton_kernels", "model_inspections", "deep_gemm_kernels"}


@pytest.mark.parametrize("case, node, pod, named", [
    ("environment", {"block_size": 32}, {"VLLM_USE_AOT_COMPILE": "0"},
     "environment VLLM_USE_AOT_COMPILE: node '1', pod '0'"),
    ("model setting", {"block_size": 32}, {"STAND_IN_MAX_MODEL_LEN": "8192"},
     "vLLM config model_config.max_model_len: node 4096, pod 8192"),
    ("block size", {"block_size": 32}, {"STAND_IN_BLOCK_SIZE": ""}, "vLLM config cache_config: its hash differs"),
    ("vLLM version", {"block_size": 32, "vllm_version": "0.24.0"}, {}, "vLLM version: node 0.24.0, pod 0.25.0"),
    ("traced source", {"block_size": 32, "traced_files": "TRACED"}, {}, "traced source {traced}: not on this pod"),
])
def test_each_differing_factor_is_named_and_the_boot_compiles_as_without(server, tmp_path, node_signing_key,
                                                                         case, node, pod, named):
    traced = tmp_path / "site" / "llama.py"
    if node.get("traced_files") == "TRACED":  # on the node when it was harvested, not on the pod
        traced.parent.mkdir()
        traced.write_text("class LlamaModel: ...\n")
        node = {**node, "traced_files": [str(traced)]}
    push_warm_run(server, tmp_path, node_signing_key, **node)
    traced.unlink(missing_ok=True)
    seen, log = run_engine(tmp_path, **pod_env(tmp_path, server, **pod))
    assert seen["inspect_model"] == {"cached": True}  # the rest of the warm state is installed all the same
    assert seen["compile"] == {"backbone": False, "aot": False}
    lines = tunecache_lines(log, attestation=True)
    [skipped] = [line for line in lines if "compile cache not installed" in line]
    # another engine variant (tests/e2e/test_engine_variants.py) is said so; a traced source is no variant's
    said = ("vLLM would not use it: " if case == "traced source"
            else "vLLM will compile: no warm state is stored for this engine variant (")
    assert skipped.startswith("tunecache: compile cache not installed, " + said)
    assert named.format(traced=traced) in skipped
    assert lines[-1] == "tunecache: this boot compiled 1 triton_kernels (rank 0)"


@pytest.mark.parametrize("pod, found", [
    ({}, "verification boot: compiled nothing, ready in "),
    ({"VLLM_USE_AOT_COMPILE": "0"}, "verification boot still compiled 1 triton_kernels (ready in "),
])
def test_a_verification_boot_installs_the_stored_run_as_a_pod_would_and_says_whether_it_boots_clean(
        server, tmp_path, node_signing_key, monkeypatch, pod, found):
    """What ``tune --warmup vllm`` does after it recorded its run: a new engine process with
    every cache empty, the plugin fetching the run from the service (trusting the node's
    own key), its attestation stored with the run."""
    from tunecache.store.http import TunecacheClient
    from tunecache.service.tuner.stages import TuneSpec
    from tunecache.service.tuner.verification import shown, verify_run
    from tunecache.signing import format_public_key

    run = push_warm_run(server, tmp_path, node_signing_key, block_size=32)
    node = worker_env(tmp_path, **{"STAND_IN_BLOCK_SIZE": "32", "VLLM_USE_AOT_COMPILE": "1", **pod})
    for name in ("PYTHONPATH", "TUNECACHE_ENVIRONMENT_FILE", "TUNECACHE_ATTEMPTS", "STAND_IN_BLOCK_SIZE",
                 "VLLM_USE_AOT_COMPILE"):
        monkeypatch.setenv(name, node[name])
    monkeypatch.delenv("TUNECACHE_TRUSTED_KEYS")  # the node gives its own key, as tune does
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "node-triton"))  # the node's own: the boot gets an empty one
    spec = TuneSpec(deployment=h200_key().deployment(), hf_config=json.loads(LLAMA_CONFIG.read_text()), warmup="vllm")
    verification = verify_run(spec, server, tmp_path / "verify", 120,
                              trusted_keys=format_public_key(node_signing_key.public_key()))
    log = (tmp_path / "verify" / "verification.log").read_text()
    assert verification.error is None, log
    assert f"tunecache: warm state of run {run} installed for meta-llama/Llama-3.1-8B" in log
    assert verification.clean is (not pod) and verification.ready_s is not None
    assert shown(verification).startswith(found)
    assert not (tmp_path / "node-triton").exists()  # its caches were its own, all empty at the start
    with TunecacheClient(server, token=admin_token()) as client:
        stored = client.record_verification(run, verification)
    assert stored.verification == verification
    assert as_admin.get(f"{server}/v1/tunings/{run}").json()["verification"]["compiled"] == {
        kind.value: n for kind, n in verification.compiled.items()}


def test_a_verification_boot_that_cannot_boot_says_why(server, tmp_path, monkeypatch):
    from tunecache.service.tuner.stages import TuneSpec
    from tunecache.service.tuner.verification import shown, verify_run

    monkeypatch.setenv("PYTHONPATH", "")  # no vllm at all on this "node"
    spec = TuneSpec(deployment=h200_key().deployment(), hf_config=json.loads(LLAMA_CONFIG.read_text()), warmup="vllm")
    verification = verify_run(spec, server, tmp_path / "verify", 120)
    assert not verification.clean and verification.error.startswith("ModuleNotFoundError: No module named 'vllm'")
    assert shown(verification) == f"verification boot failed: {verification.error}"


def test_a_key_known_only_from_vllms_config_installs_after_the_inspection(server, tmp_path, node_signing_key):
    push_warm_run(server, tmp_path, node_signing_key, block_size=32)
    seen, log = run_engine(tmp_path, **pod_env(tmp_path, server, STAND_IN_MNBT=""))
    assert seen["inspect_model"] == {"cached": False} and seen["compile"] == {"backbone": True, "aot": True}
    first = tunecache_lines(log, attestation=True)[0]
    assert first.endswith("(max_num_batched_tokens was not given to vLLM, so the key was known only after vLLM "
                          "inspected the model)")
    assert tunecache_lines(log, attestation=True)[-1] == "tunecache: this boot compiled 1 model_inspections (rank 0)"


def test_without_trusted_keys_no_warm_state_is_installed(server, tmp_path, node_signing_key, monkeypatch):
    push_warm_run(server, tmp_path, node_signing_key, block_size=32)
    monkeypatch.delenv("TUNECACHE_TRUSTED_KEYS")
    seen, log = run_engine(tmp_path, **pod_env(tmp_path, server))
    assert seen["inspect_model"] == {"cached": False} and seen["compile"] == {"backbone": False, "aot": False}
    assert tunecache_lines(log, attestation=True)[0].startswith("tunecache: no warm state installed (")
    assert "install only from a run signed by a trusted key" in tunecache_lines(log, attestation=True)[0]
    assert not (tmp_path / "pod-triton" / "HASHB").exists()


def test_an_init_container_pulls_the_warm_state_under_the_nodes_names(server, tmp_path, node_signing_key, monkeypatch):
    """``tunecache pull --warm-state``: no vLLM config to compute from, so the compile cache keeps
    the node's directory names (found by a pod whose factors are the node's)."""
    from tunecache.client.warm_state import read_compile_factors
    from tests.support.cli import pull

    push_warm_run(server, tmp_path, node_signing_key, block_size=32)
    root, triton = tmp_path / "init" / "vllm-cache", tmp_path / "init" / "triton"
    pulled = pull(server, tmp_path / "init" / "file", CUDNN_FILE, "--warm-state", "--vllm-cache-root", str(root),
                  "--triton-cache-dir", str(triton))
    assert pulled.returncode == 0, pulled.stderr
    assert "tunecache: warm state installed: Triton cache (1 kernels), modelinfos (1 files), compile cache (2 of 2 " \
           "directories)" in pulled.stderr
    factors = read_compile_factors((tmp_path / "harvest" / "vllm-compile-cache.tar.gz").read_bytes())
    assert (root / "torch_compile_cache" / factors.backbone_dir / "rank_0_0" / "backbone").is_dir()
    assert (root / "torch_compile_cache" / "torch_aot_compile" / factors.aot_dir / "rank_0_0" / "model").is_file()
    assert (root / "modelinfos").is_dir() and (triton / "HASHB" / "_fwd_kernel.cubin").is_file()
    monkeypatch.delenv("TUNECACHE_TRUSTED_KEYS")
    unsigned = pull(server, tmp_path / "plain" / "file", CUDNN_FILE, "--warm-state", "--vllm-cache-root",
                    str(tmp_path / "plain" / "root"))
    assert unsigned.returncode == 0 and "warm state installed: none" in unsigned.stderr
    assert not (tmp_path / "plain" / "root").exists()


def test_pull_warm_state_installs_the_deep_gemm_cache_as_the_plugin_does(server, tmp_path, node_signing_key,
                                                                         monkeypatch):
    """``tunecache pull --warm-state`` takes the plugin's path over the registered destinations:
    the run's DeepGEMM kernels go into this pod's DeepGEMM cache directory (``DG_JIT_CACHE_DIR``),
    as the plugin's main process puts them (before, an init container's pull left them out)."""
    from tests.e2e.test_vllm_plugin import push_deep_gemm_run
    from tests.support.cli import pull

    push_deep_gemm_run(server, node_signing_key)
    cache = tmp_path / "init" / "deep_gemm"
    monkeypatch.setenv("DG_JIT_CACHE_DIR", str(cache))
    pulled = pull(server, tmp_path / "init" / "file", CUDNN_FILE, "--warm-state", "--vllm-cache-root",
                  str(tmp_path / "init" / "vllm-cache"), "--triton-cache-dir", str(tmp_path / "init" / "triton"))
    assert pulled.returncode == 0, pulled.stderr
    assert (cache / "cache" / "kernel.abc" / "kernel.cubin").read_bytes() == b"cubin"
    assert "DeepGEMM cache (1 kernels)" in pulled.stderr


def test_pull_warm_state_installs_the_tilelang_cute_dsl_and_tvm_ffi_caches(server, tmp_path, node_signing_key,
                                                                           monkeypatch):
    """``tunecache pull --warm-state`` installs the JIT caches vLLM 0.33/0.34's warmup fills, each
    harvested from where the tuner pointed its package, signed, and merged into the directory the
    package computes on a pod with another HOME and TMPDIR (no caller names the kinds)."""
    from tests.support.cli import pull
    from tests.unit.client.client.test_jit_caches import FILES, VARIABLES, tuner_scratch
    from tunecache.service.tuner.vllm_warmup import harvest_warm_state

    out = tmp_path / "harvest"
    out.mkdir()
    artifacts, _ = harvest_warm_state(tuner_scratch(tmp_path), out)
    payload = run_payload(CUDNN_FILE, h200_key())
    for blob in [CUDNN_FILE.read_bytes()] + [(out / a.path).read_bytes() for a in artifacts]:
        assert as_admin.put(f"{server}/v1/artifacts/{hashlib.sha256(blob).hexdigest()}", content=blob).status_code in (200, 201)
    payload["artifacts"] += [{"kind": a.kind, "name": a.name, "media_type": a.media_type,
                              "sha256": hashlib.sha256((out / a.path).read_bytes()).hexdigest()} for a in artifacts]
    assert as_admin.post(f"{server}/v1/tunings", json=signed(payload, node_signing_key)).status_code == 201
    for variable in VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    home, tmp = tmp_path / "pod-home", tmp_path / "pod-tmp"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setenv("USER", "podder")
    pulled = pull(server, tmp_path / "init" / "file", CUDNN_FILE, "--warm-state", "--vllm-cache-root",
                  str(tmp_path / "init" / "vllm-cache"), "--triton-cache-dir", str(tmp_path / "init" / "triton"))
    assert pulled.returncode == 0, pulled.stderr
    assert "TileLang cache (2 files), CuTe DSL cache (1 files), TVM-FFI cache (2 files)" in pulled.stderr
    installed = {"TILELANG_CACHE_DIR": home / ".tilelang" / "cache",
                 "CUTE_DSL_CACHE_DIR": tmp / "podder" / "cutlass_python_cache",
                 "TVM_FFI_CACHE_DIR": home / ".cache" / "tvm-ffi"}
    for variable, files in FILES.items():
        for name, body in files.items():
            assert (installed[variable] / name).read_bytes() == body
    verdicts = _doctor(server, tmp_path, os.environ.get("PYTHONPATH", ""))  # said before the boot, each where it goes
    for kind, variable in (("tilelang_cache", "TILELANG_CACHE_DIR"), ("cute_dsl_cache", "CUTE_DSL_CACHE_DIR"),
                           ("tvm_ffi_cache", "TVM_FFI_CACHE_DIR")):
        assert verdicts[kind] == f"{kind}: loads: merged into {installed[variable]}, file by file"
    monkeypatch.delenv("TUNECACHE_TRUSTED_KEYS")  # unsigned for this pod: none of it
    shutil.rmtree(home)
    unsigned = pull(server, tmp_path / "plain" / "file", CUDNN_FILE, "--warm-state", "--vllm-cache-root",
                    str(tmp_path / "plain" / "root"))
    assert unsigned.returncode == 0 and "warm state installed: none" in unsigned.stderr
    assert not (home / ".tilelang").exists() and not (home / ".cache" / "tvm-ffi").exists()


def test_a_pod_with_another_home_gets_the_compile_cache_under_the_names_its_own_home_gives(server, tmp_path,
                                                                                       node_signing_key):
    """vLLM 0.25 hashes VLLM_CONFIG_ROOT (default ~/.config/vllm) into both directory names:
    a pod with another HOME (another user) computed other names and compiled everything."""
    push_warm_run(server, tmp_path, node_signing_key, block_size=32)
    home = tmp_path / "pod-home"
    home.mkdir()
    seen, log = run_engine(tmp_path, **pod_env(tmp_path, server, HOME=str(home)))
    assert seen["compile"] == {"backbone": True, "aot": True}, log
    assert tunecache_lines(log, attestation=True)[-1] == "tunecache: this boot compiled nothing (rank 0): at the floor"


def test_without_triton_cache_dir_inductor_finds_the_kernels_the_compile_cache_bundles(server, tmp_path,
                                                                                     node_signing_key):
    """With TRITON_CACHE_DIR unset, vLLM 0.25 points Inductor's cache into the AOT directory it
    loads and Inductor writes the Triton kernels its artifact bundles under it (19 kernels in
    each such boot on the H200, 2026-12-03): the plugin points TRITON_CACHE_DIR at the Triton
    cache it installed (Triton's own default), where Inductor then finds them."""
    push_warm_run(server, tmp_path, node_signing_key, block_size=32)
    home = tmp_path / "pod-home"
    home.mkdir()
    env = pod_env(tmp_path, server, HOME=str(home))
    del env["TRITON_CACHE_DIR"]
    seen, log = run_engine(tmp_path, **env)
    assert seen["compile"] == {"backbone": True, "aot": True}, log
    assert (home / ".triton" / "cache" / "HASHB" / "_fwd_kernel.cubin").is_file()  # Triton's default under this HOME
    assert not list((tmp_path / "vllm-cache").rglob("inductor_cache/triton")), log
    assert tunecache_lines(log, attestation=True)[-1] == "tunecache: this boot compiled nothing (rank 0): at the floor"


def _model_source(prefix):
    source = prefix / "tc_model_src" / "llama_src.py"
    source.parent.mkdir(parents=True)
    (source.parent / "__init__.py").write_text("")
    source.write_text("class LlamaForCausalLM:\n    def forward(self, x):\n        return x\n")
    return source


@pytest.mark.parametrize("node_prefix_left", [True, False])
def test_a_pod_whose_packages_live_under_another_prefix_gets_the_compile_cache_under_its_own_code_hash(
        server, tmp_path, node_signing_key, node_prefix_left):
    """The traced sources are found where the pod imports them from (also while the node's
    path exists on the same machine: a copied site), and their bytes checked; the backbone
    directory is named by the code hash over the pod's own paths, as its vLLM computes it."""
    node_file = _model_source(tmp_path / "node-prefix")
    _model_source(tmp_path / "pod-prefix")
    push_warm_run(server, tmp_path, node_signing_key, block_size=32, traced_files=[str(node_file)])
    if not node_prefix_left:
        node_file.unlink()
    python_path = os.pathsep.join([str(tmp_path / "pod-prefix"), str(tmp_path / "stand_in"),
                                   os.environ.get("PYTHONPATH", "")])
    seen, log = run_engine(tmp_path, **pod_env(tmp_path, server, PYTHONPATH=python_path,
                                               STAND_IN_TRACED_MODULES="tc_model_src.llama_src"))
    assert seen["compile"] == {"backbone": True, "aot": True}, log
    assert tunecache_lines(log, attestation=True)[-1] == "tunecache: this boot compiled nothing (rank 0): at the floor"


def test_a_traced_source_changed_under_the_pods_prefix_is_named(server, tmp_path, node_signing_key):
    node_file = _model_source(tmp_path / "node-prefix")
    changed = _model_source(tmp_path / "pod-prefix")
    changed.write_text(changed.read_text() + "# patched in the pod's image\n")
    push_warm_run(server, tmp_path, node_signing_key, block_size=32, traced_files=[str(node_file)])
    python_path = os.pathsep.join([str(tmp_path / "pod-prefix"), str(tmp_path / "stand_in"),
                                   os.environ.get("PYTHONPATH", "")])
    seen, log = run_engine(tmp_path, **pod_env(tmp_path, server, PYTHONPATH=python_path,
                                               STAND_IN_TRACED_MODULES="tc_model_src.llama_src"))
    assert seen["compile"] == {"backbone": False, "aot": False}
    [skipped] = [line for line in tunecache_lines(log) if "compile cache not installed" in line]
    assert f"traced source {node_file}: its content differs" in skipped


def _doctor(server, tmp_path, python_path, **env):
    """``tunecache doctor`` on a pod whose packages are ``python_path`` (the stand-in vLLM among them)."""
    import subprocess

    from tests.support.cli import tunecache_executable

    full = {**os.environ, "PYTHONPATH": python_path, "VLLM_USE_AOT_COMPILE": "1",
            "VLLM_CACHE_ROOT": str(tmp_path / "doctor-vllm-cache"), **env}
    for name in [name for name, value in env.items() if value is None]:
        full.pop(name)
    result = subprocess.run([tunecache_executable(), "doctor", "--server", server, "--model", "meta-llama/Llama-3.1-8B",
                             "--max-num-batched-tokens", "8192", "--environment", str(CUDNN_FILE)],
                            env=full, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    verdicts = lines[lines.index(next(line for line in lines if line.startswith("what run "))) + 1:]
    return {line.strip().split(":")[0]: line.strip() for line in verdicts}


@pytest.mark.parametrize("case", ["same", "other prefix", "changed source", "environment", "untrusted"])
def test_doctor_tells_before_the_boot_what_each_kind_will_do_on_this_pod(server, tmp_path, node_signing_key, case):
    """The check before the boot compares with the pod's own paths and values: the prefix case
    said "installed" once and vLLM compiled anyway; a changed source under the pod's prefix, or
    another vLLM environment factor, is named before any boot."""
    from tests.support.vllm_stand_in import write_stand_in

    stand_in = write_stand_in(tmp_path)
    node_file = _model_source(tmp_path / "node-prefix")
    pod_file = _model_source(tmp_path / "pod-prefix")
    if case == "changed source":
        pod_file.write_text(pod_file.read_text() + "# patched in the pod's image\n")
    push_warm_run(server, tmp_path, node_signing_key, block_size=32, traced_files=[str(node_file)])
    prefix = tmp_path / ("node-prefix" if case == "same" else "pod-prefix")
    env = {"VLLM_USE_AOT_COMPILE": "0"} if case == "environment" else {}
    if case == "untrusted":
        env["TUNECACHE_TRUSTED_KEYS"] = None
    verdicts = _doctor(server, tmp_path, os.pathsep.join([str(prefix), str(stand_in), os.environ.get("PYTHONPATH", "")]),
                       **env)
    assert verdicts["flashinfer_autotune_v1"].startswith("flashinfer_autotune_v1: loads: ")
    compiled = verdicts["vllm_compile_cache"]
    if case == "untrusted":
        assert all(v.endswith("installs only from a run signed by a trusted key, and TUNECACHE_TRUSTED_KEYS is not set")
                   for kind, v in verdicts.items() if kind != "flashinfer_autotune_v1")
    elif case == "changed source":
        assert compiled.startswith("vllm_compile_cache: will not load: vLLM would compute other directory names: ")
        assert f"traced source {pod_file}: its content differs" in compiled
    elif case == "environment":
        assert "environment VLLM_USE_AOT_COMPILE: node '1', pod '0'" in compiled
    else:
        assert compiled.startswith("vllm_compile_cache: depends on the engine: vLLM version, environment and traced "
                                   "sources match")
        assert ("1 traced sources found under this pod's own package prefix" in compiled) is (case == "other prefix")
        assert verdicts["triton_cache"].startswith("triton_cache: loads: merged into ")
        assert verdicts["vllm_modelinfos"] == f"vllm_modelinfos: loads: into {tmp_path / 'doctor-vllm-cache' / 'modelinfos'}"


def test_kinds_built_with_another_triton_or_torch_are_left_out_and_named(server, tmp_path, node_signing_key):
    """A package bump drops what was built with the old one (tokenspeed#1033): the run records
    its torch, Triton and TVM-FFI; the Triton cache and the compile cache of another Triton are
    not installed, and both say why; the model inspections still are."""
    from tunecache.formats.dependencies import installed_versions

    here = installed_versions()
    push_warm_run(server, tmp_path, node_signing_key, block_size=32,
                  dependencies={**here, "triton": "0.0.1-the-tuners"})
    seen, log = run_engine(tmp_path, **pod_env(tmp_path, server))
    assert seen["inspect_model"] == {"cached": True} and seen["compile"] == {"backbone": False, "aot": False}
    [first] = [line for line in tunecache_lines(log) if line.startswith("tunecache: warm state of run ")]
    said = f"triton: node 0.0.1-the-tuners, pod {here['triton']}"
    assert f"Triton cache not installed, built with other packages ({said})" in first
    assert f"compile cache not installed, built with other packages ({said})" in first
    assert not (tmp_path / "pod-triton" / "HASHB").exists()
