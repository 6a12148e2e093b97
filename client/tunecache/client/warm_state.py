"""Where vLLM and Triton keep the rest of a boot's warm state, and installing a run's into them.

* vLLM's cache root (:func:`tunecache.engines.vllm.paths.vllm_cache_root`), with
  ``modelinfos/`` (one JSON file per inspected model class, each holding the hash of the
  class's source that vLLM checks before it uses it) and ``torch_compile_cache/`` (two
  hashed directories, :mod:`tunecache.engines.vllm.compile_cache`).
* Triton's cache: ``TRITON_CACHE_DIR``, else ``triton.runtime.cache.default_cache_dir()``
  (``~/.triton/cache``): one directory per compiled kernel, named by its hash, with
  ``__grp__<name>.json`` files that list the kernel's files by absolute path. Triton drops
  a listed file that does not exist and compiles again, so every group file is rewritten to
  the paths the kernel has on this pod (Inductor's kernels under the compile cache's
  ``inductor_cache/triton/`` too).

Triton's kernels are merged: each kernel this pod lacks is staged beside its place and renamed
in whole; one it has is left as it is (the same name is the same content, by the hash in the
name). vLLM's compile-cache directories and model-inspection files are named by what they are
for, not by their content: a run's replace those of the same name, each swapped in one step
(so a bad compile cache on a persistent volume goes with the next promote or roll back). Nothing a run carries becomes a path
here: the tarballs' entries are checked (no absolute or ``..`` paths, links or special
files) and the compile cache goes under the names the pod's own vLLM computes.
"""

from __future__ import annotations

import json
import os
import shutil
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from tunecache.client.aot_verdict import vllm_here
from tunecache.client.destinations import Commit, Destination, registers
from tunecache.contract import ArtifactKind
from tunecache.engines.vllm.paths import vllm_cache_root
from tunecache.formats.tarball import TarSource, open_bounded
from tunecache.engines import engine_for
from tunecache.client.warm_tarballs import (  # noqa: F401 (BadWarmStateArtifact, read_compile_factors: kept here)
    BadWarmStateArtifact,
    read_compile_factors,
    staged_factors,
)
from tunecache.engines.vllm.compile_cache import CompileFactors, PodCompileFactors


def relocate_compile_dirs(compiled: Path, installed: list[str]) -> str | None:
    """Point the graph handles of vLLM's compile index (:data:`~tunecache.engines.vllm.compile_cache.COMPILE_INDEX`)
    in each of the ``installed`` directories under ``compiled`` (``torch_compile_cache/``) at
    this pod's own copies of the artifacts (:func:`tunecache.engines.vllm.compile_cache.relocate_compile_index`),
    each index rewritten whole. A directory whose index names an artifact that is in neither
    place is removed again (vLLM would fail its start opening it; without it vLLM compiles).
    Returns why one was removed (``None``: none)."""
    from tunecache.client.atomic import write_atomically
    from tunecache.engines.vllm.compile_cache import COMPILE_INDEX, relocate_compile_index

    removed = []
    for name in installed:
        directory = compiled / name
        missing: list[str] = []
        for index in sorted(directory.rglob(COMPILE_INDEX)):
            try:
                text, moved, missing_here = relocate_compile_index(index.read_text(), str(index.parent))
            except (OSError, ValueError, SyntaxError) as exc:
                missing.append(f"{index.name} unreadable ({type(exc).__name__})")
                continue
            missing += missing_here
            if moved:
                write_atomically(index, text.encode())
        if missing:
            shutil.rmtree(directory, ignore_errors=True)
            removed.append(f"{name} (its index names {len(missing)} artifacts it lacks: {missing[0]})")
    return ("compile cache directory removed again, vLLM would fail opening what it names: " + "; ".join(removed)
            if removed else None)


