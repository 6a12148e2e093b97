"""Harvest FlashInfer's JIT-built modules as artifacts, one deterministic tarball each
(:func:`tunecache.formats.jit_module.module_tarball`: a module is shipped whole, with its
files' modification times, and is valid for pods whose FlashInfer workspace path,
FlashInfer install path and CUDA toolkit path equal the tuning node's).

Which modules: those this process compiled or loaded (``flashinfer.jit.core.jit_spec_registry``),
so a node's cache of other models' modules is not shipped with this key.
"""

from __future__ import annotations

from pathlib import Path

from tunecache.formats.jit_module import jit_environment, module_tarball
from tunecache.service.tuner.harvest import FlashInferJitHarvester
from tunecache.service.tuner.result import HarvestedArtifact


def used_jit_modules(workspace: Path) -> list[str]:
    """Names of the nvcc JIT modules this process registered whose ``.so`` exists in
    ``workspace/cached_ops`` (AOT modules shipped inside FlashInfer's wheel are skipped)."""
    from flashinfer.jit.core import jit_spec_registry

    names = []
    for status in jit_spec_registry.get_all_statuses():
        library = workspace / "cached_ops" / status.name / f"{status.name}.so"
        if library.is_file():
            names.append(status.name)
    return sorted(names)


def built_since(workspace: Path, since_ns: int) -> list[str]:
    """Names of the JIT modules under ``workspace/cached_ops`` whose ``<module>.so`` was
    written at or after ``since_ns`` (``time.time_ns()``): what other processes (vLLM's
    engine and workers) built while a run was going on."""
    names = []
    for library in (workspace / "cached_ops").glob("*/*.so"):
        if library.stem == library.parent.name and library.stat().st_mtime_ns >= since_ns:
            names.append(library.stem)
    return sorted(names)


def harvest_flashinfer_jit(out_dir: Path, modules: list[str] | None = None) -> list[HarvestedArtifact]:
    """Write one tarball per JIT module under ``out_dir/jit/``: ``modules`` (names in this
    process's FlashInfer workspace), by default those this process used
    (:func:`used_jit_modules`).

    Returns the artifacts, each with its ``module`` (``path`` relative to ``out_dir``).
    """
    from flashinfer.jit import env as jit_env

    workspace = Path(jit_env.FLASHINFER_WORKSPACE_DIR)
    target = out_dir / "jit"
    target.mkdir(parents=True, exist_ok=True)
    artifacts = []
    harvester = FlashInferJitHarvester()
    for module in (used_jit_modules(workspace) if modules is None else modules):
        (target / f"{module}.tar.gz").write_bytes(module_tarball(workspace, module))
        artifacts.append(harvester.module_artifact(module))
    return artifacts


def workspace_layout() -> dict[str, str]:
    """Where this process's FlashInfer keeps JIT modules, the workspace base
    (``FLASHINFER_WORKSPACE_BASE``, default ``$HOME``) and the directory under
    ``<base>/.cache/flashinfer/`` (``<version>/<archs>``, e.g. ``0.7.4/90a``), with what the
    modules' validity depends on (:func:`tunecache.formats.jit_module.jit_environment`).

    A pod compares these with its own before it installs the modules; it never makes a
    path of them (it installs into its own FlashInfer's workspace)."""
    from flashinfer.jit import env as jit_env

    return {
        "workspace_base": str(jit_env.FLASHINFER_BASE_DIR),
        "workspace_subdir": str(Path(jit_env.FLASHINFER_WORKSPACE_DIR).relative_to(jit_env.FLASHINFER_CACHE_DIR)),
        **(jit_environment() or {}),
    }
