"""Install FlashInfer JIT modules fetched from tunecache into the pod's FlashInfer workspace.

Each artifact is one module's tarball (:mod:`tunecache.formats.jit_module`):
``cached_ops/<module>/...`` and ``generated/<module>/...`` relative to the workspace
``$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer/<version>/<archs>``. FlashInfer then
finds the built ``.so`` and ninja finds nothing to rebuild, provided the pod's
workspace, FlashInfer and CUDA paths equal the tuning node's (same image).

Where modules go is the pod's own business: its FlashInfer's workspace
(:func:`flashinfer_workspace`) or a directory the pod names. What a run records about
the tuning node's workspace is compared with the pod's, never made into a path.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import NamedTuple

from tunecache.client.atomic import directory_lock, swap_into_place
from tunecache.formats.jit_module import JIT_VALIDITY_FIELDS, MTIME_NS_HEADER, BadJitArtifact, check_jit_module
from tunecache.formats.tarball import open_bounded


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
    module = check_jit_module(data)
    with open_bounded(data, "JIT", BadJitArtifact) as tar:
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