def relocate_node_paths(compiled: Path, installed: list[str], node: CompileFactors, pod: PodCompileFactors | None,
                        renames: dict[str, str]) -> str | None:
    """Point the tuning node's paths in the text files of the ``installed`` directories under
    ``compiled`` (``torch_compile_cache/``; ``renames``: node name -> this pod's) at this pod's
    (:mod:`tunecache.engines.vllm.compile_paths`): the node's cache directory, each directory
    under the name this pod's vLLM gives it, each traced source where this pod imports it from.
    vLLM's ``cache_key_factors.json`` is written again with this pod's factors (``pod``), as its
    vLLM would have written it. Binary files are left as they are. Returns one line for the
    install report (inside the compile cache's parentheses): how many files were rewritten, and the binary files that name the node's
    paths (:attr:`CompileFactors.node_paths`, recorded by the tuner), those that load without
    them and those that are not relocatable (``None``: nothing to say)."""
    from tunecache.client.atomic import write_atomically
    from tunecache.engines.vllm import compile_paths as paths

    installed = [name for name in installed if (compiled / name).is_dir()]  # not removed again
    mine = {theirs: renamed for theirs, renamed in renames.items() if renamed in installed}
    moves = dict(pod.traced_here) if pod is not None else {}
    if node.cache_dir:
        moves[node.cache_dir] = str(compiled)
        moves.update({f"{node.cache_dir}/{theirs}": str(compiled / renamed) for theirs, renamed in mine.items()})
    rewritten = 0
    for name in installed:
        for path in sorted((compiled / name).rglob("*")):
            relative = path.relative_to(compiled).as_posix()
            if not path.is_file() or path.is_symlink() or paths.relocation(relative) != paths.TEXT:
                continue
            try:
                text = path.read_text()
            except (OSError, UnicodeDecodeError):
                continue
            if path.name == paths.FACTORS_RECORD and pod is not None and node.code_hash and node.compiler_hash:
                new = paths.factors_record(pod.env, pod.config_hash, pod.code_hash or node.code_hash, node.compiler_hash)
                if _json_or_none(new) == _json_or_none(text):  # the pod's own factors already
                    continue
            else:
                new = paths.rewrite_paths(text, moves)[0]
            if new != text:
                write_atomically(path, new.encode())
                rewritten += 1
    binary = {}
    for relative, kind in node.node_paths.items():
        theirs = next((t for t in mine if relative == t or relative.startswith(t + "/")), None)
        if theirs is not None and kind != paths.TEXT:
            binary[mine[theirs] + relative[len(theirs):]] = kind
    said = [f"{rewritten} files pointed at this pod's paths"] if rewritten else []
    said += filter(None, [paths.summary(binary)])
    return "; ".join(said) if said else None


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None




def triton_cache_dir() -> Path:
    """This pod's Triton cache: ``TRITON_CACHE_DIR``, else Triton's
    ``triton.runtime.cache.default_cache_dir()`` (``~/.triton/cache`` without Triton)."""
    if os.environ.get("TRITON_CACHE_DIR", "").strip():
        return Path(os.environ["TRITON_CACHE_DIR"]).expanduser()
    try:
        from triton.runtime.cache import default_cache_dir

        return Path(default_cache_dir()).expanduser()
    except Exception:
        return Path("~/.triton/cache").expanduser()


def inductor_triton_dir(device: int = 0) -> Path | None:
    """Where Inductor keeps the Triton kernels of device ``device`` when ``TRITON_CACHE_DIR`` is
    unset: ``<Inductor's cache>/triton/<device>`` (``torch._inductor.runtime.cache_dir_utils.
    triton_cache_dir``, whose cache directory is ``TORCHINDUCTOR_CACHE_DIR`` or
    ``default_cache_dir()``, ``/tmp/torchinductor_<user>``; that function is not called, since it
    creates the directory and sets the variable). ``None`` when ``TRITON_CACHE_DIR`` is set:
    Inductor uses Triton's cache then. Inductor writes the kernels its artifacts bundle there
    when it loads them, unless they are there already."""
    if os.environ.get("TRITON_CACHE_DIR") is not None:
        return None
    root = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not root:
        try:
            from torch._inductor.runtime.cache_dir_utils import default_cache_dir

            root = default_cache_dir()
        except Exception:  # no torch here (an init container): the same default
            import getpass
            import re

            try:
                user = getpass.getuser()
            except (KeyError, ModuleNotFoundError, OSError):
                user = f"uid_{os.getuid()}"
            root = os.path.join(tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))
    return Path(os.path.abspath(root)) / "triton" / str(device)


def _open_checked(data: TarSource, what: str) -> tarfile.TarFile:
    """The tarball within the unpack bounds (:func:`tunecache.formats.tarball.open_bounded`),
    every entry checked (raises :class:`BadWarmStateArtifact`)."""
    tar = open_bounded(data, what, BadWarmStateArtifact)
    for member in tar.getmembers():
        path = PurePosixPath(member.name)
        if path.is_absolute() or ".." in path.parts or not (member.isfile() or member.isdir()):
            tar.close()
            raise BadWarmStateArtifact(f"unsafe entry in {what} artifact: {member.name!r}")
    return tar


