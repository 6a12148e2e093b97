"""The JIT caches vLLM 0.33/0.34's warmup fills besides Triton's, and installing a run's into
this pod's own: TileLang's, the CuTe DSL's and TVM-FFI's.

Each is one directory whose entries are named by a hash of what they were built from, so a run's
is merged file by file into this pod's directory (a file the pod has stays as it is, the same
name being the same content), each file staged beside its place and renamed in whole; the
tarball's entries are checked first (no absolute or ``..`` paths, links or special files).
The directory is the one the package itself reads, read from each package's own code:

* TileLang (``tilelang``): ``tilelang.env.env.TILELANG_CACHE_DIR``, the variable
  ``TILELANG_CACHE_DIR``, default ``~/.tilelang/cache`` (``tilelang/env.py``:
  ``EnvVar("TILELANG_CACHE_DIR", os.path.expanduser("~/.tilelang/cache"))``); its kernel cache
  (``tilelang/cache/kernel_cache.py``) and autotuner (``autotuner/``) live under it.
* The CuTe DSL (``nvidia-cutlass-dsl``): ``cutlass.base_dsl.cache_helpers.
  get_default_generated_ir_path("CUTE_DSL")``: ``CUTE_DSL_CACHE_DIR``, else
  ``$TMPDIR/<user>/cutlass_python_cache`` (``tempfile.gettempdir()`` without ``TMPDIR``; the
  user from ``USER``, ``USERNAME`` or ``pwd``); ``compile_backend`` loads
  ``cute_dsl_<module hash>.mlir`` from it (``load_cache_from_path``) unless
  ``CUTE_DSL_DISABLE_FILE_CACHING`` is set.
* TVM-FFI (``apache-tvm-ffi``): ``TVM_FFI_CACHE_DIR``, else ``~/.cache/tvm-ffi``, read inline
  by ``tvm_ffi.cpp.extension.build``/``load`` (no function to call): one
  ``<name>_<source hash>/`` build directory per extension, rebuilt by ninja only when its
  inputs are newer than its outputs (the tarball keeps the files' times).

The package's own function is called where it is importable and the variable is unset (TileLang,
the CuTe DSL); otherwise the variable, else the documented default.
"""

from __future__ import annotations

import getpass
import importlib.util
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from tunecache.client.destinations import Commit, Destination, registers
from tunecache.client.unpack import discard, unpack_beside
from tunecache.client.warm_state import BadWarmStateArtifact, rename_entries
from tunecache.contract import ArtifactKind


def _variable(name: str) -> Path | None:
    value = os.environ.get(name, "").strip()
    return Path(value).expanduser() if value else None


def tilelang_cache_dir() -> Path:
    """This pod's TileLang cache: ``TILELANG_CACHE_DIR``, else ``tilelang.env.env.TILELANG_CACHE_DIR``
    where TileLang is installed, else its default ``~/.tilelang/cache``."""
    found = _variable("TILELANG_CACHE_DIR")
    if found is not None:
        return found
    if importlib.util.find_spec("tilelang") is not None:
        try:
            from tilelang.env import env

            return Path(str(env.TILELANG_CACHE_DIR)).expanduser()
        except Exception:  # TileLang that fails to import here (no GPU libraries): its default
            pass
    return Path("~/.tilelang/cache").expanduser()


def cute_dsl_cache_dir() -> Path:
    """This pod's CuTe DSL file cache: ``CUTE_DSL_CACHE_DIR``, else
    ``cutlass.base_dsl.cache_helpers.get_default_generated_ir_path("CUTE_DSL")`` where the
    CuTe DSL imports, else that function's default, ``$TMPDIR/<user>/cutlass_python_cache``."""
    found = _variable("CUTE_DSL_CACHE_DIR")
    if found is not None:
        return found
    if importlib.util.find_spec("cutlass") is not None:
        try:
            from cutlass.base_dsl.cache_helpers import get_default_generated_ir_path

            return Path(get_default_generated_ir_path("CUTE_DSL"))
        except Exception:  # the DSL's libraries fail to load here: the function's own default
            pass
    user = os.environ.get("USER") or os.environ.get("USERNAME")
    if not user:
        try:
            user = getpass.getuser()
        except (KeyError, OSError):
            user = f"uid_{os.getuid()}"
    return Path(os.environ.get("TMPDIR") or tempfile.gettempdir()) / user / "cutlass_python_cache"


