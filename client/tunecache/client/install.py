"""Fetch the tuning that matches a pod and install it as a FlashInfer autotune cache file."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from tunecache.client.atomic import write_atomically
from tunecache.client.http import TunecacheClient
from tunecache.client.jit_install import (
    check_jit_module,
    flashinfer_workspace_dir,
    install_jit_module,
    jit_environment,
    jit_mismatches,
)
from tunecache.contract import ArtifactKind, EnvironmentMetadata, TuningKey, TuningRunRead
from tunecache.store import TunecacheError


@dataclass(frozen=True)
class InstalledTuning:
    path: Path
    run_id: int
    sha256: str
    entries: int | None
    jit_modules: tuple[str, ...] = ()
    jit_workspace: Path | None = None
    jit_skipped: str | None = None
    """Why the run's JIT modules were not installed (built with other paths or CUDA), if so."""


def default_file_name(key: TuningKey) -> str:
    """``<model>_<gpu>_mnbt<N>_tp<T>_<hash>.json``: readable parts with unsafe characters
    replaced by ``-``, plus 8 hex digits of the whole key so distinct keys never share a name."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{key.model}_{key.gpu_name}").strip("-.")
    digest = hashlib.sha256(key.model_dump_json().encode()).hexdigest()[:8]
    return f"{slug}_mnbt{key.max_num_batched_tokens}_tp{key.tensor_parallel_size}_{digest}.json"


def check_file_name(name: str) -> str:
    """A plain file name (no directory parts, not hidden).

    Raises:
        ValueError: naming what is wrong.
    """
    if not name or "/" in name or "\\" in name or name.startswith(".") or name != Path(name).name:
        raise ValueError(f"file name {name!r} must be a plain name without directories, not starting with '.'")
    return name


@dataclass(frozen=True)
class FetchedTuning:
    """A tuning downloaded and verified, not yet installed anywhere."""

    run: TuningRunRead
    autotune: bytes
    jit_modules: tuple[bytes, ...] = ()
    deep_gemm: bytes | None = None
    """The run's DeepGEMM JIT cache tarball, when it has one and it was asked for."""

    @property
    def workspace_subdir(self) -> str:
        """FlashInfer's ``<version>/<arch dir>`` on the tuning node (``""`` if not recorded)."""
        layout = self.run.summary.get("flashinfer_jit")
        return str(layout.get("workspace_subdir", "")) if isinstance(layout, dict) else ""


def fetch_tuning(
    client: TunecacheClient, key: TuningKey, environment: EnvironmentMetadata, jit: bool = False, deep_gemm: bool = False
) -> FetchedTuning:
    """Look up the current tuning and download its FlashInfer file (and, with ``jit``, its
    JIT modules; with ``deep_gemm``, its DeepGEMM cache), each verified against its sha256.

    Raises:
        NoCompatibleTuning, ServerUnreachable, ServerError, ArtifactCorrupt
        (:mod:`tunecache.client.http`); ``TunecacheError`` if the run has no FlashInfer file;
        BadJitArtifact when a JIT module's tarball is unusable (checked before any install).
    """
    run = client.lookup(key, environment)
    artifact = run.artifact(ArtifactKind.FLASHINFER_AUTOTUNE)
    if artifact is None:
        raise TunecacheError(f"tuning run {run.id} has no {ArtifactKind.FLASHINFER_AUTOTUNE} artifact")
    data = client.download_artifact(artifact.sha256)
    modules = tuple(client.download_artifact(a.sha256) for a in run.artifacts_of(ArtifactKind.FLASHINFER_JIT_MODULE)) if jit else ()
    for module in modules:  # every module checked before any is installed
        check_jit_module(module)
    dg = run.artifact(ArtifactKind.DEEP_GEMM_JIT_CACHE) if deep_gemm else None
    return FetchedTuning(
        run=run, autotune=data, jit_modules=modules, deep_gemm=client.download_artifact(dg.sha256) if dg else None
    )


def install_jit_modules(fetched: FetchedTuning, workspace: Path | bool) -> tuple[list[str], Path | None, str | None]:
    """Unpack the fetched JIT modules into ``workspace`` (``True``: this pod's FlashInfer
    workspace), after checking that they were built where they will load.

    Returns ``(modules, workspace, None)``, or ``([], None, reason)`` when installing into
    this pod's workspace and a validity field the run recorded
    (:data:`tunecache.client.jit_install.JIT_VALIDITY_FIELDS`) differs here: installed, ninja
    would rebuild the modules or fail, so nothing of them is written (the tactics are
    installed apart) and ``reason`` names each difference.
    """
    if not fetched.jit_modules:
        return [], None, None
    if workspace is True:
        recorded = fetched.run.summary.get("flashinfer_jit")
        mismatches = jit_mismatches(recorded if isinstance(recorded, dict) else {}, jit_environment())
        if mismatches:
            return [], None, (f"{len(fetched.jit_modules)} FlashInfer JIT modules not installed, built elsewhere: "
                              + "; ".join(mismatches))
    target = flashinfer_workspace_dir(fetched.workspace_subdir) if workspace is True else Path(workspace)
    return [install_jit_module(blob, target) for blob in fetched.jit_modules], target, None


def pull_autotune_file(
    client: TunecacheClient,
    key: TuningKey,
    environment: EnvironmentMetadata,
    dest_dir: Path,
    file_name: str | None = None,
    jit_workspace: Path | bool | None = None,
) -> InstalledTuning:
    """Fetch the current tuning and install it as a plain FlashInfer cache file in
    ``dest_dir``, for ``flashinfer.autotune(False, cache=PATH)``.

    ``jit_workspace``: also install the run's FlashInfer JIT modules, into this
    FlashInfer workspace directory, or (``True``) into this pod's
    (:func:`tunecache.client.jit_install.flashinfer_workspace_dir`). Every artifact is
    downloaded and verified before anything is written.

    Raises:
        as :func:`fetch_tuning`; ValueError for a ``file_name`` with directory parts;
        BadJitArtifact; OSError when writing fails (nothing half-written is left).
    """
    path = Path(dest_dir) / (check_file_name(file_name) if file_name else default_file_name(key))
    fetched = fetch_tuning(client, key, environment, jit=bool(jit_workspace))
    modules, workspace, skipped = install_jit_modules(fetched, jit_workspace) if jit_workspace else ([], None, None)
    write_atomically(path, fetched.autotune)
    artifact = fetched.run.artifact(ArtifactKind.FLASHINFER_AUTOTUNE)
    return InstalledTuning(
        path=path, run_id=fetched.run.id, sha256=artifact.sha256, entries=fetched.run.entries,
        jit_modules=tuple(modules), jit_workspace=workspace, jit_skipped=skipped,
    )
