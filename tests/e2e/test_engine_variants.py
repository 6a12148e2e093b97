"""Engine variants of a key (another ``max_model_len``, compilation setting, vLLM environment
factor): each is its own warm state. A stand-in `vllm` at the edge (tests/support/vllm_stand_in.py):
runs harvested from a tuning node's scratch and recorded signed, stand-in engines booting from
zero.

Checked: the service keeps a current run per variant beside the key's; a pod of another
variant installs the key's run but for its compile cache and then that variant's compile
cache; a pod whose variant has none names how it differs field by field, reports the variant
as missing with the engine arguments that name it, and the fleet view's wanted variants show
it; ``retune --engine-args`` queues a vLLM warmup of the variant.
"""

from __future__ import annotations

import pytest

from tests.e2e.test_warm_state import pod_env, push_warm_run
from tests.support.builders import h200_key, stored_reports
from tests.support.paths import CUDNN_FILE
from tests.support.serve import as_admin
from tests.support.vllm_stand_in import run_engine, tunecache_lines

# What this module tests happens on the pod: its server runs on SQLite only (tests/conftest.py).
SERVER_DATABASE_INCIDENTAL = True


def lookup(server, variant=None):
    from tunecache.formats.autotune_file import parse_autotune_file

    environment = parse_autotune_file(CUDNN_FILE.read_bytes()).environment.model_dump()
    body = {"key": h200_key().model_dump(), "environment": environment, **({"variant": variant} if variant else {})}
    return as_admin.post(f"{server}/v1/tunings/lookup", json=body)


def test_the_service_keeps_a_current_run_per_variant_beside_the_keys(server, tmp_path, node_signing_key):
    default = push_warm_run(server, tmp_path, node_signing_key, block_size=32)
    longer = push_warm_run(server, tmp_path, node_signing_key, block_size=32, max_model_len=8192)
    runs = {r["id"]: r for r in as_admin.get(f"{server}/v1/tunings").json()["items"]}
    assert runs[default]["variant"] != runs[longer]["variant"] and len(runs[longer]["variant"]) == 16
    # the key's current run stays the one tuned with the node's own engine arguments
    assert runs[default]["is_current"] and not runs[longer]["is_current"]
    assert lookup(server).json()["id"] == default
    assert lookup(server, runs[default]["variant"]).json()["id"] == default  # each variant's own
    assert lookup(server, runs[longer]["variant"]).json()["id"] == longer
    assert lookup(server, "0" * 16).json()["id"] == default  # a variant with none: the key's, which says its own
    assert lookup(server, "not-a-variant").status_code == 422


def test_a_variant_tuned_first_is_the_keys_current_run_until_the_nodes_own_is_tuned(server, tmp_path, node_signing_key):
    longer = push_warm_run(server, tmp_path, node_signing_key, block_size=32, max_model_len=8192)
    assert lookup(server).json()["id"] == longer  # the key had none: its tactics serve every pod meanwhile
    default = push_warm_run(server, tmp_path, node_signing_key, block_size=32)
    assert lookup(server).json()["id"] == default
    assert lookup(server, lookup(server).json()["variant"]).json()["id"] == default


def test_a_pod_of_another_variant_gets_that_variants_compile_cache(server, tmp_path, node_signing_key, database_url):
    push_warm_run(server, tmp_path, node_signing_key, block_size=32)
    longer = push_warm_run(server, tmp_path, node_signing_key, block_size=32, max_model_len=8192)
    seen, log = run_engine(tmp_path, **pod_env(tmp_path, server, STAND_IN_MAX_MODEL_LEN="8192"))
    assert seen["inspect_model"] == {"cached": True} and seen["compile"] == {"backbone": True, "aot": True}
    lines = tunecache_lines(log, attestation=True)
    [installed] = [line for line in lines if line.startswith("tunecache: compile cache (2 of 2 directories")]
    assert f"from run {longer} (engine variant " in installed
    assert lines[-1] == "tunecache: this boot compiled nothing (rank 0): at the floor"
    [report] = stored_reports(database_url, 1)
    assert report.variant is not None and report.variant_missing is False


