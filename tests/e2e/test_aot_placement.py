"""vLLM 0.34's compile cache through the plugin, with the stand-in vLLM in 0.34's layout at the
edge (tests/support/vllm_stand_in_aot.py): a run harvested from a 0.34 tuning node's scratch
(each rank's AOT artifact and the device index it compiled on), recorded signed, and a stand-in
engine booting from zero whose compiled model calls ``_try_load_aot_compiled_fn(self, path)``
as 0.34's does. Checked: the artifact is placed at the path vLLM loads whatever the pod's HOME,
user, cache directory, package prefix, model path or CUDA_HOME; a rank on another device index
is refused, named; an engine variant and what torch's SystemInfo refuses are named."""

from __future__ import annotations

import hashlib
import shutil

import pytest

from tests.support.builders import h200_key, run_payload, signed
from tests.support.paths import CUDNN_FILE
from tests.support.serve import as_admin
from tests.support.vllm_stand_in import tunecache_lines
from tests.support.vllm_stand_in_aot import AOT, CALL_LINES, aot_node_scratch, run_aot_engine

SERVER_DATABASE_INCIDENTAL = True


def push_aot_run(server, tmp_path, signing_key, ranks, variant=False, **env) -> int:
    from tunecache.engines.vllm.compile_cache import VariantFactors
    from tunecache.service.tuner.vllm_warmup import harvest_warm_state

    scratch = aot_node_scratch(tmp_path, "/node/work/model", ranks, variant=variant, **env)
    out = tmp_path / f"harvest-{len(list(tmp_path.glob('harvest*')))}"
    out.mkdir()
    artifacts, summary = harvest_warm_state(scratch, out)
    shutil.rmtree(scratch)  # gone, as a tuning job's scratch is
    assert summary["aot"]["ranks"][0]["device_index"] == ranks[0]
    factors = summary.get("variant_factors")
    payload = run_payload(CUDNN_FILE, h200_key(),
                          variant=VariantFactors.model_validate(factors).variant if factors else None)
    for blob in [CUDNN_FILE.read_bytes()] + [(out / a.path).read_bytes() for a in artifacts]:
        assert as_admin.put(f"{server}/v1/artifacts/{hashlib.sha256(blob).hexdigest()}", content=blob).status_code in (200, 201)
    payload["artifacts"] += [{"kind": a.kind, "name": a.name, "media_type": a.media_type,
                              "sha256": hashlib.sha256((out / a.path).read_bytes()).hexdigest()} for a in artifacts]
    payload["summary"]["vllm_compile"] = summary
    if env.get("STAND_IN_MAX_MODEL_LEN"):  # tuned for that engine variant (tune --engine-args)
        payload["summary"]["engine_args"] = {"max_model_len": int(env["STAND_IN_MAX_MODEL_LEN"])}
    answer = as_admin.post(f"{server}/v1/tunings", json=signed(payload, signing_key))
    assert answer.status_code == 201, answer.text
    return answer.json()["id"]


def pod_env(tmp_path, server, **env):
    return {"TUNECACHE_URL": server, "STAND_IN_MODEL": "/models/llama", "STAND_IN_MNBT": "8192",
            "STAND_IN_BLOCK_SIZE": "32", "VLLM_USE_AOT_COMPILE": "1", "HOME": str(tmp_path / "pod-home"),
            "TRITON_CACHE_DIR": str(tmp_path / "pod-triton"), **env}


def test_the_stand_ins_call_is_made_of_0_34s_own_lines():
    from tests.support.vllm_wheels import release_wheel, wheels_dir

    source = release_wheel(wheels_dir(), "0.34.0").read("vllm/compilation/decorators.py").decode()  # downloaded when missing
    assert all(line in source for line in CALL_LINES)
    assert all(line in AOT["vllm/compilation/decorators.py"] for line in CALL_LINES)


@pytest.mark.parametrize("setup", ["another HOME and user's cache directory", "another package prefix"])
def test_the_artifact_is_placed_where_the_pods_vllm_loads_it(server, tmp_path, node_signing_key, setup):
    run = push_aot_run(server, tmp_path, node_signing_key, {0: 0}, CUDA_HOME="/usr/local/cuda-12.9")
    env = pod_env(tmp_path, server, CUDA_HOME="/opt/cuda", VLLM_CACHE_ROOT=str(tmp_path / "elsewhere" / "vllm"))
    if setup == "another package prefix":  # the same stand-in vLLM under another directory
        shutil.copytree(tmp_path / "stand_in", tmp_path / "prefix2" / "site-packages")
        env["PYTHONPATH"] = str(tmp_path / "prefix2" / "site-packages")
    seen, log = run_aot_engine(tmp_path, **env)
    assert seen["aot"]["loaded"] is True, log
    assert seen["aot"]["path"].startswith(str(tmp_path / "elsewhere" / "vllm" / "torch_compile_cache" / "torch_aot_compile"))
    assert seen["aot"]["inductor"] == ["fxgraph"]  # its Inductor cache beside it
    [line] = [li for li in tunecache_lines(log) if li.startswith("tunecache: compile cache")]
    assert line.startswith(f"tunecache: compile cache from run {run}: the artifact rank 0 compiled on cuda:0 placed at "
                           f"{seen['aot']['path']}, 1 Inductor cache entries beside it (rank 0, cuda:0, ")
    # named, though vLLM's own name for the directory made it no miss
    assert "CUDA_HOME: tuner \"/usr/local/cuda-12.9\", pod \"/opt/cuda\"" in line
    assert "vLLM config model.model: tuner \"/node/work/model\", pod \"/models/llama\"" in line


