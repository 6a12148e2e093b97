"""Images never displace each other: a fleet upgraded node by node runs two images (other torch
and Triton, the same FlashInfer environment) at once. Runs harvested from a tuning node's
scratch and recorded signed, each with the package versions of its image; stand-in engines
(tests/support/vllm_stand_in.py) booting from zero on this machine's image (its own torch,
Triton and TVM-FFI versions).

Checked: the pods of each image get their own image's current run whichever was recorded last,
the compile cache and Triton's kernels in place; a pod of an image with no run gets the kinds
that do not depend on the versions, reports the others missing, and the fleet view counts it.
"""

from __future__ import annotations

from tests.e2e.test_warm_state import pod_env, push_warm_run
from tests.support.builders import file_environment, h200_key, stored_reports
from tests.support.paths import CUDNN_FILE
from tests.support.serve import as_admin
from tests.support.vllm_stand_in import run_engine, tunecache_lines

# What this module tests happens on the pod: its server runs on SQLite only (tests/conftest.py).
SERVER_DATABASE_INCIDENTAL = True


def other_image(here: dict) -> dict:
    """The package versions of a newer image than this machine's: other torch and Triton."""
    return {**here, "torch": "99.0.0-new-image", "triton": "99.0.0-new-image"}


def push_from_node(server, tmp_path, name, signing_key, dependencies) -> int:
    node = tmp_path / name
    node.mkdir()
    return push_warm_run(server, node, signing_key, block_size=32, dependencies=dependencies)


def lookup(server, dependencies=None):
    body = {"key": h200_key().model_dump(), "environment": file_environment(CUDNN_FILE).model_dump(),
            **({"dependencies": dependencies} if dependencies else {})}
    return as_admin.post(f"{server}/v1/tunings/lookup", json=body)


def test_each_images_pods_get_their_own_runs_compile_cache_and_triton_cache(server, tmp_path, node_signing_key,
                                                                           database_url):
    from tunecache.formats.dependencies import installed_versions

    here = installed_versions()
    ours = push_from_node(server, tmp_path, "old-node", node_signing_key, here)
    theirs = push_from_node(server, tmp_path, "new-node", node_signing_key, other_image(here))
    assert lookup(server).json()["id"] == theirs  # the key's current run: the newest
    assert lookup(server, other_image(here)).json()["id"] == theirs
    assert lookup(server, here).json()["id"] == ours
    seen, log = run_engine(tmp_path, **pod_env(tmp_path, server))
    assert seen["inspect_model"] == {"cached": True} and seen["compile"] == {"backbone": True, "aot": True}
    [first] = [line for line in tunecache_lines(log) if line.startswith("tunecache: warm state of run ")]
    assert first.startswith(f"tunecache: warm state of run {ours} installed") and "other packages" not in first
    assert (tmp_path / "pod-triton" / "HASHB").exists()
    [report] = stored_reports(database_url, 1)
    assert report.run_id == ours and report.missing_kinds is None


def test_a_pod_of_an_image_without_a_run_reports_the_kinds_it_left_out_and_the_fleet_counts_them(
        server, tmp_path, node_signing_key, database_url):
    from tunecache.formats.dependencies import installed_versions

    here = installed_versions()
    theirs = push_from_node(server, tmp_path, "new-node", node_signing_key, other_image(here))
    seen, log = run_engine(tmp_path, **pod_env(tmp_path, server))
    assert seen["inspect_model"] == {"cached": True}  # what depends on no package version, installed
    assert seen["compile"] == {"backbone": False, "aot": False}
    assert not (tmp_path / "pod-triton" / "HASHB").exists()
    [report] = stored_reports(database_url, 1)
    assert report.run_id == theirs and report.missing_kinds == "triton_cache,vllm_compile_cache"
    [row] = as_admin.get(f"{server}/v1/fleet").json()["keys"]
    assert row["installed"] == 1 and row["missing"] == 1
    assert row["missing_kinds"] == {"triton_cache": 1, "vllm_compile_cache": 1}
