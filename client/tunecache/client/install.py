"""Fetch the tuning that matches a pod and install it as a FlashInfer autotune cache file."""

from __future__ import annotations

import contextlib
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from tunecache.client.atomic import write_atomically
from tunecache.client.http import TunecacheClient
from tunecache.client.jit_install import (
    check_jit_module,
    flashinfer_workspace,
    install_jit_module,
    jit_environment,
    jit_mismatches,
    shown,
)
from tunecache.client.report import installing
from tunecache.contract import ArtifactKind, EnvironmentMetadata, ReportSource, TuningKey, TuningRunRead
from tunecache.signing import UntrustedRun, verify_run
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
    """Why the run's JIT modules were not installed (unsigned, built for another FlashInfer
    version or arch, with other paths or CUDA, or this pod's FlashInfer workspace is unknown), if so."""
    signed_by: str | None = None
    """Id of the trusted key whose signature over the run checked (``None``: not checked)."""
    jit_not_installed: int = 0
    """How many of the run's JIT modules were asked for and not installed (``jit_skipped`` says why)."""


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
    signed_by: str | None = None
    """Id of the trusted key whose signature over the run's manifest checked, if any."""
    executable_refused: str | None = None
    """Why JIT modules / the DeepGEMM cache were asked for but not fetched (the run's
    signature was not checked: no trusted keys are set)."""

    @property
    def workspace_subdir(self) -> str:
        """FlashInfer's ``<version>/<arch dir>`` on the tuning node (``""`` if not recorded).

        The server's word: compared with this pod's own (:func:`install_jit_modules`),
        never made into a path."""
        layout = self.run.summary.get("flashinfer_jit")
        return str(layout.get("workspace_subdir", "")) if isinstance(layout, dict) else ""


def fetch_tuning(
    client: TunecacheClient, key: TuningKey, environment: EnvironmentMetadata, jit: bool = False, deep_gemm: bool = False,
    trusted_keys: Mapping[str, Ed25519PublicKey] | None = None,
) -> FetchedTuning:
    """Look up the current tuning and download its FlashInfer file (and, with ``jit``, its
    JIT modules; with ``deep_gemm``, its DeepGEMM cache), each verified against its sha256.

    Trust (:mod:`tunecache.signing`): with ``trusted_keys`` (the pod's
    ``TUNECACHE_TRUSTED_KEYS``), the run's signature must check against one of them over
    the manifest of *this pod's* key and environment and the run's artifacts, else nothing
    is fetched; since every artifact is then checked against its sha256 in that manifest,
    no byte the signer did not sign is installed. Without trusted keys, the tactics are
    fetched but JIT modules and DeepGEMM caches (code the inference process loads) never
    are: ``executable_refused`` says so.

    Deadline: the lookup and every download share the client's one install deadline
    (``client.install_deadline_s`` seconds from the call, ``TUNECACHE_INSTALL_DEADLINE``
    for a client made with :meth:`TunecacheClient.from_settings`; see
    :meth:`TunecacheClient.deadline_scope`). Everything is fetched before anything is
    written, so when it passes nothing has been installed.

    Raises:
        NoCompatibleTuning, ServerUnreachable, ServerError, ArtifactCorrupt
        (:mod:`tunecache.client.http`); InstallDeadlineExceeded (a ServerUnreachable) when
        the install deadline passed first; ``TunecacheError`` if the run has no FlashInfer file;
        UntrustedRun (:mod:`tunecache.signing`): trusted keys are set and the run is
        unsigned, signed by another key, or its manifest does not match; BadJitArtifact when
        a JIT module's tarball is unusable (checked before any install).
    """
    with client.deadline_scope():
        run = client.lookup(key, environment)
        try:
            signed_by = verify_run(run.signature, key, environment, run.artifacts, trusted_keys) if trusted_keys else None
        except UntrustedRun as exc:
            raise UntrustedRun(f"tuning run {run.id} refused: {exc}") from None
        refused = None
        if (jit or deep_gemm) and signed_by is None:
            refused = ("JIT modules and DeepGEMM caches install only from a run signed by a trusted key, and no trusted "
                       "keys are set (TUNECACHE_TRUSTED_KEYS)")
            jit = deep_gemm = False
        artifact = run.artifact(ArtifactKind.FLASHINFER_AUTOTUNE)
        if artifact is None:
            raise TunecacheError(f"tuning run {run.id} has no {ArtifactKind.FLASHINFER_AUTOTUNE} artifact")
        data = client.download_artifact(artifact.sha256)
        jit_artifacts = run.artifacts_of(ArtifactKind.FLASHINFER_JIT_MODULE) if jit else []
        modules = tuple(client.download_artifact(a.sha256) for a in jit_artifacts)
        for module in modules:  # every module checked before any is installed
            check_jit_module(module)
        dg = run.artifact(ArtifactKind.DEEP_GEMM_JIT_CACHE) if deep_gemm else None
        return FetchedTuning(
            run=run, autotune=data, jit_modules=modules, deep_gemm=client.download_artifact(dg.sha256) if dg else None,
            signed_by=signed_by, executable_refused=refused,
        )