def test_a_rank_on_another_device_index_is_refused_and_said_why(server, tmp_path, node_signing_key):
    run = push_aot_run(server, tmp_path, node_signing_key, {0: 0})
    seen, log = run_aot_engine(tmp_path, **pod_env(tmp_path, server, STAND_IN_DEVICE_INDEX="1"))
    assert seen["aot"]["loaded"] is False and "aot_load_failed" not in seen  # compiled, never loaded a foreign one
    [line] = [li for li in tunecache_lines(log) if "AOT" in li]
    assert (f"run {run}'s AOT artifact is not this worker's: rank 0 was compiled on cuda:0 and runs on cuda:1 here"
            in line), line


def test_one_artifact_for_all_ranks_loads_on_any_index_with_compile_on_one_rank(server, tmp_path, node_signing_key):
    push_aot_run(server, tmp_path, node_signing_key, {0: 0}, VLLM_COMPILE_ON_ONE_RANK="1")
    seen, log = run_aot_engine(tmp_path, **pod_env(tmp_path, server, STAND_IN_DEVICE_INDEX="0",
                                                   VLLM_COMPILE_ON_ONE_RANK="1"))
    assert seen["aot"]["loaded"] is True, log
    assert "its one artifact for all ranks (VLLM_COMPILE_ON_ONE_RANK=1 on both sides)" in log


@pytest.mark.parametrize("pod, named", [
    ({"STAND_IN_MAX_MODEL_LEN": "8192"}, "vLLM config model.max_model_len: tuner 4096, pod 8192"),
    ({"STAND_IN_GPU_NAME": "NVIDIA H100 NVL"},
     "torch's SystemInfo would refuse it: GPU: tuner \"NVIDIA H200\", pod \"NVIDIA H100 NVL\""),
])
def test_an_engine_variant_or_what_torch_refuses_is_named(server, tmp_path, node_signing_key, pod, named):
    push_aot_run(server, tmp_path, node_signing_key, {0: 0})
    seen, log = run_aot_engine(tmp_path, **pod_env(tmp_path, server, **pod))
    assert seen["aot"]["loaded"] is False
    [line] = [li for li in tunecache_lines(log) if "AOT" in li]
    assert named in line, line


def test_a_pod_of_another_engine_variant_gets_that_variants_artifact(server, tmp_path, node_signing_key, database_url):
    """vLLM 0.34 has no ``compute_hash()``: the variant comes from ``VllmConfig.compile_factors()``
    field by field, so a run tuned with another ``max_model_len`` is another variant, and a pod
    booted with it fetches that variant's run and places its artifact."""
    from tests.support.builders import stored_reports

    default = push_aot_run(server, tmp_path, node_signing_key, {0: 0}, variant=True)
    longer = push_aot_run(server, tmp_path, node_signing_key, {0: 0}, variant=True, STAND_IN_MAX_MODEL_LEN="8192")
    runs = {r["id"]: r for r in as_admin.get(f"{server}/v1/tunings").json()["items"]}
    assert runs[default]["variant"] and runs[longer]["variant"] and runs[default]["variant"] != runs[longer]["variant"]
    seen, log = run_aot_engine(tmp_path, **pod_env(tmp_path, server, STAND_IN_MAX_MODEL_LEN="8192"))
    assert seen["aot"]["loaded"] is True, log
    [line] = [li for li in tunecache_lines(log) if li.startswith("tunecache: compile cache")]
    assert line.startswith(f"tunecache: compile cache from run {longer} (engine variant {runs[longer]['variant']}): "
                           f"the artifact rank 0 compiled on cuda:0 placed at {seen['aot']['path']}"), line
    [report] = stored_reports(database_url, 1)
    assert report.variant == runs[longer]["variant"] and report.variant_missing is False


def test_a_pod_whose_variant_has_no_run_names_the_field_and_reports_it_missing(server, tmp_path, node_signing_key,
                                                                               database_url):
    from tests.support.builders import stored_reports

    run = push_aot_run(server, tmp_path, node_signing_key, {0: 0}, variant=True)
    seen, log = run_aot_engine(tmp_path, **pod_env(tmp_path, server, STAND_IN_MAX_MODEL_LEN="8192"))
    assert seen["aot"]["loaded"] is False
    [line] = [li for li in tunecache_lines(log) if li.startswith("tunecache: compile cache")]
    assert "compile cache not installed, vLLM will compile: no warm state is stored for this engine variant (" in line
    assert f"run {run} is variant " in line and "vLLM config model.max_model_len: node 4096, pod 8192" in line, line
    assert "reported to the service as missing (rank 0, cuda:0)" in line
    [report] = stored_reports(database_url, 1)
    assert report.variant_missing is True and len(report.variant) == 16
