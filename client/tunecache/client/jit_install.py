"""Install FlashInfer JIT modules fetched from tunecache into the pod's FlashInfer workspace.

Each artifact is one module's tarball (see ``tunecache.service.tuner.jit_artifacts``):
``cached_ops/<module>/...`` and ``generated/<module>/...`` relative to the workspace
``$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer/<version>/<archs>``. FlashInfer then
finds the built ``.so`` and ninja finds nothing to rebuild, provided the pod's
workspace, FlashInfer and CUDA paths equal the tuning node's (same image).

Where modules go is the pod's own business: its FlashInfer's workspace
(:func:`flashinfer_workspace`) or a directory the pod names. What a run records about
the tuning node's workspace is compared with the pod's, never made into a path.
"""

from __future__ import annotations

import io
import os
import shutil
import tarfile
import tempfile
from pathlib import Path, PurePosixPath
from typing import NamedTuple

from tunecache.client.atomic import directory_lock, swap_into_place


#: pax header holding an entry's exact modification time in nanoseconds.
MTIME_NS_HEADER = "TUNECACHE.mtime_ns"


#: What a built module's ``build.ninja`` and its ninja state name, so what must be equal on
#: the node that built it and the pod that loads it, or ninja rebuilds (or fails).
JIT_VALIDITY_FIELDS = ("workspace_dir", "flashinfer_data_dir", "cuda_home", "nvcc", "cuda_version")


def jit_environment() -> dict[str, str] | None:
    """What this process's FlashInfer JIT modules depend on, or ``None`` without FlashInfer:

    * ``workspace_dir``: ``flashinfer.jit.env.FLASHINFER_WORKSPACE_DIR`` (built modules);
    * ``flashinfer_data_dir``: ``flashinfer.jit.env.FLASHINFER_DATA`` (sources and headers
      ``build.ninja`` names);
    * ``cuda_home``: ``flashinfer.jit.cpp_ext.get_cuda_path()``; ``nvcc``:
      ``$FLASHINFER_NVCC`` or ``<cuda_home>/bin/nvcc`` (``generate_ninja_build_for_op``);
    * ``cuda_version``: ``flashinfer.jit.cpp_ext.get_cuda_version()`` (nvcc's).

    The tuner records it with a run; a pod compares before it installs the run's modules.
    """
    try:
        from flashinfer.jit import cpp_ext
        from flashinfer.jit import env as jit_env

        cuda_home = cpp_ext.get_cuda_path()
        return {
            "workspace_dir": str(jit_env.FLASHINFER_WORKSPACE_DIR),
            "flashinfer_data_dir": str(jit_env.FLASHINFER_DATA),
            "cuda_home": str(cuda_home),
            "nvcc": os.environ.get("FLASHINFER_NVCC", f"{cuda_home}/bin/nvcc"),
            "cuda_version": str(cpp_ext.get_cuda_version()),
        }
    except Exception:  # no FlashInfer, or no CUDA toolkit it can find
        return None


def shown(value: object, limit: int = 200) -> str:
    """A value a run recorded, fit for one log line: control characters escaped, at most
    ``limit`` characters (it comes from the server, so it may hold anything)."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(value))
    return text if len(text) <= limit else text[:limit] + "..."


def jit_mismatches(recorded: dict, here: dict[str, str] | None) -> list[str]:
    """``"field: node X, here Y"`` for every validity field recorded with a run that differs
    here (nothing when the run recorded none or this process cannot tell)."""
    if here is None:
        return []
    return [f"{field}: node {shown(recorded[field])}, here {here.get(field)}" for field in JIT_VALIDITY_FIELDS
            if field in recorded and str(recorded[field]) != here.get(field)]


class BadJitArtifact(ValueError):
    """A JIT tarball with paths outside one module's directories, links, or special files."""


class FlashInferWorkspace(NamedTuple):
    """This process's FlashInfer JIT workspace."""

    path: Path
    """``flashinfer.jit.env.FLASHINFER_WORKSPACE_DIR``."""
    subdir: str
    """Its ``<version>/<archs>`` part (relative to ``FLASHINFER_CACHE_DIR``), as the tuner
    records a run's ``workspace_subdir``."""


