"""Harvest FlashInfer's JIT-built modules as artifacts, one deterministic tarball each
(:func:`tunecache.formats.jit_module.module_tarball`: a module is shipped whole, with its
files' modification times, and is valid for pods whose FlashInfer workspace path,
FlashInfer install path and CUDA toolkit path equal the tuning node's).

Which modules: those this process compiled or loaded (``flashinfer.jit.core.jit_spec_registry``),
so a node's cache of other models' modules is not shipped with this key.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

from tunecache.contract import ArtifactKind
from tunecache.formats.jit_module import jit_environment, module_tarball


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


def harvest_flashinfer_jit(out_dir: Path, modules: list[str] | None = None) -> list[dict[str, Any]]:
    """Write one tarball per JIT module under ``out_dir/jit/``: ``modules`` (names in this
    process's FlashInfer workspace), by default those this process used
    (:func:`used_jit_modules`).

    Returns artifact descriptions ``{"kind", "name", "media_type", "path", "module"}``
    (``path`` relative to ``out_dir``).
    """
    from flashinfer.jit import env as jit_env

    workspace = Path(jit_env.FLASHINFER_WORKSPACE_DIR)
    target = out_dir / "jit"
    target.mkdir(parents=True, exist_ok=True)
    artifacts = []
    for module in (used_jit_modules(workspace) if modules is None else modules):
        (target / f"{module}.tar.gz").write_bytes(module_tarball(workspace, module))
        artifacts.append({
            "kind": ArtifactKind.FLASHINFER_JIT_MODULE.value,
            "name": f"flashinfer-jit/{module}.tar.gz",
            "media_type": ArtifactKind.FLASHINFER_JIT_MODULE.media_type,
            "path": f"jit/{module}.tar.gz",
            "module": module,
        })
    return artifacts


def tar_directory(directory: Path) -> bytes:
    """Every file under ``directory`` (paths relative to it, sorted) as a gzipped tarball."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for path in sorted(directory.rglob("*")):
            if path.is_file():
                tar.add(str(path), arcname=str(path.relative_to(directory)))
    return raw.getvalue()


#: The name of a run's DeepGEMM JIT cache among its artifacts.
DEEP_GEMM_CACHE_NAME = "deep-gemm-jit-cache.tar.gz"


def deep_gemm_artifact(cache_dir: Path, out_dir: Path) -> list[dict[str, Any]]:
    """DeepGEMM's JIT cache directory (``DG_JIT_CACHE_DIR`` of the tuner) as one
    ``deep_gemm_jit_cache`` artifact written to ``out_dir``; ``[]`` when DeepGEMM compiled
    nothing there. Returns artifact descriptions (``path`` relative to ``out_dir``)."""
    if not cache_dir.is_dir() or not any(p.is_file() for p in cache_dir.rglob("*")):
        return []
    (out_dir / DEEP_GEMM_CACHE_NAME).write_bytes(tar_directory(cache_dir))
    kind = ArtifactKind.DEEP_GEMM_JIT_CACHE
    return [{"kind": kind.value, "name": DEEP_GEMM_CACHE_NAME, "media_type": kind.media_type, "path": DEEP_GEMM_CACHE_NAME}]


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