def fix_triton_groups(staged: Path, final: Path) -> int:
    """Point every Triton ``__grp__*.json`` under ``staged`` at its files as they will be
    once ``staged`` is renamed to ``final``; returns how many were rewritten."""
    count = 0
    for group in staged.rglob("__grp__*.json"):
        try:
            doc = json.loads(group.read_text())
        except (OSError, ValueError):
            continue
        children = doc.get("child_paths") if isinstance(doc, dict) else None
        if not isinstance(children, dict):
            continue
        where = final / group.parent.relative_to(staged)
        doc["child_paths"] = {name: str(where / PurePosixPath(str(path)).name) for name, path in children.items()}
        group.write_text(json.dumps(doc))
        count += 1
    return count


def merge_entries(data: TarSource, what: str, destination: Path, renames: Callable[[Path], dict[str, str]],
                  replace: bool = False) -> list[str]:
    """Unpack ``data`` beside ``destination`` in one pass (:func:`tunecache.client.unpack.unpack`)
    and rename in each entry ``renames(staged)``
    gives (:func:`rename_entries`; ``replace``: also over an entry of the same name). Returns
    the entries installed.

    Raises:
        BadWarmStateArtifact; OSError when writing fails (entries already renamed in stay: each is whole).
    """
    from tunecache.client.unpack import discard, unpack_beside

    staging = unpack_beside(data, destination, what, BadWarmStateArtifact)  # one pass, each entry checked
    try:
        return rename_entries(staging, destination, renames(staging), replace)
    finally:
        discard(staging)


def rename_entries(unpacked: Path, destination: Path, renames: dict[str, str], replace: bool = False) -> list[str]:
    """Rename each of ``renames``' entries (path in ``unpacked`` -> path under ``destination``)
    into place, its Triton group files pointed at their final place (:func:`fix_triton_groups`).
    An entry ``destination`` has already stays, unless ``replace``: then the new one takes its
    place in one step (:func:`tunecache.client.atomic.swap_into_place`; the same content is
    left as it is). Merging suits what is named by a hash of its content (Triton's kernels);
    vLLM's compile-cache directories and model-inspection files are named by what they are
    for, so a newer run's replace them (``replace``). Returns the entries in place from
    ``unpacked``, each journaled before it is renamed (:mod:`tunecache.client.journal`).

    Raises:
        OSError: a rename failed (entries already renamed in stay: each is whole).
    """
    from tunecache.client.atomic import directory_lock, note_added, swap_into_place

    installed = []
    for source, target in sorted(renames.items()):
        found, final = unpacked / source, destination / target
        if not found.exists() or (os.path.lexists(final) and not replace):
            continue
        if found.is_dir():
            fix_triton_groups(found, final)
        final.parent.mkdir(parents=True, exist_ok=True)
        if os.path.lexists(final):
            with directory_lock(final.parent):
                swap_into_place(found, final)
            installed.append(target)
            continue
        note_added(final, found)
        try:
            found.rename(final)
        except OSError:
            if not final.exists():  # not another process's identical entry
                raise
            continue
        installed.append(target)
    return installed


def _children(staging: Path) -> dict[str, str]:
    return {p.name: p.name for p in staging.iterdir() if not p.name.startswith(".")}


