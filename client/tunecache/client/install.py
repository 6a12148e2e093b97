"""Fetch the tuning that matches a pod and install it where FlashInfer, vLLM and DeepGEMM read it.

Every route installs through :func:`install` (``tunecache pull``'s three layouts, the Python
API, the vLLM plugin's pod): a fetched run (:func:`fetch_tuning`) and an
:class:`~tunecache.client.pipeline.InstallTarget` (the kinds installed, each by its registered
destination) give one :class:`InstallResult`.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from pydantic import BaseModel, ConfigDict

from tunecache.client.atomic import all_or_nothing
from tunecache.client.unpack import staging_scope
from tunecache.formats.dependencies import drift, image_of, installed_versions
from tunecache.store.http import TunecacheClient
from tunecache.client.installed import remember_installed
from tunecache.client.artifact_file import ArtifactFile
from tunecache.client.artifact_stream import Streams
from tunecache.client.node_cache import NodeCache, Transfer, fetch_artifact, fetch_artifacts
from tunecache.client.journal import recover_interrupted
from tunecache.client.layouts import FlashInferFile
from tunecache.client.pipeline import InstallTarget
from tunecache.client.run_trust import trusted_signer
from tunecache.client.report import installing, outcome_of, worth_reporting
from tunecache.formats.tarball import TarSource
from tunecache.contract import (
    KINDS,
    ArtifactKind,
    EnvironmentMetadata,
    ReportedDifference,
    ReportOutcome,
    ReportSource,
    TuningKey,
    TuningRunRead,
    kinds_where,
)
from tunecache.store import NoCompatibleTuning, TunecacheError


def default_file_name(key: TuningKey) -> str:
    """``<model>_<gpu>_mnbt<N>_tp<T>_<hash>.json``: readable parts with unsafe characters
    replaced by ``-``, plus 8 hex digits of the whole key so distinct keys never share a name."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{key.model}_{key.gpu_name}").strip("-.")
    digest = hashlib.sha256(key.identity_json().encode()).hexdigest()[:8]
    return f"{slug}_mnbt{key.max_num_batched_tokens}_tp{key.tensor_parallel_size}_{digest}.json"




@dataclass(frozen=True)
class FetchedTuning:
    """A tuning downloaded and verified, not yet installed anywhere."""

    run: TuningRunRead
    autotune: bytes
    jit_modules: tuple[TarSource, ...] = ()
    """The run's FlashInfer JIT module tarballs (:class:`~tunecache.client.artifact_file.ArtifactFile`
    once downloaded: files held open, never whole in memory)."""
    deep_gemm: TarSource | None = None
    """The run's DeepGEMM JIT cache tarball, when it has one and it was asked for."""
    signed_by: str | None = None
    """Id of the trusted key whose signature over the run's manifest checked, if any."""
    executable_refused: str | None = None
    """Why JIT modules / the DeepGEMM cache were asked for but not fetched (the run's
    signature was not checked: no trusted keys are set)."""
    warm_state: Mapping[ArtifactKind, TarSource] = field(default_factory=dict)
    """The run's other warm-state tarballs fetched, by kind (:data:`WARM_STATE_KINDS`)."""
    verified_for: tuple[TuningKey, EnvironmentMetadata] | None = None
    """The key and environment the run's signature was checked against (this pod's own, as
    it asked): what :func:`install` remembers the install under, never the key or
    environment the server's answer names (a proxy can rewrite those)."""
    transfer: Transfer | None = None
    """What the artifacts took to arrive (bytes, seconds, those from the node cache)."""
    drift: Mapping[ArtifactKind, str] = field(default_factory=dict)
    """The kinds built with other package versions than this pod's, each with the differences
    (:func:`tunecache.formats.dependencies.drift`): not installed."""
    streams: Streams | None = None
    """Where the tarballs are streamed into the install rather than downloaded first
    (:mod:`tunecache.client.artifact_stream`): their client, closed by :meth:`close`."""

    def close(self) -> None:
        """Close what the tarballs' downloads still hold (the streams' client)."""
        if self.streams is not None:
            self.streams.close()

    def drifted(self, fetched_only: bool = True) -> tuple[ArtifactKind, ...]:
        """The kinds of :attr:`drift` this install left out: those fetched (``fetched_only``) or
        all the run has (what a boot's main process fetched for the worker that reports it),
        in :data:`tunecache.contract.KINDS`' order."""
        def fetched(kind: ArtifactKind) -> bool:
            if not fetched_only:
                return bool(self.run.artifacts_of(kind))
            return bool(self.jit_modules) if kind is ArtifactKind.FLASHINFER_JIT_MODULE else kind in self.warm_state
        return tuple(kind for kind in KINDS if kind in self.drift and fetched(kind))

    @property
    def workspace_subdir(self) -> str:
        """FlashInfer's ``<version>/<arch dir>`` on the tuning node (``""`` if not recorded).

        The server's word: compared with this pod's own (:class:`~tunecache.client.jit_install.JitWorkspace`),
        never made into a path."""
        layout = self.run.summary.get("flashinfer_jit")
        return str(layout.get("workspace_subdir", "")) if isinstance(layout, dict) else ""


