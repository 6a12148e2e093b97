"""Installing a run's tactics and DeepGEMM cache where vLLM and FlashInfer read them.

Where that is (vLLM's per-rank autotune root and file names, FlashInfer's v2 store root,
DeepGEMM's cache directory) is the engine adaptor's knowledge
(:mod:`tunecache.engines.vllm.paths`); this module writes there:

* every rank's v1 file of one vLLM deployment (:func:`install_vllm_rank_files`);
* FlashInfer's v2 store, written with FlashInfer's own ``ManagedAutotuneCache.publish``
  (:func:`install_v2_store`);
* DeepGEMM's JIT cache, a ``cache/kernel.<name>.<hash>/`` directory per compiled kernel
  (``csrc/jit/compiler.hpp::Compiler::build``), the fetched kernels merged in
  (:func:`install_deep_gemm_cache`). (Measured on an H200 with the DeepGEMM vLLM 0.25 ships: a
  colon-separated list is taken as one path, so a second "read-only root" is never read.)

Each is a destination of its kind (:class:`FlashInferFile`, :class:`VllmRankFiles`,
:class:`FlashInferV2Store` for the tactics, :class:`DeepGemmCache`), registered against it
(:mod:`tunecache.client.destinations`). Nothing a run carries becomes part of a path. Every
install is all-or-nothing: written into a
temporary directory beside the target and renamed into place.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunecache.client.atomic import (
    directory_lock,
    note_added,
    staging_dir,
    swap_into_place,
    write_atomically,
)
from tunecache.client.destinations import Commit, Destination, registers
from tunecache.contract import ArtifactKind
from tunecache.engines.vllm.paths import (
    deep_gemm_cache_dir,
    flashinfer_v2_root,
    vllm_autotune_root,
)
from tunecache.formats.tarball import TarSource, max_unpack_files


def install_vllm_rank_files(data: bytes, root: Path, config_hash: str, file_names: list[str]) -> list[Path]:
    """Write ``data`` as every rank's file under ``root/config_hash/``, all at once.

    Args:
        data: a FlashInfer v1 autotune file.
        file_names: the file of every process of the pod, as vLLM names it: vLLM 0.33's
            :func:`tunecache.engines.vllm.paths.vllm_rank_file_name` per ``(dp_rank, rank)``, or vLLM 0.25's single
            ``autotune_configs.json`` (``resolve_flashinfer_autotune_file``).

    Returns the paths written. Raises OSError (disk full, permissions); then nothing changed.
    """
    if not file_names:
        raise ValueError("no ranks to install for")
    root.mkdir(parents=True, exist_ok=True)
    staging = staging_dir(root)
    try:
        for name in file_names:
            path = staging / name
            path.write_bytes(data)
            path.chmod(0o644)
        staging.chmod(0o755)
        with directory_lock(root):
            swap_into_place(staging, root / config_hash)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return [root / config_hash / name for name in file_names]




def install_v2_store(data: bytes, root: Path) -> Path:
    """Publish every entry of a v1 file into FlashInfer's v2 store under ``root``.

    Uses FlashInfer's own ``flashinfer.autotune_cache.ManagedAutotuneCache`` (manifest =
    the file's ``_metadata``, as ``autotune_v2`` builds it from ``_collect_metadata()``),
    in a staging root, then renames ``v2/<env_hash>`` into place. Returns that directory.

    Raises:
        ImportError: flashinfer is not importable (the v2 format is FlashInfer's to write).
        ValueError: more entries than ``TUNECACHE_MAX_UNPACK_FILES``.
    """
    from flashinfer.autotune_cache import ManagedAutotuneCache

    doc = json.loads(data)
    entries = sum(1 for key in doc if not key.startswith("_"))
    if entries > max_unpack_files():  # one file per entry: bounded as a tarball's entries are
        raise ValueError(f"autotune file of {entries:,} entries: the v2 store would take more than "
                         f"{max_unpack_files():,} files (TUNECACHE_MAX_UNPACK_FILES)")
    root.mkdir(parents=True, exist_ok=True)
    staging = staging_dir(root)
    try:
        store = ManagedAutotuneCache(doc["_metadata"], root=staging)
        for key, value in doc.items():
            if key.startswith("_"):
                continue
            runner, tactic = value[0], value[1]
            policy = tuple(value[2]) if len(value) > 2 and value[2] is not None else None
            store.publish(key, runner, tactic, profiling_policy=policy)
        written = len(list(store.entries_dir.glob("*.json")))
        expected = entries
        if written != expected:  # publish() logs and carries on when a write fails
            raise OSError(f"FlashInfer v2 store: {written} of {expected} entries could be written under {root}")
        target = root / "v2" / store.env_hash
        with directory_lock(target.parent):
            swap_into_place(store.env_dir, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target




def install_deep_gemm_cache(data: TarSource, cache_dir: Path) -> list[str]:
    """Merge the kernels of a DeepGEMM JIT cache tarball (``deep_gemm_jit_cache`` artifact:
    ``cache/kernel.<name>.<hash>/`` directories, as DeepGEMM's ``Compiler::build`` writes
    them) into ``cache_dir/cache/``.

    DeepGEMM names a kernel's directory by the hash of its name, compiler signature (NVCC or
    NVRTC version), flags without the library's include path, and code, and looks it up
    there before compiling; it publishes a kernel by renaming a whole directory into place.
    The same is done here: each kernel directory the pod lacks is staged beside and renamed
    in; one it has (same name, so same kernel) is left as it is. Nothing else of the tarball
    (DeepGEMM's ``tmp/``) is installed.

    Returns the kernel directory names installed (possibly none).

    Raises:
        ValueError: the tarball holds absolute or ``..`` paths, links or special files, or is
            past the unpack bounds (:func:`tunecache.formats.tarball.open_bounded`).
        OSError: writing failed (kernels already renamed in stay: each is whole).
    """
    staging = stage_deep_gemm_cache(data, cache_dir)
    return merge_deep_gemm_kernels(staging, cache_dir)


def stage_deep_gemm_cache(data: TarSource, cache_dir: Path) -> Path:
    """The first half of :func:`install_deep_gemm_cache`: ``data`` unpacked in one pass beside
    ``cache_dir/cache/``, each entry checked as it arrives, nothing renamed in; returns the
    staging directory (:func:`tunecache.client.unpack.unpack_beside`).

    Raises:
        ValueError: an unsafe entry, past the unpack bounds; OSError: writing failed."""
    from tunecache.client.unpack import unpack_beside

    return unpack_beside(data, cache_dir / "cache", "DeepGEMM cache", ValueError)


def merge_deep_gemm_kernels(staging: Path, cache_dir: Path) -> list[str]:
    """The second half of :func:`install_deep_gemm_cache`: each kernel directory of ``staging``
    that ``cache_dir/cache/`` lacks renamed in; the staging directory goes, whatever happens.

    Raises:
        OSError: writing failed (kernels already renamed in stay: each is whole)."""
    from tunecache.client.unpack import discard

    kernels = cache_dir / "cache"
    try:
        installed = []
        found = staging / "cache"
        for kernel in sorted(found.iterdir()) if found.is_dir() else []:
            if not (kernel.is_dir() and kernel.name.startswith("kernel.")) or (kernels / kernel.name).exists():
                continue
            kernel.chmod(0o755)
            note_added(kernels / kernel.name, kernel)
            try:
                kernel.rename(kernels / kernel.name)
            except OSError:
                if not (kernels / kernel.name).is_dir():  # not another process's identical kernel
                    raise
                continue
            installed.append(kernel.name)
    finally:
        discard(staging)
    return installed


def check_file_name(name: str) -> str:
    """A plain file name (no directory parts, not hidden).

    Raises:
        ValueError: naming what is wrong.
    """
    if not name or "/" in name or "\\" in name or name.startswith(".") or name != Path(name).name:
        raise ValueError(f"file name {name!r} must be a plain name without directories, not starting with '.'")
    return name


@registers(ArtifactKind.FLASHINFER_AUTOTUNE)
@dataclass(frozen=True)
class FlashInferFile(Destination):
    """The tactics as a plain FlashInfer cache file ``directory/name``, for
    ``flashinfer.autotune(False, cache=PATH)`` or ``AutoTuner.get().load_configs(PATH)``.

    Raises:
        ValueError: (when made) ``name`` has directory parts or is hidden.
    """

    directory: Path
    name: str

    def __post_init__(self) -> None:
        check_file_name(self.name)

    def stage(self, fetched: Any) -> Commit:
        path = Path(self.directory) / self.name

        def commit() -> dict[str, Any]:
            write_atomically(path, fetched.autotune)
            return {"paths": (path,)}

        return commit


@registers(ArtifactKind.FLASHINFER_AUTOTUNE)
@dataclass(frozen=True)
class VllmRankFiles(Destination):
    """The tactics as every rank's v1 file of one vLLM deployment, ``root/config_hash/<name>``
    for each of ``file_names`` (:func:`tunecache.engines.vllm.paths.vllm_rank_file_name`, or vLLM
    0.25's single ``autotune_configs.json``), all at once
    (:func:`install_vllm_rank_files`); ``root`` ``None``: this pod's
    own (:func:`tunecache.engines.vllm.paths.vllm_autotune_root`, resolved before anything is written)."""

    config_hash: str
    file_names: tuple[str, ...]
    root: Path | None = None

    def stage(self, fetched: Any) -> Commit:
        root = Path(self.root) if self.root is not None else vllm_autotune_root()
        return lambda: {"paths": tuple(install_vllm_rank_files(fetched.autotune, root, self.config_hash,
                                                               list(self.file_names)))}


@registers(ArtifactKind.FLASHINFER_AUTOTUNE)
@dataclass(frozen=True)
class FlashInferV2Store(Destination):
    """The tactics published into FlashInfer's v2 store under ``root``
    (:func:`install_v2_store`); ``None``: this pod's own
    (:func:`tunecache.engines.vllm.paths.flashinfer_v2_root`, resolved before anything is written)."""

    root: Path | None = None

    def stage(self, fetched: Any) -> Commit:
        root = Path(self.root) if self.root is not None else flashinfer_v2_root()
        return lambda: {"paths": (install_v2_store(fetched.autotune, root),)}


@registers(ArtifactKind.DEEP_GEMM_JIT_CACHE)
@dataclass(frozen=True)
class DeepGemmCache(Destination):
    """The run's DeepGEMM JIT cache (when it has one), its kernels merged into ``path``
    (:func:`install_deep_gemm_cache`); ``None``: this pod's own
    DeepGEMM cache directory (:func:`tunecache.engines.vllm.paths.deep_gemm_cache_dir`). Left
    out, saying why, where the pod's vLLM warms DeepGEMM up with another M set than the one
    the run's cache was made with (:mod:`tunecache.engines.vllm.deep_gemm`)."""

    path: Path | None = None
    vllm_version: str | None = None
    """The pod's vLLM (``None``: ``vllm.__version__`` here), whose DeepGEMM warmup M set the run's
    cache must have been made with (:func:`tunecache.engines.vllm.deep_gemm.m_set_refusal`)."""

    def _refusal(self, run: Any) -> str | None:
        from tunecache.engines import engine_for
        from tunecache.engines.vllm.deep_gemm import M_SET_FIELD, m_set_refusal

        adaptor = engine_for("vllm")
        if self.vllm_version is not None:
            version, release = self.vllm_version, adaptor.release_of(self.vllm_version)
        else:
            try:
                version, release = adaptor.this_release()
            except Exception:  # no vLLM here: nothing to tell
                return None
        return m_set_refusal((getattr(run, "summary", None) or {}).get(M_SET_FIELD), version, release)

    def preflight(self, run: Any, kind: ArtifactKind) -> tuple[bool | None, str]:
        refused = self._refusal(run)
        if refused:
            return False, refused
        return True, f"merged into {Path(self.path) if self.path is not None else deep_gemm_cache_dir()}"

    def stage(self, fetched: Any) -> Commit:
        if fetched.deep_gemm is None:
            return dict
        refused = self._refusal(fetched.run)
        if refused:
            return lambda: {"warm_state": (f"DeepGEMM cache not installed, {refused}",)}
        directory = Path(self.path) if self.path is not None else deep_gemm_cache_dir()
        staging = stage_deep_gemm_cache(fetched.deep_gemm, directory)  # unpacked and checked now, renamed in by the commit

        def commit() -> dict[str, Any]:
            kernels = merge_deep_gemm_kernels(staging, directory)
            return {"deep_gemm_dir": directory, "warm_state": (f"DeepGEMM cache ({len(kernels)} kernels)",)}

        return commit