def compile_cache_verdict(run: Any) -> tuple[bool | None, str]:
    """Whether a stored run's (:class:`tunecache.contract.TuningRunRead`) compile cache loads
    here, before a boot: this pod's vLLM version and environment factors
    (``vllm.envs.compile_factors()``, the placement factors left out) and each traced source
    file where this pod imports it from, its bytes against the node's
    (:func:`tunecache.engines.vllm.compile_cache.traced_files_here`: the prefix the packages live
    under is no difference). The engine's arguments decide the rest, which only vLLM's config
    tells (``None``): the run's engine variant and the engine arguments it was tuned with are named.
    A vLLM 0.33/0.34 run's AOT artifact: :func:`tunecache.client.aot_verdict.run_aot_verdict`."""
    from tunecache.engines.vllm.compile_cache import PLACEMENT_ENV_FACTORS, traced_files_here

    recorded = run.summary.get("vllm_compile")
    if isinstance(recorded, dict) and "aot" in recorded:  # vLLM 0.33/0.34: the mega AOT artifact
        from tunecache.client.aot_verdict import run_aot_verdict

        return run_aot_verdict(run)
    try:
        node = CompileFactors.model_validate(recorded)
    except Exception:
        return False, "the run records no compile factors (a tuner before this version)"
    version, env = vllm_here()
    differ = []
    if version is None:
        differ.append("vLLM is not installed here")
    elif version != node.vllm_version:
        differ.append(f"vLLM version: node {node.vllm_version}, pod {version}")
    if env is not None:
        for name in sorted((set(env) | set(node.env)) - set(PLACEMENT_ENV_FACTORS)):
            if env.get(name, "(unset)") != node.env.get(name, "(unset)"):
                differ.append(f"environment {name}: node {node.env.get(name, '(unset)')!r}, pod {env.get(name, '(unset)')!r}")
    digests, moved, _ = traced_files_here(dict(node.traced_files))
    for path, digest in sorted(node.traced_files.items()):
        if digests.get(path) is None:
            differ.append(f"traced source {path}: not on this pod")
        elif digests[path] != digest:
            differ.append(f"traced source {moved.get(path, path)}: its content differs")
    from tunecache.engines.vllm.compile_paths import NOT_RELOCATABLE, summary

    stuck = summary({f: kind for f, kind in node.node_paths.items() if kind == NOT_RELOCATABLE})
    if differ:
        return False, "vLLM would compute other directory names: " + "; ".join(differ + ([stuck] if stuck else []))
    variant = run.variant or "unknown"
    args = run.summary.get("engine_args")
    tuned = f"tuned with engine arguments {json.dumps(args, sort_keys=True)}" if args else "tuned with the node's engine arguments"
    where = (f"; {len(moved)} traced sources found under this pod's own package prefix, with the node's bytes"
             if moved else "")
    return None, (f"vLLM version, environment and traced sources match{where}; engine variant {variant} "
                  f"({tuned}): a pod booted with the same engine arguments loads it, one with others gets "
                  "its own variant's run or compiles (the plugin says which)" + (f"; {stuck}" if stuck else ""))