#: The kinds besides the JIT modules and the DeepGEMM cache that make a boot compile nothing:
#: fetched with ``warm_state`` (:func:`fetch_tuning`; their ``fetch_option`` in
#: :data:`tunecache.contract.KINDS`), installed by their destinations in :mod:`tunecache.client.warm_state`.
WARM_STATE_KINDS = kinds_where(fetch_option="warm_state")


def fetch_tuning(
    client: TunecacheClient, key: TuningKey, environment: EnvironmentMetadata, jit: bool = False, deep_gemm: bool = False,
    trusted_keys: Mapping[str, Ed25519PublicKey] | None = None, deadline_s: float | None = None,
    warm_state: bool = False, variant: str | None = None,
    warm_state_kinds: tuple[ArtifactKind, ...] = WARM_STATE_KINDS, run_id: int | None = None, stream: bool = False,
) -> FetchedTuning:
    """Look up the current tuning and download its FlashInfer file (and, with ``jit``, its
    JIT modules; with ``deep_gemm``, its DeepGEMM cache; with ``warm_state``, its
    :data:`WARM_STATE_KINDS`), each verified against its sha256.

    Trust (:mod:`tunecache.signing`): with ``trusted_keys`` (the pod's
    ``TUNECACHE_TRUSTED_KEYS``), the run's signature must check against one of them over
    the manifest of *this pod's* key and environment and the run's artifacts, else nothing
    is fetched; since every artifact is then checked against its sha256 in that manifest,
    no byte the signer did not sign is installed. Without trusted keys, the tactics are
    fetched but JIT modules and DeepGEMM caches (code the inference process loads) never
    are: ``executable_refused`` says so.

    Deadline: the lookup and every download share one install deadline, opened here once
    per install: ``deadline_s`` seconds from the call, or (``None``) the client's
    ``install_deadline_s`` (``TUNECACHE_INSTALL_DEADLINE`` for a client made with
    :meth:`TunecacheClient.from_settings`; see :meth:`TunecacheClient.deadline_scope`); the
    seconds an artifact's body spends arriving are not counted, it is held to a deadline that
    measures progress instead (:mod:`tunecache.store.http.stall`). Everything is fetched
    before anything is written, so when either passes nothing has been installed.

    Artifacts are streamed to files as they arrive, each hashed on the way
    (:func:`tunecache.client.node_cache.fetch_artifact`: from the node's cache,
    ``TUNECACHE_NODE_CACHE_DIR``, where it has them), never whole in memory; ``transfer`` of
    the result says what they took. ``stream`` (for an install that follows at once,
    :func:`fetch_and_install`; where there is no node cache): the tarballs are not downloaded
    here but as the install unpacks them (:mod:`tunecache.client.artifact_stream`), within the
    same deadline; close the result after the install.

    ``variant``: the pod's engine variant, asked of the server (the variant's current run
    where it has one, else the key's); a run of that variant is checked against the pod's
    memory of that variant (:mod:`tunecache.client.installed`). The lookup carries this pod's
    package versions (:func:`tunecache.formats.dependencies.installed_versions`, its image),
    so the server answers with its image's current run where the key's was made on another. ``warm_state_kinds``: which
    of :data:`WARM_STATE_KINDS` ``warm_state`` downloads.

    ``run_id``: that run, fetched by its id instead of the current one (the run whose warm
    state this boot's engine installed, :attr:`tunecache.client.boot.handoff.Handoff.warm_state_run`),
    checked as a looked-up run is; it must be of this key and environment.

    Raises:
        NoCompatibleTuning, ServerUnreachable, ServerError, ArtifactCorrupt
        (:mod:`tunecache.store.http`); InstallDeadlineExceeded (a ServerUnreachable) when
        the install deadline passed first; ``TunecacheError`` if the run has no FlashInfer file;
        UntrustedRun (:mod:`tunecache.signing`): trusted keys are set and the run is
        unsigned, signed by another key, or its manifest does not match; BadJitArtifact comes
        from :func:`install`, which checks each module as it unpacks it, before any is placed.
    """
    recover_interrupted()  # an install killed midway is finished or undone before anything else
    with client.deadline_scope(deadline_s):
        here = installed_versions()  # this pod's image: never another image's run where it has its own
        if run_id is not None:
            run = _run_of(client, run_id, key, environment)
        else:
            run = client.lookup(key, environment, variant, dependencies=here)
        signed_by = trusted_signer(run, key, environment, trusted_keys, variant)
        refused = None
        if (jit or deep_gemm or warm_state) and signed_by is None:
            refused = ("JIT modules, DeepGEMM caches and the rest of the warm state install only from a run signed "
                       "by a trusted key, and no trusted keys are set (TUNECACHE_TRUSTED_KEYS)")
            jit = deep_gemm = warm_state = False
        elif (jit or deep_gemm or warm_state) and run.signature is not None and run.signature.manifest < 2:
            # A format-1 signature is undated: it never expires, the rollback memory cannot order
            # it, and it does not cover the JIT validity fields. Code the pod loads (JIT modules,
            # DeepGEMM kernels, Triton's cache, compile-cache pickles) needs a dated one.
            refused = ("JIT modules, DeepGEMM caches and the rest of the warm state not installed: the run's "
                       "signature (manifest format 1) is undated and never expires; re-tune, or sign it anew "
                       "(tunecache promote RUN --signing-key KEY)")
            jit = deep_gemm = warm_state = False
        artifact = run.artifact(ArtifactKind.FLASHINFER_AUTOTUNE)
        if artifact is None:
            raise TunecacheError(f"tuning run {run.id} has no {ArtifactKind.FLASHINFER_AUTOTUNE} artifact")
        transfer, cache = Transfer(), NodeCache.from_environment()

        def fetched(sha256: str) -> ArtifactFile:
            return fetch_artifact(client, sha256, transfer, cache)

        data = fetched(artifact.sha256).read_bytes()
        jit_artifacts = run.artifacts_of(ArtifactKind.FLASHINFER_JIT_MODULE) if jit else []
        dg = run.artifact(ArtifactKind.DEEP_GEMM_JIT_CACHE) if deep_gemm else None
        warm_artifacts = {kind: a for kind in (warm_state_kinds if warm_state else ())
                          if (a := run.artifact(kind)) is not None}
        # the rest: streamed into the install as it unpacks them (one at a time), else downloaded here several
        # at once (TUNECACHE_DOWNLOADS); each checked before anything is placed
        shas = [a.sha256 for a in [*jit_artifacts, *([dg] if dg else []), *warm_artifacts.values()]]
        streams = (Streams(client, transfer) if stream and shas and cache is None and hasattr(client, "download_sibling")
                   else None)
        files: list[Any] = ([streams.of(sha) for sha in shas] if streams is not None
                            else fetch_artifacts(client, shas, transfer, cache))
        modules, files = tuple(files[:len(jit_artifacts)]), files[len(jit_artifacts):]
        deep_gemm_file = files.pop(0) if dg else None
        warm = dict(zip(warm_artifacts, files))
        return FetchedTuning(
            run=run, autotune=data, jit_modules=modules, deep_gemm=deep_gemm_file,
            signed_by=signed_by, executable_refused=refused, warm_state=warm,
            verified_for=(key, environment) if signed_by is not None else None,
            drift=drift(run.summary.get("dependencies"), here), transfer=transfer, streams=streams,
        )