def test_a_pod_whose_variant_has_no_warm_state_names_the_field_and_reports_it_missing(server, tmp_path,
                                                                                     node_signing_key, database_url):
    run = push_warm_run(server, tmp_path, node_signing_key, block_size=32)
    seen, log = run_engine(tmp_path, **pod_env(tmp_path, server, STAND_IN_MAX_MODEL_LEN="8192"))
    assert seen["inspect_model"] == {"cached": True}  # the rest of the warm state all the same
    assert seen["compile"] == {"backbone": False, "aot": False}
    lines = tunecache_lines(log, attestation=True)
    [skipped] = [line for line in lines if "no warm state is stored for this engine variant" in line]
    assert f"run {run} is variant " in skipped
    assert "vLLM config model_config.max_model_len: node 4096, pod 8192" in skipped
    assert skipped.endswith("reported to the service as missing (rank 0)")
    [report] = stored_reports(database_url, 1)
    assert report.variant_missing is True and len(report.variant) == 16
    assert report.engine_args == {"max_model_len": 8192}
    fleet = as_admin.get(f"{server}/v1/fleet").json()
    [wanted] = fleet["wanted_variants"]
    assert wanted["variant"] == report.variant and wanted["engine_args"] == {"max_model_len": 8192}
    assert wanted["missing"] == 1 and wanted["current_run_id"] is None and wanted["key"] == h200_key().model_dump()
    [key] = fleet["keys"]
    assert [v["variant"] for v in key["variants"]] == [report.variant]


@pytest.mark.parametrize("pod, named", [
    ({"VLLM_USE_AOT_COMPILE": "0"}, "environment VLLM_USE_AOT_COMPILE: node '1', pod '0'"),
    ({"STAND_IN_BLOCK_SIZE": "64"}, "vLLM config cache_config: its hash differs"),
])
def test_each_reason_a_variant_differs_is_named(server, tmp_path, node_signing_key, pod, named):
    push_warm_run(server, tmp_path, node_signing_key, block_size=32)
    seen, log = run_engine(tmp_path, **pod_env(tmp_path, server, **pod))
    assert seen["compile"] == {"backbone": False, "aot": False}
    [skipped] = [line for line in tunecache_lines(log) if "no warm state is stored for this engine variant" in line]
    assert named in skipped


def test_with_auto_tune_on_a_missing_variant_is_queued_as_a_vllm_warmup_of_its_engine_args(database_url, tmp_path,
                                                                                            node_signing_key):
    """``TUNECACHE_AUTO_TUNE_VARIANTS=1``: the first pod boot that reports its variant missing,
    with a token of its own (``TUNECACHE_TOKEN``: reports without one never count), queues a
    tuning job of the key with the engine arguments the pod was booted with."""
    import time

    from tests.support.serve import start_server, stop_server

    process, server = start_server(database_url, tmp_path, "auto", TUNECACHE_AUTO_TUNE_VARIANTS="1")
    try:
        push_warm_run(server, tmp_path, node_signing_key, block_size=32)
        token = as_admin.post(f"{server}/v1/tokens", json={"name": "pods", "scope": "read"}).json()["token"]
        run_engine(tmp_path, **pod_env(tmp_path, server, STAND_IN_MAX_MODEL_LEN="8192", TUNECACHE_TOKEN=token))
        for _ in range(100):
            items = as_admin.get(f"{server}/v1/tuning-jobs").json()["items"]
            if items:
                break
            time.sleep(0.1)
        [job] = items
        assert job["status"] == "queued" and job["key"] == h200_key().model_dump()
        assert job["warmup"] == "vllm" and job["engine_args"] == {"max_model_len": 8192}
    finally:
        stop_server(process)


def test_promoting_an_older_run_of_a_variant_rolls_back_that_variant_only(server, tmp_path, node_signing_key):
    default = push_warm_run(server, tmp_path, node_signing_key, block_size=32)
    first = push_warm_run(server, tmp_path, node_signing_key, block_size=32, max_model_len=8192)
    (tmp_path / "again").mkdir()  # a re-tune of the variant
    second = push_warm_run(server, tmp_path / "again", node_signing_key, block_size=32, max_model_len=8192)
    variant = as_admin.get(f"{server}/v1/tunings/{second}").json()["variant"]
    assert lookup(server, variant).json()["id"] == second
    promoted = as_admin.post(f"{server}/v1/tunings/{first}/promote")
    assert promoted.status_code == 200, promoted.text
    assert lookup(server, variant).json()["id"] == first and lookup(server).json()["id"] == default
