"""FlashInfer JIT modules for a pod whose paths are not the tuning node's: installed into the
pod's own workspace and loaded through FlashInfer's AOT path, the real FlashInfer's
(``flashinfer.jit.env.get_aot_path``, which FlashInfer's ``JitSpec`` loads without ninja)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.support.jit import fake_workspace
from tests.support.torch_tests import IMPORTS_TORCH
from tunecache.client.jit_install import JitWorkspace
from tunecache.client.jit_install import AOT_DIR_NAME, build_aot_dir, use_aot_dir
from tunecache.formats.jit_module import jit_environment, module_tarball

#: FlashInfer imports torch: these tests share one test process (``--dist loadgroup``).
pytestmark = IMPORTS_TORCH


@pytest.fixture
def jit_env():
    """``flashinfer.jit.env``, imported when a test asks (collecting this module imports no torch)."""
    return pytest.importorskip("flashinfer.jit.env")

MODULE = "sampling"


@pytest.fixture
def pod_flashinfer(tmp_path, monkeypatch, jit_env):
    """This process's FlashInfer with its workspace and AOT directory in ``tmp_path`` (as a
    pod with another HOME and package prefix has them); restored afterwards."""
    cache = tmp_path / "pod-home" / ".cache" / "flashinfer"
    monkeypatch.setattr(jit_env, "FLASHINFER_CACHE_DIR", cache)
    monkeypatch.setattr(jit_env, "FLASHINFER_WORKSPACE_DIR", cache / "0.6.13" / "90a")
    image = tmp_path / "pod-prefix" / "flashinfer" / "data" / "aot"
    (image / "norm").mkdir(parents=True)
    (image / "norm" / "norm.so").write_bytes(b"\x7fELF image's own module")
    monkeypatch.setattr(jit_env, "FLASHINFER_AOT_DIR", image)
    return cache / "0.6.13" / "90a", image


def fetched_from_elsewhere(tmp_path):
    """A fetched run whose module was built on a node with other paths (its workspace, its
    FlashInfer data, its CUDA home) and this pod's CUDA version. A stand-in for FetchedTuning."""
    here = jit_environment()
    recorded = {"workspace_subdir": "0.6.13/90a", "workspace_dir": "/root/.cache/flashinfer/0.6.13/90a",
                "flashinfer_data_dir": "/usr/lib/python3/dist-packages/flashinfer/data",
                "cuda_home": "/usr/local/cuda-node", "nvcc": "/usr/local/cuda-node/bin/nvcc",
                "cuda_version": here["cuda_version"]}
    blob = module_tarball(fake_workspace(tmp_path / "node-workspace", MODULE), MODULE)
    run = SimpleNamespace(summary={"flashinfer_jit": recorded}, artifacts_of=lambda kind: [blob])
    return SimpleNamespace(run=run, jit_modules=(blob,), executable_refused=None, workspace_subdir="0.6.13/90a")


def test_modules_built_elsewhere_are_refused_for_ninja_and_installed_for_the_aot_path(tmp_path, pod_flashinfer, jit_env):
    workspace, image = pod_flashinfer
    fetched = fetched_from_elsewhere(tmp_path)
    refused = JitWorkspace().stage(fetched)()
    assert refused["jit_modules"] == () and refused["jit_not_installed"] == 1
    assert "built elsewhere: workspace_dir: node /root/.cache/flashinfer/0.6.13/90a" in refused["jit_skipped"]
    assert "flashinfer_data_dir" in refused["jit_skipped"] and "cuda_home" in refused["jit_skipped"]

    written = JitWorkspace(loads_as_aot=True).stage(fetched)()
    assert written["jit_modules"] == (MODULE,) and written["jit_skipped"] is None
    assert written["jit_aot_dir"] == workspace / AOT_DIR_NAME
    assert (workspace / "cached_ops" / MODULE / f"{MODULE}.so").is_file()

    assert use_aot_dir(written["jit_aot_dir"])
    assert jit_env.get_aot_path(MODULE).resolve() == (workspace / "cached_ops" / MODULE / f"{MODULE}.so").resolve()
    assert jit_env.get_aot_path("norm").resolve() == (image / "norm" / "norm.so").resolve()  # the image's still load
    assert not jit_env.get_aot_path("rope").exists()  # any other module: FlashInfer builds it as before


def test_another_cuda_version_is_still_refused_for_the_aot_path(tmp_path, pod_flashinfer):
    fetched = fetched_from_elsewhere(tmp_path)
    fetched.run.summary["flashinfer_jit"]["cuda_version"] = "11.8"
    written = JitWorkspace(loads_as_aot=True).stage(fetched)()
    assert written["jit_modules"] == () and written["jit_aot_dir"] is None
    assert written["jit_skipped"].startswith("1 FlashInfer JIT modules not installed, built elsewhere: cuda_version: "
                                             "node 11.8")
    assert "workspace_dir" not in written["jit_skipped"]


def test_the_aot_directory_is_made_anew_whole_and_keeps_the_images_module_of_the_same_name(tmp_path, pod_flashinfer):
    workspace, image = pod_flashinfer
    fake_workspace(workspace, "norm")  # an installed module the image also ships: the image's wins, as before
    fake_workspace(workspace, MODULE)
    made = build_aot_dir(workspace, ["norm", MODULE], image)
    assert sorted(p.name for p in made.iterdir()) == ["norm", MODULE]
    assert (made / "norm").resolve() == (image / "norm").resolve()
    assert (made / MODULE).resolve() == (workspace / "cached_ops" / MODULE).resolve()
    again = build_aot_dir(workspace, [MODULE], made)  # FlashInfer already pointed here: nothing links to itself
    assert sorted(p.name for p in again.iterdir()) == [MODULE]
    assert not [p for p in workspace.iterdir() if p.name.startswith(".")]  # no staging left behind
    assert not use_aot_dir(tmp_path / "gone")
