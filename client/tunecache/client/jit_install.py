"""Install FlashInfer JIT modules fetched from tunecache into the pod's FlashInfer workspace.

Each artifact is one module's tarball (:mod:`tunecache.formats.jit_module`):
``cached_ops/<module>/...`` and ``generated/<module>/...`` relative to the workspace
``$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer/<version>/<archs>``. FlashInfer then
finds the built ``.so`` and ninja finds nothing to rebuild, provided the pod's
workspace, FlashInfer and CUDA paths equal the tuning node's (same image).

Where modules go is the pod's own business: its FlashInfer's workspace
(:func:`flashinfer_workspace`) or a directory the pod names. What a run records about
the tuning node's workspace is compared with the pod's, never made into a path.

A pod whose paths differ from the node's (another ``HOME``, workspace, package prefix or
CUDA directory) would have ninja rebuild every module, since ``build.ninja`` and ninja's log
name the node's paths. Through the vLLM plugin such a pod loads the modules without ninja:
FlashInfer loads ``<FLASHINFER_AOT_DIR>/<name>/<name>.so`` as a prebuilt module whenever it
exists (``flashinfer/jit/core.py::JitSpec.build_and_load`` and ``is_aot``; the directory is
``flashinfer.jit.env.FLASHINFER_AOT_DIR``, read at each load, which FlashInfer keeps as a
module attribute so that its own AOT build can point it elsewhere). :func:`build_aot_dir`
makes a directory of the pod's own, inside its workspace, that holds every module of the
image's own AOT directory and the installed ones; :func:`use_aot_dir` points this process's
FlashInfer at it (each vLLM worker, before its model loads).
"""

from __future__ import annotations

import contextlib
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from tunecache.client.atomic import directory_lock, staging_dir, swap_into_place
from tunecache.client.destinations import Commit, Destination, registers
from tunecache.contract import ArtifactKind, TuningRunRead
from tunecache.client.unpack import discard, unpack_beside
from tunecache.formats.jit_module import (
    JIT_PLACEMENT_FIELDS,
    JIT_VALIDITY_FIELDS,
    BadJitArtifact,
    jit_entry_module,
    jit_environment,
    one_module,
)
from tunecache.formats.tarball import TarSource

#: The directory :func:`build_aot_dir` makes inside the pod's FlashInfer workspace.
AOT_DIR_NAME = "tunecache-aot"