def install_jit_modules(fetched: FetchedTuning, workspace: Path | bool) -> tuple[list[str], Path | None, str | None]:
    """Unpack the fetched JIT modules into ``workspace``: a directory this pod names
    (``tunecache pull --jit-workspace DIR``; used as given), or ``True``: this pod's
    FlashInfer workspace as this pod's FlashInfer says
    (:func:`tunecache.client.jit_install.flashinfer_workspace`), after checking that the
    modules were built where they will load.

    Nothing the run carries picks the directory: the node's ``workspace_subdir`` it records
    is only compared with this pod's.

    Returns ``(modules, workspace, None)``, or, with ``True``, ``([], None, reason)`` when
    nothing of the modules is written (the tactics are installed apart) and ``reason`` is
    one line saying why: FlashInfer is not importable here (this pod cannot tell its
    workspace), or the run's ``workspace_subdir`` (FlashInfer version and arch) or a
    validity field it recorded (:data:`tunecache.client.jit_install.JIT_VALIDITY_FIELDS`)
    differs here, so ninja would rebuild the modules or fail; each difference is named.
    """
    if not fetched.jit_modules:
        return [], None, fetched.executable_refused
    count = len(fetched.jit_modules)
    if workspace is not True:
        target = Path(workspace)
        return [install_jit_module(blob, target) for blob in fetched.jit_modules], target, None
    own = flashinfer_workspace()
    if own is None:
        return [], None, (f"{count} FlashInfer JIT modules not installed: FlashInfer is not importable here, so this "
                          "pod's FlashInfer workspace is unknown (tunecache pull --jit-workspace DIR names one)")
    recorded = fetched.run.summary.get("flashinfer_jit")
    mismatches = jit_mismatches(recorded if isinstance(recorded, dict) else {}, jit_environment())
    if fetched.workspace_subdir and fetched.workspace_subdir != own.subdir:
        mismatches.insert(0, f"workspace_subdir: node {shown(fetched.workspace_subdir)}, here {own.subdir}")
    if mismatches:
        return [], None, f"{count} FlashInfer JIT modules not installed, built elsewhere: " + "; ".join(mismatches)
    return [install_jit_module(blob, own.path) for blob in fetched.jit_modules], own.path, None


def pull_autotune_file(
    client: TunecacheClient,
    key: TuningKey,
    environment: EnvironmentMetadata,
    dest_dir: Path,
    file_name: str | None = None,
    jit_workspace: Path | bool | None = None,
    trusted_keys: Mapping[str, Ed25519PublicKey] | None = None,
    report_source: ReportSource | None = ReportSource.API,
) -> InstalledTuning:
    """Fetch the current tuning and install it as a plain FlashInfer cache file in
    ``dest_dir``, for ``flashinfer.autotune(False, cache=PATH)``.

    ``report_source``: report the install to the server afterwards, as this source
    (:mod:`tunecache.client.report`: in the background, best-effort, unless the client's
    ``reports`` is off, ``TUNECACHE_REPORT=0``); ``None``: the caller reports (``tunecache pull``).

    ``jit_workspace``: also install the run's FlashInfer JIT modules, into this
    FlashInfer workspace directory, or (``True``) into this pod's own
    (:func:`install_jit_modules`); only from a run signed
    by one of ``trusted_keys`` (:func:`fetch_tuning`). Every artifact is downloaded and
    verified before anything is written.

    Raises:
        as :func:`fetch_tuning` (UntrustedRun: nothing is written); ValueError for a
        ``file_name`` with directory parts;
        BadJitArtifact; OSError when writing fails (nothing half-written is left).
    """
    path = Path(dest_dir) / (check_file_name(file_name) if file_name else default_file_name(key))
    reporting = (installing(client, key, environment, report_source) if report_source is not None
                 else contextlib.nullcontext())
    with reporting as report:
        fetched = fetch_tuning(client, key, environment, jit=bool(jit_workspace), trusted_keys=trusted_keys)
        modules, workspace, skipped = install_jit_modules(fetched, jit_workspace) if jit_workspace else ([], None, None)
        write_atomically(path, fetched.autotune)
        artifact = fetched.run.artifact(ArtifactKind.FLASHINFER_AUTOTUNE)
        installed = InstalledTuning(
            path=path, run_id=fetched.run.id, sha256=artifact.sha256, entries=fetched.run.entries,
            jit_modules=tuple(modules), jit_workspace=workspace, jit_skipped=skipped, signed_by=fetched.signed_by,
            jit_not_installed=jit_not_installed(fetched.run, modules) if jit_workspace else 0,
        )
        if report is not None:
            report.installed(installed.run_id, len(modules), installed.jit_not_installed)
    return installed


def jit_not_installed(run: TuningRunRead, installed: list[str] | tuple[str, ...]) -> int:
    """How many of ``run``'s FlashInfer JIT modules are not among the ``installed`` ones."""
    return max(0, len(run.artifacts_of(ArtifactKind.FLASHINFER_JIT_MODULE)) - len(installed))
