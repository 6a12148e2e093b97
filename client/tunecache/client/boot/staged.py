"""What the engine's main process staged for its workers, taken up by each worker before it
compiles: the boot's middle phase.

The main process (:mod:`tunecache.client.boot.main_process`) installed the run's FlashInfer JIT
modules into an AOT directory and wrote the run's compile cache beside the cache root, unpacking
it on a thread (:func:`unpack_staged`); it handed both over
(:class:`tunecache.client.boot.handoff.Handoff`). Each worker, from the plugin's hooks on
``load_model`` and ``determine_available_memory``:

* points its FlashInfer at that AOT directory (:func:`use_staged_aot_dir`) before its model loads;
* puts the compile cache under the directory names its own vLLM config gives
  (:func:`install_staged_compile_cache`) right before vLLM's torch.compile looks for them, or,
  when its engine variant is not the run's, fetches its variant's own
  (:func:`fetch_variant_compile_cache`, once per engine) or says which factors differ.

Every function logs at most one line and never raises into vLLM.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tunecache.client.atomic import file_lock, remove_stale, write_atomically
from tunecache.client.boot.coordination import DEFAULT_INSTALL_DEADLINE_S, install_deadline
from tunecache.client.boot.handoff import Handoff
from tunecache.client.boot.reporting import variant_seen
from tunecache.store.http import TunecacheClient
from tunecache.client.install import InstallResult, fetch_tuning
from tunecache.client.jit_install import use_aot_dir
from tunecache.client.pipeline import destinations_of
from tunecache.client.warm_state import (
    VllmCacheRoot,
    read_compile_factors,
    relocate_compile_dirs,
    relocate_node_paths,
    rename_entries,
)
from tunecache.contract import ArtifactKind, EnvironmentMetadata, ReportOutcome, TuningKey, kinds_where
from tunecache.engines import engine_for
from tunecache.engines.vllm.compile_cache import FACTORS_FILE, CompileFactors, PodCompileFactors, variant_differences
from tunecache.formats.tarball import TarSource
from tunecache.signing import load_trusted_keys

if TYPE_CHECKING:  # the pod's settings, imported only where it is booted (not with the plugin)
    from tunecache.client.settings import ClientSettings

log = logging.getLogger("vllm.plugins.tunecache")


def use_staged_aot_dir() -> Path | None:
    """In a worker, before its model loads: point its FlashInfer at the AOT directory its
    engine's main process made (:attr:`Handoff.flashinfer_aot_dir`; each hook calls it, the
    same each time); the directory, or
    ``None`` when there is none (or FlashInfer is not importable). Never raises."""
    staged = Handoff.from_environment().flashinfer_aot_dir
    if staged is None:
        return None
    try:
        return staged if use_aot_dir(staged) else None
    except Exception as exc:
        log.warning("tunecache: FlashInfer JIT modules not pointed at: %s: %s", type(exc).__name__, exc)
        return None


@dataclass(frozen=True)
class _Staged:
    warm_state: dict[ArtifactKind, bytes]


#: Fetches an engine variant's compile cache: ``(run id, tarball)``, or ``None`` when the
#: service has no run of that variant (:func:`fetch_variant_compile_cache`).
VariantFetch = Callable[[str], "tuple[int, TarSource] | None"]


def fetch_variant_compile_cache(settings: ClientSettings, key: TuningKey, environment: EnvironmentMetadata,
                                variant: str) -> tuple[int, TarSource] | None:
    """The compile cache of engine variant ``variant``'s current run, as :func:`fetch_tuning`
    fetches a run (the lookup with the variant, the signature over this pod's key and
    environment, the variant's own rollback memory, the sha256), its kinds that are ``of_variant``
    (:data:`tunecache.contract.KINDS`: Triton's cache) merged into this pod's (the kernels the
    key's run lacks): ``(run id, tarball)``;
    ``None`` when the service has no run of the variant (it answered the key's, of another
    variant), or the run has no compile cache.

    Raises:
        whatever :func:`fetch_tuning` raises; ``UntrustedRun`` when no trusted keys are set
        (a compile cache is code the pod loads).
    """
    from tunecache.client.installed import remember_installed
    from tunecache.formats.dependencies import image_of
    from tunecache.signing import UntrustedRun

    if not settings.trusted_keys:
        raise UntrustedRun("a compile cache installs only from a run signed by a trusted key, and no trusted keys "
                           "are set (TUNECACHE_TRUSTED_KEYS)")
    with TunecacheClient.from_settings(settings) as client:
        fetched = fetch_tuning(client, key, environment, trusted_keys=load_trusted_keys(settings.trusted_keys),
                               deadline_s=install_deadline(settings), warm_state=True, variant=variant,
                               warm_state_kinds=(ArtifactKind.VLLM_COMPILE_CACHE, *kinds_where(of_variant=True)))
    data = fetched.warm_state.get(ArtifactKind.VLLM_COMPILE_CACHE)
    if fetched.run.variant != variant or data is None or fetched.executable_refused:
        return None
    for kind in kinds_where(of_variant=True):  # the variant's own (Triton's kernels) beside the key's run's
        if kind in fetched.warm_state:
            destinations_of(kind)[0]().stage(fetched)()
    remember_installed(key, environment, fetched.run.signature.signed_at if fetched.run.signature else None, variant,
                       image_of(fetched.run.summary.get("dependencies")))
    return fetched.run.id, data


#: How long a worker waits for its engine's main process to unpack the staged compile cache
#: (:func:`unpack_staged`) before it unpacks the tarball itself.
UNPACK_WAIT_S = 30.0


def unpacked_dir(staged: Path) -> Path:
    """Where :func:`unpack_staged` unpacks the staged tarball ``staged``: beside it, named by
    this boot (:func:`tunecache.client.report.boot_id`, which the engine's workers inherit)."""
    from tunecache.client.report import boot_id

    return staged.with_name(staged.name.removesuffix(".tar.gz") + f"-{boot_id()}")


def unpack_staged(staged: Path, data: TarSource) -> None:
    """In the engine's main process, on a thread: unpack ``data`` (checked as every warm-state
    tarball is) into :func:`unpacked_dir`, staged beside it and renamed when whole; on a
    failure, ``<dir>.failed`` says why (the workers then unpack the tarball themselves).
    What earlier boots left there is removed first (:func:`_remove_stale`). Never raises."""
    import shutil
    import tempfile

    from tunecache.client.unpack import unpack
    from tunecache.client.warm_state import BadWarmStateArtifact

    target = unpacked_dir(staged)
    try:
        remove_stale(staged.parent.glob(staged.name.removesuffix(".tar.gz") + "-*"))
        staging = Path(tempfile.mkdtemp(prefix=".unpack-", dir=staged.parent))
        try:
            unpack(data, staging, "vllm_compile_cache", BadWarmStateArtifact)  # one pass
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        staging.rename(target)
    except Exception as exc:  # the workers unpack it themselves
        try:
            write_atomically(target.with_name(target.name + ".failed"), f"{type(exc).__name__}: {exc}".encode())
        except OSError:
            pass


def _wait_unpacked(staged: Path) -> Path | None:
    """The directory the engine's main process unpacked ``staged`` into, once it is there
    (at most :data:`UNPACK_WAIT_S`); ``None`` when it failed, took too long, or is none."""
    target = unpacked_dir(staged)
    failed = target.with_name(target.name + ".failed")
    give_up = time.monotonic() + UNPACK_WAIT_S
    while time.monotonic() < give_up:
        if target.is_dir():
            return target
        if failed.exists():
            return None
        time.sleep(0.01)
    return None


def _variant_cache(staged: Path, variant: str, fetch: VariantFetch | None) -> tuple[int, TarSource] | None:
    """The compile cache of ``variant`` for this engine: fetched once per boot (by the first
    worker, under the staged cache's lock) and kept beside the staged one for the boot's other
    workers (named by the boot: a later boot asks the service again); ``None`` when the service
    has none (remembered for the boot too)."""
    import glob

    from tunecache.client.report import boot_id

    prefix = f"compile-cache-variant-{variant}-{boot_id()}-run-"
    for found in sorted(glob.glob(os.path.join(glob.escape(str(staged.parent)), glob.escape(prefix) + "*.tar.gz"))):
        run = Path(found).name[len(prefix):-len(".tar.gz")]
        if run.isdigit():
            return int(run), Path(found)
    missing = staged.parent / f"compile-cache-variant-{variant}-{boot_id()}.missing"
    if missing.exists() or fetch is None:
        return None
    remove_stale(staged.parent.glob(f"compile-cache-variant-{variant}-*"))  # earlier boots'
    got = fetch(variant)
    if got is None:
        write_atomically(missing, b"")
        return None
    write_atomically(staged.parent / f"{prefix}{got[0]}.tar.gz", got[1])
    return got


def install_staged_compile_cache(pod_factors: Callable[[CompileFactors], PodCompileFactors], rank: int,
                                 fetch_variant: VariantFetch | None = None) -> InstallResult | None:
    """In a worker, right before its vLLM compiles: install the compile cache its engine's
    main process staged (:attr:`Handoff.compile_cache`) under the directory names
    ``pod_factors`` (this worker's factors, from its own ``VllmConfig``) give, or name each
    factor that differs; the workers of one engine take turns under a lock (the first
    installs, the others find the directories in place).

    When this worker's engine variant is not the staged run's (another ``max_model_len``,
    compilation setting, ...), the variant's own compile cache is fetched (``fetch_variant``,
    once per engine) and installed instead; when the service has none, the line names how the
    variants differ and the reports say the variant is missing (vLLM compiles; the rest of the
    warm state is installed all the same). Logs one line; never raises."""
    handoff = Handoff.from_environment()
    if handoff.compile_cache is None:
        return None
    started = time.monotonic()
    try:
        path = handoff.compile_cache
        unpacked = _wait_unpacked(path)
        if unpacked is not None and (unpacked / FACTORS_FILE).is_file():
            data = None
            node = CompileFactors.model_validate_json((unpacked / FACTORS_FILE).read_bytes())
        else:
            unpacked, data = None, path
            node = read_compile_factors(data)
        if node is None:
            raise ValueError("the run's compile cache records no factors")
        factors = pod_factors(node)
        run = str(handoff.warm_state_run or "?")
        mine = factors.variant_factors.variant if factors.variant_factors else None
        theirs = node.variant_factors.variant if node.variant_factors else None
        variant_seen.variant, variant_seen.missing = mine, False
        with file_lock(path.with_suffix(".lock"), DEFAULT_INSTALL_DEADLINE_S):
            if mine and theirs and mine != theirs:
                found = _variant_cache(path, mine, fetch_variant)
                if found is None:
                    variant_seen.missing = True
                    named = "; ".join(variant_differences(node.variant_factors, factors.variant_factors))
                    skipped = (f"compile cache not installed, vLLM will compile: no warm state is stored for this "
                               f"engine variant ({mine}; run {run} is variant {theirs}, which differs in: {named}); "
                               f"reported to the service as missing")
                    log.info("tunecache: %s (rank %s)", skipped, rank)
                    return InstallResult(outcome=ReportOutcome.INSTALLED, compile_cache_skipped=skipped)
                run, data, unpacked = str(found[0]), found[1], None
                variant_seen.run = found[0]
                node = read_compile_factors(data)
                if node is None:
                    raise ValueError(f"run {run}'s compile cache records no factors")
                factors = pod_factors(node)
            if unpacked is not None:  # unpacked by the main process: renamed into place
                lines = engine_for("vllm").compile_cache_differences(node, factors)
                renames = {} if lines else engine_for("vllm").compile_cache_names(node, factors)
                dirs = rename_entries(unpacked, path.parent.parent / "torch_compile_cache", renames, replace=True)
                removed = relocate_compile_dirs(path.parent.parent / "torch_compile_cache", dirs)
                moved = relocate_node_paths(path.parent.parent / "torch_compile_cache", dirs, node, factors, renames)
                written = {"warm_state": (f"compile cache ({len(dirs)} of {len(renames)} directories"
                                          f"{'; ' + moved if moved else ''})",) if renames else (),
                           "compile_cache_skipped": ("compile cache not installed, vLLM would not use it: "
                                                     + "; ".join(lines)) if lines else removed}
            else:
                written = VllmCacheRoot(path.parent.parent, factors, modelinfos=False).stage(
                    _Staged({ArtifactKind.VLLM_COMPILE_CACHE: data}))()
        result = InstallResult(outcome=ReportOutcome.INSTALLED, **written)
        if result.compile_cache_skipped:
            log.info("tunecache: %s (rank %s)", result.compile_cache_skipped, rank)
        else:
            variant = f" (engine variant {mine})" if mine and mine != theirs else ""
            log.info("tunecache: %s from run %s%s, under the names this worker's vLLM config gives (rank %s, %.2f s)",
                     ", ".join(result.warm_state) or "compile cache already in place", run, variant, rank,
                     time.monotonic() - started)
        return result
    except Exception as exc:
        log.warning("tunecache: compile cache not installed, vLLM will compile: %s: %s", type(exc).__name__, exc)
        return InstallResult.of_failure(exc)