def _run_of(client: TunecacheClient, run_id: int, key: TuningKey, environment: EnvironmentMetadata) -> TuningRunRead:
    """Run ``run_id``, by its id, when it is of ``key`` and ``environment`` (the server's word,
    which a signature, when trusted keys are set, then checks over this pod's own).

    Raises:
        ServerError (404: no such run), ServerUnreachable; TunecacheError: another key's or environment's."""
    run = client.get_run(run_id)
    if run.key.key_hash() != key.key_hash() or run.environment_hash != environment.environment_hash():
        raise TunecacheError(f"tuning run {run_id} is not of this pod's key and environment")
    return run


class InstallResult(BaseModel):
    """What an install came to, on every route (and in the vLLM plugin's pod record).

    ``outcome``: ``installed`` (the run is in place), ``miss`` (the server has no matching
    tuning: ``run_id`` is then the closest run it named, ``differences`` its fields that
    differ) or ``error`` (``reason`` says what; ``error_kind`` its class when the install
    is reported: :func:`tunecache.client.report.worth_reporting`).
    """

    model_config = ConfigDict(frozen=True)

    outcome: ReportOutcome
    run_id: int | None = None
    entries: int | None = None
    sha256: str | None = None
    """The FlashInfer file's sha256 (installed)."""
    paths: tuple[Path, ...] = ()
    """Where the tactics are: the FlashInfer file, every rank's file, or the v2 store directory."""
    jit_modules: tuple[str, ...] = ()
    """The FlashInfer JIT modules installed."""
    jit_workspace: Path | None = None
    jit_aot_dir: Path | None = None
    """The AOT directory made for the modules, when FlashInfer loads them without ninja
    (:attr:`tunecache.client.jit_install.JitWorkspace.loads_as_aot`)."""
    jit_skipped: str | None = None
    """Why the run's JIT modules were not installed (unsigned, built for another FlashInfer
    version or arch, with other paths or CUDA, or this pod's FlashInfer workspace is unknown), if so."""
    jit_not_installed: int = 0
    """How many of the run's JIT modules were asked for and not installed (``jit_skipped`` says why)."""
    deep_gemm_dir: Path | None = None
    """The DeepGEMM cache directory the run's kernels were merged into, if any."""
    warm_state: tuple[str, ...] = ()
    """What of the rest of the warm state was installed, one phrase per kind (e.g. ``compile
    cache (2 of 2 directories)``)."""
    compile_cache_skipped: str | None = None
    """Why the run's compile cache was not installed (each differing factor named), if so."""
    missing_kinds: tuple[ArtifactKind, ...] = ()
    """The kinds of the run left out as built with other package versions than this pod's
    (another image's run: :attr:`FetchedTuning.drift`), reported to the service."""
    vllm_cache_root: Path | None = None
    triton_cache_dir: Path | None = None
    signed_by: str | None = None
    """Id of the trusted key whose signature over the run checked (``None``: not checked)."""
    transfer: str | None = None
    """What the run's artifacts took to arrive: bytes, seconds and rate, and those the node's
    cache had (:meth:`tunecache.client.node_cache.Transfer.line`)."""
    reason: str | None = None
    """Miss or error: one line saying why nothing was installed."""
    error_kind: str | None = None
    differences: tuple[ReportedDifference, ...] = ()

    @property
    def path(self) -> Path:
        """The first of :attr:`paths` (the FlashInfer file of a plain-file install)."""
        return self.paths[0]

    @classmethod
    def of_failure(cls, error: BaseException) -> InstallResult:
        """The result of an install that raised ``error``: a miss (a lookup's 404) or an error."""
        outcome, found = outcome_of(error)
        if isinstance(error, NoCompatibleTuning):
            return cls(outcome=outcome, reason=error.detail, run_id=found["run_id"],
                       differences=tuple(found["differences"]))
        return cls(outcome=outcome, reason=f"{type(error).__name__}: {error}",
                   error_kind=found["error_kind"] if worth_reporting(error) else None)

    def report_fields(self) -> dict[str, Any] | None:
        """This install's report fields besides its outcome
        (:func:`tunecache.client.report.build_report`), or ``None`` when it is not reported."""
        if self.outcome is ReportOutcome.INSTALLED:
            return {"run_id": self.run_id, "jit_modules": len(self.jit_modules), "jit_skipped": self.jit_not_installed,
                    **({"missing_kinds": list(self.missing_kinds)} if self.missing_kinds else {}),
                    "installed_from": [self.run_id]}
        if self.outcome is ReportOutcome.MISS:
            return {"run_id": self.run_id, "differences": list(self.differences)}
        return {"error_kind": self.error_kind} if self.error_kind else None


