"""What a run's executable artifacts were built against, and which of them a pod with other
packages cannot use.

A FlashInfer JIT module is a shared library linked against TVM-FFI (``apache-tvm-ffi``);
Triton's kernels and Inductor's compiled graphs (vLLM's compile cache) are made by one Triton
and one torch. A package bump that changes any of these silently drops or breaks what a run
carries (tokenspeed#1033). Each kind names its packages (``depends_on`` in
:data:`tunecache.contract.KINDS`). The tuner records the versions of :data:`DISTRIBUTIONS` it ran
with (``summary.dependencies``, signed with the run); a pod compares them with its own
(``importlib.metadata.version``) and leaves out each kind whose packages differ, naming each
difference (:func:`drift`). FlashInfer's own version is the environment's (a run of another
FlashInfer is never served), vLLM's the compile cache's factors.

Those versions are the run's *image* (:func:`image_of`): a pod sends its own with each lookup,
and the service answers a pod with the current run of its image where the key's current run
was made on another (``current_images``), so that a fleet upgraded node by node keeps each
image's warm state.

For a module a pod loads through ninja (``tunecache pull --jit``), :func:`missing_include_dirs`
names the include directories its ``build.ninja`` points at that this pod lacks.

Pure: the standard library and the contract.
"""

from __future__ import annotations

import re
import tarfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from tunecache.contract import KINDS, ArtifactKind

#: Distributions whose version an artifact kind depends on (their distribution names), each
#: with the kinds that depend on it: :attr:`tunecache.contract.KindFacts.depends_on` turned around.
DISTRIBUTIONS: dict[str, tuple[ArtifactKind, ...]] = {
    name: tuple(kind for kind, facts in KINDS.items() if name in facts.depends_on)
    for name in sorted({name for facts in KINDS.values() for name in facts.depends_on})
}
#: The distributions whose versions name an image (:func:`image_of`): fixed, so that a kind
#: added later that depends on another package (TileLang's cache on ``tilelang``, say) changes
#: no image a run was recorded under; such a kind's own package is compared by :func:`drift`.
IMAGE_DISTRIBUTIONS: tuple[str, ...] = ("apache-tvm-ffi", "torch", "triton")
#: What a version is recorded as where the distribution is not installed.
NOT_INSTALLED = "(not installed)"


def installed_versions() -> dict[str, str]:
    """This process's version of each of :data:`DISTRIBUTIONS` (``importlib.metadata``), or
    :data:`NOT_INSTALLED`."""
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in DISTRIBUTIONS:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = NOT_INSTALLED
    return found


def image_of(versions: object) -> str | None:
    """The image of ``versions`` (a run's ``summary.dependencies``, or a pod's
    :func:`installed_versions`): 16 hex digits of a sha256 over the version of each of
    :data:`IMAGE_DISTRIBUTIONS` they name (``name==version`` lines, sorted); ``None`` when ``versions``
    is not a dict or names none of them (a run recorded before versions were: of every image,
    as :func:`drift` finds nothing to compare)."""
    import hashlib

    if not isinstance(versions, dict):
        return None
    lines = [f"{name}=={str(versions[name])[:64]}" for name in IMAGE_DISTRIBUTIONS if versions.get(name) is not None]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16] if lines else None


def drift(recorded: object, here: dict[str, str]) -> dict[ArtifactKind, str]:
    """For each artifact kind whose packages differ between a run's ``recorded`` versions (its
    ``summary.dependencies``; anything but a dict: none recorded, nothing to compare) and
    ``here``, one line naming each difference (``"triton: node 3.6.0, pod 3.7.0"``)."""
    if not isinstance(recorded, dict):
        return {}
    differ: dict[ArtifactKind, list[str]] = {}
    for name, kinds in DISTRIBUTIONS.items():
        node, pod = recorded.get(name), here.get(name, NOT_INSTALLED)
        if node is None or str(node) == pod:
            continue
        for kind in kinds:
            differ.setdefault(kind, []).append(f"{name}: node {str(node)[:64]}, pod {pod}")
    return {kind: "; ".join(lines) for kind, lines in differ.items()}


#: ``-I DIR``, ``-IDIR``, ``-isystem DIR`` in a ``build.ninja``'s flags.
_INCLUDE = re.compile(r"(?:^|\s)(?:-I\s*|-isystem\s+)(\S+)")


def missing_include_dirs(tar: tarfile.TarFile, module: str, exists: Callable[[str], bool] | None = None) -> list[str]:
    """The include directories the module's ``cached_ops/<module>/build.ninja`` (in ``tar``, a
    checked module tarball) names that do not exist here (``exists``: how to ask), in order;
    ninja would fail on or rebuild such a module. Absolute directories only (a relative one is
    the module's own)."""
    import os

    check = exists or os.path.isdir
    try:
        member = tar.getmember(str(PurePosixPath("cached_ops", module, "build.ninja")))
    except KeyError:
        return []
    raw = tar.extractfile(member)
    return include_dirs_missing(raw.read(1 << 20).decode(errors="replace") if raw else "", check)


def include_dirs_missing(build_ninja: str, exists: Callable[[str], bool] | None = None) -> list[str]:
    """The absolute include directories a module's ``build.ninja`` text names that do not
    exist here (``exists``: how to ask), in order (:func:`missing_include_dirs`)."""
    import os

    check = exists or os.path.isdir
    missing: list[str] = []
    for directory in _INCLUDE.findall(build_ninja):
        directory = directory.strip("'\"")
        if Path(directory).is_absolute() and directory not in missing and not check(directory):
            missing.append(directory)
    return missing
