"""A FlashInfer JIT module as tunecache ships it: one deterministic gzip'd tarball per module.

FlashInfer builds a module with nvcc/ninja into its workspace
(``flashinfer.jit.env.FLASHINFER_WORKSPACE_DIR`` =
``$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer/<version>/<archs>``): the sources it
generates under ``generated/<module>/`` and the objects, ``build.ninja``, ninja's logs
and ``<module>.so`` under ``cached_ops/<module>/``. On every later use FlashInfer runs
ninja on that directory (``JitSpecNvcc.build``), which does nothing when every output
is newer than its inputs and the commands are unchanged. So a module is shipped whole,
paths relative to the workspace, with its files' modification times to the nanosecond
(:data:`MTIME_NS_HEADER`), and is valid where the fields of :data:`JIT_VALIDITY_FIELDS`
equal the tuning node's (the same container image and ``FLASHINFER_WORKSPACE_BASE``).

The tuner packs (:func:`module_tarball`); the service and a pod check
(:func:`check_jit_module`) before a pod unpacks into its own workspace
(``tunecache.client.jit_install``).
"""

from __future__ import annotations

import gzip
import io
import os
import tarfile
from pathlib import Path, PurePosixPath

from tunecache.formats.tarball import TarSource, open_bounded

#: pax header holding an entry's exact modification time in nanoseconds.
MTIME_NS_HEADER = "TUNECACHE.mtime_ns"


#: What a built module's ``build.ninja`` and its ninja state name, so what must be equal on
#: the node that built it and the pod that loads it, or ninja rebuilds (or fails).
JIT_VALIDITY_FIELDS = ("workspace_dir", "flashinfer_data_dir", "cuda_home", "nvcc", "cuda_version")
#: Of those, the ones that are only where things are (the workspace, FlashInfer's package data,
#: CUDA's directory): they matter to ninja, not to the built ``.so``. A module that FlashInfer
#: loads through its AOT path (``flashinfer/jit/core.py::JitSpec.build_and_load``: no ninja when
#: ``<FLASHINFER_AOT_DIR>/<name>/<name>.so`` exists), as the vLLM plugin has it load, needs only
#: the others equal (the CUDA version; FlashInfer's version and arch are the workspace's subdir).
JIT_PLACEMENT_FIELDS = ("workspace_dir", "flashinfer_data_dir", "cuda_home", "nvcc")


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


def _add_tree(tar: tarfile.TarFile, root: Path, relative: str) -> None:
    base = root / relative
    for path in sorted([base, *base.rglob("*")]):
        if path.is_symlink() or path.suffix == ".lock":
            continue
        info = tar.gettarinfo(str(path), arcname=str(path.relative_to(root)))
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        # ninja compares nanosecond times; tar's own mtime is a float that loses them
        info.pax_headers = {MTIME_NS_HEADER: str(path.stat().st_mtime_ns)}
        if path.is_file():
            with path.open("rb") as f:
                tar.addfile(info, f)
        elif path.is_dir():
            tar.addfile(info)


def module_tarball(workspace: Path, module: str) -> bytes:
    """``cached_ops/<module>/`` and ``generated/<module>/`` (when present) of a FlashInfer
    workspace as gzip'd tar bytes; paths are relative to the workspace, modification times
    kept to the nanosecond (ninja decides freshness by them; a pax header per entry, since
    tar's own field is a float), owners cleared, entries sorted, gzip header
    time 0, so the same files give the same bytes (and sha256)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _add_tree(tar, workspace, f"cached_ops/{module}")
        if (workspace / "generated" / module).is_dir():
            _add_tree(tar, workspace, f"generated/{module}")
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0) as gz:
        gz.write(raw.getvalue())
    return out.getvalue()


class BadJitArtifact(ValueError):
    """A JIT tarball with paths outside one module's directories, links, or special files."""


def _valid_mtime_ns(value: str) -> bool:
    """Whether a :data:`MTIME_NS_HEADER` value is decimal digits naming a time that a signed
    64-bit count of nanoseconds holds (ninja's ``TimeStamp``, the kernel's ``st_mtime_ns``
    range): a larger one is stored clamped or wrapped by the file system, so the module
    would be installed with another time than it carries and ninja would rebuild it."""
    return value.isascii() and value.isdigit() and len(value) <= 19 and int(value) < 2**63


def jit_entry_module(member: tarfile.TarInfo) -> str:
    """The module an entry of a JIT tarball belongs to, after checking the entry (its path is
    one module's, it is a file or a directory, its :data:`MTIME_NS_HEADER` is valid).

    Raises:
        BadJitArtifact: naming the entry and what is wrong with it.
    """
    path = PurePosixPath(member.name)
    if path.is_absolute() or ".." in path.parts or len(path.parts) < 2:
        raise BadJitArtifact(f"unsafe path in JIT artifact: {member.name!r}")
    if path.parts[0] not in ("cached_ops", "generated"):
        raise BadJitArtifact(f"unexpected top-level directory in JIT artifact: {member.name!r}")
    if not (member.isfile() or member.isdir()):
        raise BadJitArtifact(f"JIT artifact holds a link or special file: {member.name!r}")
    mtime_ns = member.pax_headers.get(MTIME_NS_HEADER)
    if mtime_ns is not None and not _valid_mtime_ns(mtime_ns):
        raise BadJitArtifact(f"JIT artifact entry {member.name!r}: {MTIME_NS_HEADER} is not a whole number of "
                             f"nanoseconds from 0 to 2**63-1: {mtime_ns[:40]!r}")
    return path.parts[1]


def one_module(modules: set[str]) -> str:
    """The one module a JIT tarball's entries belong to.

    Raises:
        BadJitArtifact: none, or more than one."""
    if len(modules) != 1:
        raise BadJitArtifact(f"a JIT artifact must hold exactly one module, found {sorted(modules)}")
    return next(iter(modules))


def _module_of(tar: tarfile.TarFile) -> str:
    return one_module({jit_entry_module(member) for member in tar.getmembers()})


def check_jit_module(data: TarSource) -> str:
    """The module name of a JIT tarball, after checking every entry (nothing is written).

    Raises:
        BadJitArtifact: not a gzip'd tar, past the unpack bounds
            (:func:`tunecache.formats.tarball.open_bounded`), not one module's files, or an
            entry whose ``TUNECACHE.mtime_ns`` header is not a whole number from 0 to 2**63-1.
    """
    with open_bounded(data, "JIT", BadJitArtifact) as tar:
        return _module_of(tar)