#: The name this result had before every route shared it (kept for API users).
InstalledTuning = InstallResult


def install(fetched: FetchedTuning, target: InstallTarget) -> InstallResult:
    """Install a fetched run at ``target``, all or nothing: every destination is staged first
    (paths resolved, this pod's FlashInfer workspace compared with the run's, each tarball
    unpacked in one pass beside its place with every entry checked: nothing is where anything
    reads it yet, :mod:`tunecache.client.unpack`), then each is written in :class:`InstallTarget`'s order, the
    tactics last; when a write fails (a full volume), what the others put in place is taken
    back and what they replaced returns (:func:`tunecache.client.atomic.all_or_nothing`).

    Raises:
        ValueError: a path this pod cannot tell (e.g. vLLM's autotune root without vllm,
            flashinfer or ``VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR``) or a DeepGEMM tarball with
            unsafe entries; ImportError: FlashInfer's v2 store without FlashInfer;
            BadJitArtifact; OSError when writing fails (nothing half-written is left).
    """
    written: dict[str, Any] = {}
    # What the destinations unpacked and did not rename in goes, whatever happens (and is in the
    # journal, for a pull killed midway); a write that fails (a full volume) takes back what the
    # others put in place.
    with staging_scope(), all_or_nothing():
        commits = [destination.stage(fetched) for destination in target.destinations()]
        for commit in commits:
            fields_set = commit()
            written.update(fields_set, warm_state=written.get("warm_state", ()) + tuple(fields_set.get("warm_state", ())))
    if fetched.signed_by is not None and fetched.run.signature is not None and fetched.verified_for is not None:
        remember_installed(*fetched.verified_for, fetched.run.signature.signed_at,
                           image=image_of(fetched.run.summary.get("dependencies")))
    return InstallResult(outcome=ReportOutcome.INSTALLED, run_id=fetched.run.id, entries=fetched.run.entries,
                         sha256=fetched.run.artifact(ArtifactKind.FLASHINFER_AUTOTUNE).sha256,
                         signed_by=fetched.signed_by, missing_kinds=getattr(fetched, "drifted", tuple)(),
                         transfer=fetched.transfer.line() if getattr(fetched, "transfer", None) else None, **written)