def tvm_ffi_cache_dir() -> Path:
    """This pod's TVM-FFI build cache: ``TVM_FFI_CACHE_DIR``, else ``~/.cache/tvm-ffi``."""
    return _variable("TVM_FFI_CACHE_DIR") or Path("~/.cache/tvm-ffi").expanduser()


def fa4_cute_dsl_cache_dir() -> Path:
    """This pod's FlashAttention 4 CuTe DSL cache, as vLLM's copy of FA4 computes it
    (``vllm/vllm_flash_attn/cute/cache_utils.py::get_cache_path``, not importable without the
    DSL's GPU libraries): ``FLASH_ATTENTION_CUTE_DSL_CACHE_DIR``, else
    ``tempfile.gettempdir()/<getpass.getuser()>/flash_attention_cute_dsl_cache``. Its entries
    are under a fingerprint of FA4's sources by their relative paths and the Python, CuTe DSL
    and TVM-FFI versions (``_compute_source_fingerprint``): another package prefix is no
    difference, other versions never read another's."""
    found = _variable("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR")
    if found is not None:
        return found
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid_{os.getuid()}"
    return Path(tempfile.gettempdir()) / user / "flash_attention_cute_dsl_cache"


def _files(staging: Path) -> dict[str, str]:
    """Every file of an unpacked cache, by its path relative to it: merged one by one (but FA4's
    ``<key>.lock`` files, its own ``fcntl`` locks, which it makes where it needs them)."""
    return {p.relative_to(staging).as_posix(): p.relative_to(staging).as_posix()
            for p in staging.rglob("*") if p.is_file() and p.suffix != ".lock"}


@dataclass(frozen=True)
class JitCache(Destination):
    """One package's JIT cache from a run, merged file by file into ``path`` (``None``: this
    pod's own, :meth:`directory`)."""

    path: Path | None = None
    #: The package's name as the install report says it.
    label: ClassVar[str]

    @staticmethod
    def own_directory() -> Path:
        raise NotImplementedError

    def directory(self) -> Path:
        return Path(self.path) if self.path is not None else self.own_directory()

    def preflight(self, run: Any, kind: ArtifactKind) -> tuple[bool | None, str]:
        return True, f"merged into {self.directory()}, file by file"

    def stage(self, fetched: Any) -> Commit:
        kind = self.kinds[0]
        data = fetched.warm_state.get(kind)
        if data is None:
            return dict
        differs = getattr(fetched, "drift", {}).get(kind)
        if differs:
            return lambda: {"warm_state": (f"{self.label} cache not installed, built with other packages ({differs})",)}
        directory = self.directory()
        staging = unpack_beside(data, directory, kind.value, BadWarmStateArtifact)  # one pass, every entry checked

        def commit() -> dict[str, Any]:
            try:
                files = rename_entries(staging, directory, _files(staging))
            finally:
                discard(staging)
            return {"warm_state": (f"{self.label} cache ({len(files)} files)",)}

        return commit


@registers(ArtifactKind.TILELANG_CACHE)
@dataclass(frozen=True)
class TileLangCache(JitCache):
    """A run's TileLang cache (:func:`tilelang_cache_dir`)."""

    label: ClassVar[str] = "TileLang"
    own_directory = staticmethod(tilelang_cache_dir)


@registers(ArtifactKind.CUTE_DSL_CACHE)
@dataclass(frozen=True)
class CuteDslCache(JitCache):
    """A run's CuTe DSL file cache (:func:`cute_dsl_cache_dir`)."""

    label: ClassVar[str] = "CuTe DSL"
    own_directory = staticmethod(cute_dsl_cache_dir)


@registers(ArtifactKind.TVM_FFI_CACHE)
@dataclass(frozen=True)
class TvmFfiCache(JitCache):
    """A run's TVM-FFI build cache (:func:`tvm_ffi_cache_dir`)."""

    label: ClassVar[str] = "TVM-FFI"
    own_directory = staticmethod(tvm_ffi_cache_dir)


@registers(ArtifactKind.FA4_CUTE_DSL_CACHE)
@dataclass(frozen=True)
class Fa4CuteDslCache(JitCache):
    """A run's FlashAttention 4 CuTe DSL cache (:func:`fa4_cute_dsl_cache_dir`), where the fleet
    sets ``FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1`` (FA4 reads it only then)."""

    label: ClassVar[str] = "FlashAttention 4 CuTe DSL"
    own_directory = staticmethod(fa4_cute_dsl_cache_dir)