@registers(ArtifactKind.VLLM_MODELINFOS, ArtifactKind.VLLM_COMPILE_CACHE)
@dataclass(frozen=True)
class VllmCacheRoot(Destination):
    """A run's vLLM model-inspection cache and compile cache, into ``root`` (``None``: this
    pod's own, :func:`vllm_cache_root`).

    ``pod_factors``: the pod's compile factors (the vLLM plugin computes them from its
    ``VllmConfig`` with vLLM's functions). The compile cache goes under the directory names
    they give when :func:`tunecache.engines.vllm.compile_cache.differences` finds none; else it is
    not installed and ``compile_cache_skipped`` names each differing factor. ``None`` (an init
    container, no vLLM config to compute from): under the node's own names, which this pod's
    vLLM uses only if its factors are the node's. ``compile_cache=False``: the model
    inspection cache only (the plugin installs the compile cache once vLLM's config exists).
    """

    root: Path | None = None
    pod_factors: PodCompileFactors | None = None
    compile_cache: bool = True
    modelinfos: bool = True

    @classmethod
    def made_for(cls, kinds: frozenset[ArtifactKind], where: Path | None) -> VllmCacheRoot:
        return cls(where, compile_cache=ArtifactKind.VLLM_COMPILE_CACHE in kinds,
                   modelinfos=ArtifactKind.VLLM_MODELINFOS in kinds)

    def preflight(self, run: Any, kind: ArtifactKind) -> tuple[bool | None, str]:
        root = Path(self.root) if self.root is not None else vllm_cache_root()
        if kind is ArtifactKind.VLLM_MODELINFOS:
            return True, f"into {root / 'modelinfos'}"
        return compile_cache_verdict(run)

    def stage(self, fetched: Any) -> Commit:
        """Unpack the run's model-inspection files and compile cache beside their places (one
        pass each, every entry checked: a refused tarball raises here, before anything is
        written), the compile cache's factors read from what was unpacked."""
        from tunecache.client.unpack import discard, unpack_beside

        root = Path(self.root) if self.root is not None else vllm_cache_root()
        infos = fetched.warm_state.get(ArtifactKind.VLLM_MODELINFOS) if self.modelinfos else None
        compiled = fetched.warm_state.get(ArtifactKind.VLLM_COMPILE_CACHE) if self.compile_cache else None
        renames: dict[str, str] | None = None
        skipped = node = None
        differs = getattr(fetched, "drift", {}).get(ArtifactKind.VLLM_COMPILE_CACHE)
        if compiled is not None and differs:
            compiled, skipped = None, f"compile cache not installed, built with other packages: {differs}"
        staged_infos = staged = None
        try:
            if infos is not None:
                staged_infos = unpack_beside(infos, root / "modelinfos", "vllm_modelinfos", BadWarmStateArtifact)
            if compiled is not None:
                staged = unpack_beside(compiled, root / "torch_compile_cache", "vllm_compile_cache",
                                       BadWarmStateArtifact)
                node = staged_factors(staged)
        except BaseException:
            for staging in (staged_infos, staged):
                if staging is not None:
                    discard(staging)
            raise
        if compiled is not None:
            if node is None:
                skipped = "the run's compile cache records no factors (a tuner before this version)"
            elif self.pod_factors is None:
                renames = engine_for("vllm").compile_cache_names(node)
            else:
                lines = engine_for("vllm").compile_cache_differences(node, self.pod_factors)
                if lines:
                    skipped = "compile cache not installed, vLLM would not use it: " + "; ".join(lines)
                else:
                    renames = engine_for("vllm").compile_cache_names(node, self.pod_factors)
            if not renames and staged is not None:  # left out: nothing of it is written
                discard(staged)
                staged = None

        def commit() -> dict[str, Any]:
            done: list[str] = []
            try:
                if staged_infos is not None:
                    files = rename_entries(staged_infos, root / "modelinfos", _children(staged_infos), replace=True)
                    done.append(f"modelinfos ({len(files)} files)")
                skipped_now = skipped
                if renames and staged is not None:
                    dirs = rename_entries(staged, root / "torch_compile_cache", renames, replace=True)
                    skipped_now = relocate_compile_dirs(root / "torch_compile_cache", dirs) or skipped
                    moved = relocate_node_paths(root / "torch_compile_cache", dirs, node, self.pod_factors, renames)
                    done.append(f"compile cache ({len(dirs)} of {len(renames)} directories"
                                f"{'; ' + moved if moved else ''})")
            finally:
                for staging in (staged_infos, staged):
                    if staging is not None:
                        discard(staging)
            return {"warm_state": tuple(done), "compile_cache_skipped": skipped_now, "vllm_cache_root": root}

        return commit


@registers(ArtifactKind.TRITON_CACHE)
@dataclass(frozen=True)
class TritonCache(Destination):
    """A run's Triton cache, merged kernel by kernel into ``path`` (``None``: this pod's own,
    :func:`triton_cache_dir`, and, where ``TRITON_CACHE_DIR`` is unset, Inductor's too,
    :func:`inductor_triton_dir`: Inductor looks for its kernels there, not in Triton's)."""

    path: Path | None = None

    def preflight(self, run: Any, kind: ArtifactKind) -> tuple[bool | None, str]:
        return True, (f"merged into {Path(self.path) if self.path is not None else triton_cache_dir()}, its group "
                      "files pointed at this pod's paths")

    def stage(self, fetched: Any) -> Commit:
        data = fetched.warm_state.get(ArtifactKind.TRITON_CACHE)
        if data is None:
            return dict
        differs = getattr(fetched, "drift", {}).get(ArtifactKind.TRITON_CACHE)
        if differs:
            return lambda: {"warm_state": (f"Triton cache not installed, built with other packages ({differs})",)}
        if self.path is not None:
            directories = [Path(self.path)]
        else:
            directories = [triton_cache_dir(), *filter(None, [inductor_triton_dir()])]
        from tunecache.client.unpack import copy_beside, discard, unpack_beside

        # one pass, every entry checked before anything is written; Inductor's directory gets a copy
        first = unpack_beside(data, directories[0], "triton_cache", BadWarmStateArtifact)
        try:
            staged = [(first, directories[0]), *((copy_beside(first, d), d) for d in directories[1:])]
        except BaseException:
            discard(first)
            raise

        def commit() -> dict[str, Any]:
            try:
                kernels = [rename_entries(staging, directory, _children(staging)) for staging, directory in staged][0]
            finally:
                for staging, _ in staged:
                    discard(staging)
            return {"warm_state": (f"Triton cache ({len(kernels)} kernels)",), "triton_cache_dir": directories[0]}

        return commit