def shown(value: object, limit: int = 200) -> str:
    """A value a run recorded, fit for one log line: control characters escaped, at most
    ``limit`` characters (it comes from the server, so it may hold anything)."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(value))
    return text if len(text) <= limit else text[:limit] + "..."


def jit_mismatches(recorded: dict, here: dict[str, str] | None, placement: bool = True) -> list[str]:
    """``"field: node X, here Y"`` for every validity field recorded with a run that differs
    here (nothing when the run recorded none or this process cannot tell); ``placement=False``:
    the fields of :data:`JIT_PLACEMENT_FIELDS` left out (modules loaded through the AOT path)."""
    if here is None:
        return []
    return [f"{field}: node {shown(recorded[field])}, here {here.get(field)}" for field in JIT_VALIDITY_FIELDS
            if field in recorded and str(recorded[field]) != here.get(field)
            and (placement or field not in JIT_PLACEMENT_FIELDS)]


def build_aot_dir(workspace: Path, modules: list[str] | tuple[str, ...], image_aot_dir: Path | None) -> Path:
    """``<workspace>/tunecache-aot``: one entry per module, a link to the image's own AOT
    module of that name (``image_aot_dir``, FlashInfer's ``FLASHINFER_AOT_DIR`` before it is
    pointed here: those won before and still do) or else to the installed module's directory
    ``<workspace>/cached_ops/<name>``. Made beside its place and swapped in whole (the pod's
    other processes install the same modules); every path is this pod's own."""
    target = workspace / AOT_DIR_NAME
    staging = staging_dir(workspace, ".tunecache-aot-")
    try:
        own = image_aot_dir is not None and Path(image_aot_dir).resolve() == target.resolve()
        image = (sorted(p for p in image_aot_dir.iterdir() if p.is_dir())
                 if image_aot_dir is not None and not own and image_aot_dir.is_dir() else [])
        for found in image:
            (staging / found.name).symlink_to(found, target_is_directory=True)
        for name in modules:
            built = workspace / "cached_ops" / name
            if not (staging / name).exists() and (built / f"{name}.so").is_file():
                (staging / name).symlink_to(built, target_is_directory=True)
        with directory_lock(workspace):
            swap_into_place(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def use_aot_dir(directory: Path) -> bool:
    """Point this process's FlashInfer at ``directory`` as its AOT directory
    (``flashinfer.jit.env.FLASHINFER_AOT_DIR``), so that it loads the modules there without
    ninja; ``False`` where FlashInfer is not importable or the directory is gone."""
    if not Path(directory).is_dir():
        return False
    try:
        from flashinfer.jit import env as jit_env
    except Exception:
        return False
    jit_env.FLASHINFER_AOT_DIR = Path(directory)
    return True


def image_aot_dir() -> Path | None:
    """This process's FlashInfer AOT directory (``flashinfer.jit.env.FLASHINFER_AOT_DIR``:
    ``flashinfer-jit-cache``'s, else ``<flashinfer>/data/aot``), ``None`` without FlashInfer."""
    try:
        from flashinfer.jit import env as jit_env

        return Path(jit_env.FLASHINFER_AOT_DIR)
    except Exception:
        return None


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


def unpack_jit_module(data: TarSource, workspace: Path) -> tuple[str, Path]:
    """Unpack one module's tarball in one pass into a staging directory inside ``workspace``
    (:func:`tunecache.client.unpack.unpack`), each entry checked as it arrives
    (:func:`tunecache.formats.jit_module.jit_entry_module`, the refusals of
    :func:`~tunecache.formats.jit_module.check_jit_module`), files keeping their modification
    times to the nanosecond; returns ``(module name, staging directory)``.

    Raises:
        BadJitArtifact: the tarball is not one module's files (nothing is left behind).
    """
    modules: set[str] = set()
    staging = unpack_beside(data, workspace, "JIT", BadJitArtifact,
                            check=lambda member: modules.add(jit_entry_module(member)))
    try:
        return one_module(modules), staging
    except BaseException:
        discard(staging)
        raise


def place_jit_module(module: str, staging: Path, workspace: Path) -> None:
    """Rename an unpacked module's directories (:func:`unpack_jit_module`) into ``workspace``,
    each swapped in whole under the workspace's lock; the staging directory goes."""
    try:
        with directory_lock(workspace):  # the pod's other workers install the same modules
            for top in ("cached_ops", "generated"):
                unpacked = staging / top / module
                if unpacked.is_dir():
                    (workspace / top).mkdir(exist_ok=True)
                    swap_into_place(unpacked, workspace / top / module)
    finally:
        discard(staging)


def install_jit_module(data: TarSource, workspace: Path) -> str:
    """Unpack one module's tarball into ``workspace``; returns the module name.

    The module's directories are unpacked beside their targets in one pass
    (:func:`unpack_jit_module`) and renamed into place (:func:`place_jit_module`), so
    FlashInfer never sees half a module; files keep their modification times to the
    nanosecond, as ninja compares them (a rounded time makes ninja rebuild the module).
    Several processes may install into one workspace at once (a pod's workers): the swaps
    are serialized (:func:`tunecache.client.atomic.directory_lock`) and each succeeds.

    Raises:
        BadJitArtifact: the tarball is not one module's files.
    """
    module, staging = unpack_jit_module(data, workspace)
    place_jit_module(module, staging, workspace)
    return module


@registers(ArtifactKind.FLASHINFER_JIT_MODULE)
@dataclass(frozen=True)
class JitWorkspace(Destination):
    """The run's FlashInfer JIT modules, unpacked into ``path``: a directory this pod names
    (``tunecache pull --jit-workspace DIR``; used as given), or ``None``: this pod's
    FlashInfer workspace as this pod's FlashInfer says
    (:func:`tunecache.client.jit_install.flashinfer_workspace`), after checking that the
    modules were built where they will load.

    Nothing the run carries picks the directory: the node's ``workspace_subdir`` it records
    is only compared with this pod's.

    Nothing of the modules is written (the tactics are installed apart) and
    ``InstallResult.jit_skipped`` says why in one line when the run's were not fetched
    (unsigned: :attr:`tunecache.client.install.FetchedTuning.executable_refused`), or, with ``None``: FlashInfer is not
    importable here (this pod cannot tell its workspace), or the run's ``workspace_subdir``
    (FlashInfer version and arch) or a validity field it recorded
    (:data:`tunecache.formats.jit_module.JIT_VALIDITY_FIELDS`) differs here, so ninja would
    rebuild the modules or fail; each difference is named.

    ``loads_as_aot``: this pod's FlashInfer will load the modules through its AOT path (the
    vLLM plugin's workers, :func:`tunecache.client.jit_install.use_aot_dir`), not ninja, so
    only the fields that are not placement
    (:data:`tunecache.formats.jit_module.JIT_PLACEMENT_FIELDS`) must be equal: the modules go
    into this pod's workspace whatever its paths, and the result names the AOT directory made
    for them (:func:`tunecache.client.jit_install.build_aot_dir`, ``jit_aot_dir``).
    """

    path: Path | None = None
    loads_as_aot: bool = False

    def _workspace(self, fetched: Any) -> tuple[Path | None, str | None]:
        """``(directory, None)`` to install the fetched modules into, or ``(None, why not)``
        (``(None, None)``: the run has none)."""
        if not fetched.jit_modules:
            return None, fetched.executable_refused
        if self.path is not None:
            return Path(self.path), None
        count = len(fetched.jit_modules)
        differs = getattr(fetched, "drift", {}).get(ArtifactKind.FLASHINFER_JIT_MODULE)
        if differs:
            return None, f"{count} FlashInfer JIT modules not installed, built with other packages: {differs}"
        own = flashinfer_workspace()
        if own is None:
            return None, (f"{count} FlashInfer JIT modules not installed: FlashInfer is not importable here, so this "
                          "pod's FlashInfer workspace is unknown (tunecache pull --jit-workspace DIR names one)")
        recorded = fetched.run.summary.get("flashinfer_jit")
        mismatches = jit_mismatches(recorded if isinstance(recorded, dict) else {}, jit_environment(),
                                    placement=not self.loads_as_aot)
        if fetched.workspace_subdir and fetched.workspace_subdir != own.subdir:
            mismatches.insert(0, f"workspace_subdir: node {shown(fetched.workspace_subdir)}, here {own.subdir}")
        if mismatches:
            return None, f"{count} FlashInfer JIT modules not installed, built elsewhere: " + "; ".join(mismatches)
        return own.path, None

    def _checks_includes(self) -> bool:
        """Whether the modules load through ninja here (a directory the pod named, or not
        through the AOT path), so an include directory their ``build.ninja`` names must exist."""
        return self.path is not None or not self.loads_as_aot

    @staticmethod
    def _drop(staged: list[tuple[str, Path]], workspace: Path, existed: bool) -> None:
        """Remove what :meth:`stage` unpacked (and the workspace, when it made it)."""
        for _, staging in staged:
            discard(staging)
        if not existed:
            with contextlib.suppress(OSError):
                workspace.rmdir()

    @staticmethod
    def _missing_includes(staged: list[tuple[str, Path]], count: int) -> str | None:
        """Why the modules are not installed when one's ``build.ninja`` (read from its unpacked
        files) names an include directory this pod lacks (ninja, which loads a module not loaded
        through the AOT path, would fail on it or build again); ``None``: none does."""
        from tunecache.formats.dependencies import include_dirs_missing

        for module, staging in staged:
            ninja = staging / "cached_ops" / module / "build.ninja"
            if not ninja.is_file():
                continue
            with ninja.open("rb") as f:
                missing = include_dirs_missing(f.read(1 << 20).decode(errors="replace"))
            if missing:
                return (f"{count} FlashInfer JIT modules not installed: module {module}'s build.ninja "
                        f"names include directories this pod lacks: {', '.join(shown(m) for m in missing[:3])}")
        return None

    def preflight(self, run: TuningRunRead, kind: ArtifactKind) -> tuple[bool | None, str]:
        """This pod's FlashInfer workspace subdirectory (version, arch) and CUDA version against
        the node's (:func:`tunecache.client.jit_install.jit_mismatches`): through the vLLM plugin
        the modules load through FlashInfer's AOT path, so the workspace, package and CUDA paths
        may differ; installed by ``tunecache pull --jit`` they must not (ninja's files name them)."""
        count = len(run.artifacts_of(kind))
        own = flashinfer_workspace()
        if own is None:
            return False, f"{count} modules: FlashInfer is not importable here"
        recorded = run.summary.get("flashinfer_jit")
        recorded = recorded if isinstance(recorded, dict) else {}
        here = jit_environment()
        subdir = str(recorded.get("workspace_subdir") or "")
        differ = ([f"workspace_subdir: node {shown(subdir)}, here {own.subdir}"] if subdir and subdir != own.subdir else [])
        as_aot = differ + jit_mismatches(recorded, here, placement=False)
        if as_aot:
            return False, f"{count} modules built for another FlashInfer or CUDA: " + "; ".join(as_aot)
        placed = jit_mismatches(recorded, here, placement=True)
        without = ("; installed without the plugin (tunecache pull --jit) ninja would rebuild them: "
                   + "; ".join(placed)) if placed else ""
        return True, (f"{count} modules, through the vLLM plugin from this pod's workspace "
                      f"{own.path} (FlashInfer's AOT path){without}")

    def stage(self, fetched: Any) -> Commit:
        workspace, skipped = self._workspace(fetched)
        if workspace is not None and skipped:  # a directory the pod named, but a module that would not build there
            workspace = None
        asked = len(fetched.run.artifacts_of(ArtifactKind.FLASHINFER_JIT_MODULE))

        image = image_aot_dir() if self.loads_as_aot and workspace else None

        why, staged = skipped, []
        if workspace is not None:  # every module unpacked and checked before anything is written
            existed = workspace.exists()
            try:
                for blob in fetched.jit_modules:
                    staged.append(unpack_jit_module(blob, workspace))
                why = self._missing_includes(staged, len(staged)) if self._checks_includes() else None
            except BaseException:
                self._drop(staged, workspace, existed)
                raise
            if why is not None:
                self._drop(staged, workspace, existed)
                staged = []

        def commit() -> dict[str, Any]:
            modules = tuple(module for module, _ in staged)
            try:
                for module, staging in staged:
                    place_jit_module(module, staging, workspace)
            finally:
                self._drop(staged, workspace, True)
            aot = build_aot_dir(workspace, modules, image) if self.loads_as_aot and modules else None
            return {"jit_modules": modules, "jit_workspace": workspace if why is None else None, "jit_skipped": why,
                    "jit_not_installed": max(0, asked - len(modules)), "jit_aot_dir": aot}

        return commit