def fetch_and_install(
    client: TunecacheClient,
    key: TuningKey,
    environment: EnvironmentMetadata,
    target: InstallTarget,
    trusted_keys: Mapping[str, Ed25519PublicKey] | None = None,
    report_source: ReportSource | None = ReportSource.API,
) -> InstallResult:
    """Fetch the current tuning (:func:`fetch_tuning`, within the client's install deadline)
    and :func:`install` it at ``target``; ``tunecache pull`` and the Python API install this way.

    ``report_source``: report the install to the server afterwards, as this source
    (:mod:`tunecache.client.report`: in the background, best-effort, unless the client's
    ``reports`` is off, ``TUNECACHE_REPORT=0``); ``None``: not reported here.

    Raises:
        as :func:`fetch_tuning` (UntrustedRun: nothing is written) and :func:`install`.
    """
    reporting = (installing(client, key, environment, report_source) if report_source is not None
                 else contextlib.nullcontext())
    with reporting as report:
        fetched = fetch_tuning(client, key, environment, trusted_keys=trusted_keys, stream=True, **target.fetch_options())
        try:
            result = install(fetched, target)
        finally:
            fetched.close()
        if report is not None:
            report.installed(**result.report_fields())
    return result


def pull_autotune_file(
    client: TunecacheClient,
    key: TuningKey,
    environment: EnvironmentMetadata,
    dest_dir: Path,
    file_name: str | None = None,
    jit_workspace: Path | bool | None = None,
    trusted_keys: Mapping[str, Ed25519PublicKey] | None = None,
    report_source: ReportSource | None = ReportSource.API,
) -> InstallResult:
    """Convenience kept for API users: :func:`fetch_and_install` into a plain FlashInfer cache
    file in ``dest_dir`` (``file_name``, default :func:`default_file_name`), for
    ``flashinfer.autotune(False, cache=PATH)``; with ``jit_workspace`` the run's JIT modules
    too, into that directory or (``True``) this pod's own FlashInfer workspace
    (:class:`~tunecache.client.jit_install.JitWorkspace`), only from a run signed by one of ``trusted_keys``.

    Raises:
        ValueError for a ``file_name`` with directory parts (before anything is fetched);
        as :func:`fetch_and_install`.
    """
    jit = () if not jit_workspace else (ArtifactKind.FLASHINFER_JIT_MODULE,)
    where = {ArtifactKind.FLASHINFER_JIT_MODULE: None if jit_workspace is True else Path(jit_workspace)} if jit else {}
    target = InstallTarget.of(jit, FlashInferFile(Path(dest_dir), file_name or default_file_name(key)), where)
    return fetch_and_install(client, key, environment, target, trusted_keys, report_source)