def flashinfer_workspace() -> FlashInferWorkspace | None:
    """This pod's FlashInfer JIT workspace as this pod's FlashInfer composes it
    (``$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer/<its version>/<its archs>``), or
    ``None`` when FlashInfer is not importable here: then this pod cannot tell its
    workspace, and a caller either names a directory itself or installs no JIT module.
    """
    try:
        from flashinfer.jit import env as jit_env

        path = Path(jit_env.FLASHINFER_WORKSPACE_DIR)
        cache_dir = Path(jit_env.FLASHINFER_CACHE_DIR)
    except Exception:  # no FlashInfer, or one that cannot load here
        return None
    try:
        subdir = str(path.relative_to(cache_dir))
    except ValueError:  # a FlashInfer that keeps its workspace elsewhere
        subdir = str(Path(path.parent.name) / path.name)
    return FlashInferWorkspace(path, subdir)


def _module_of(tar: tarfile.TarFile) -> str:
    modules = set()
    for member in tar.getmembers():
        path = PurePosixPath(member.name)
        if path.is_absolute() or ".." in path.parts or len(path.parts) < 2:
            raise BadJitArtifact(f"unsafe path in JIT artifact: {member.name!r}")
        if path.parts[0] not in ("cached_ops", "generated"):
            raise BadJitArtifact(f"unexpected top-level directory in JIT artifact: {member.name!r}")
        if not (member.isfile() or member.isdir()):
            raise BadJitArtifact(f"JIT artifact holds a link or special file: {member.name!r}")
        mtime_ns = member.pax_headers.get(MTIME_NS_HEADER)
        if mtime_ns is not None and not (mtime_ns.isascii() and mtime_ns.isdigit() and len(mtime_ns) <= 20):
            raise BadJitArtifact(f"JIT artifact entry {member.name!r}: {MTIME_NS_HEADER} is not a whole number of "
                                 f"nanoseconds: {mtime_ns[:40]!r}")
        modules.add(path.parts[1])
    if len(modules) != 1:
        raise BadJitArtifact(f"a JIT artifact must hold exactly one module, found {sorted(modules)}")
    return modules.pop()


def check_jit_module(data: bytes) -> str:
    """The module name of a JIT tarball, after checking every entry (nothing is written).

    Raises:
        BadJitArtifact: not a gzip'd tar, not one module's files, or an entry whose
            ``TUNECACHE.mtime_ns`` header is not a whole number.
    """
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            return _module_of(tar)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise BadJitArtifact(f"JIT artifact is not a gzip'd tar file: {exc}") from None


def install_jit_module(data: bytes, workspace: Path) -> str:
    """Unpack one module's tarball into ``workspace``; returns the module name.

    The module's directories are unpacked beside their targets and renamed into place,
    so FlashInfer never sees half a module; files keep their modification times to the
    nanosecond, as ninja compares them (a rounded time makes ninja rebuild the module).
    Several processes may install into one workspace at once (a pod's workers): the swaps
    are serialized (:func:`tunecache.client.atomic.directory_lock`) and each succeeds.

    Raises:
        BadJitArtifact: the tarball is not one module's files.
    """
    check_jit_module(data)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        module = _module_of(tar)
        workspace.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".tunecache-", dir=workspace))
        try:
            tar.extractall(staging, filter="data")
            # Exact times, deepest entries first so a directory's own time is set last.
            for member in sorted(tar.getmembers(), key=lambda m: m.name, reverse=True):
                if MTIME_NS_HEADER in member.pax_headers:
                    ns = int(member.pax_headers[MTIME_NS_HEADER])
                    os.utime(staging / member.name, ns=(ns, ns))
            with directory_lock(workspace):  # the pod's other workers install the same modules
                for top in ("cached_ops", "generated"):
                    unpacked = staging / top / module
                    if unpacked.is_dir():
                        (workspace / top).mkdir(exist_ok=True)
                        swap_into_place(unpacked, workspace / top / module)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return module
