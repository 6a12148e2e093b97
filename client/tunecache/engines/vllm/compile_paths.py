"""The tuning node's absolute paths inside a vLLM 0.25-0.32 compile cache, and which of them a
pod can do without.

vLLM and Inductor write absolute paths of the node into what they compile (vllm#52154): the
compile cache's own directory (``$VLLM_CACHE_ROOT/torch_compile_cache/<name>``: Inductor's
cache is pointed into it, ``vllm/compilation/decorators.py``) and the traced source files
(the package prefix, in stack traces). Each file of a relocated cache that names one is one of:

* ``text``: rewritten on the pod, each node path replaced by the pod's (the directory under the
  name the pod's vLLM gives it, the traced file where the pod imports it from): vLLM's
  ``cache_key_factors.json`` (which vLLM writes once and never reads; on the pod it is written
  again with the pod's own factors, as its vLLM would have written it), Inductor's output code
  (``*.py``: Inductor imports the file it finds under the name the code's hash gives,
  ``CompiledFxGraph.write_to_disk``; the paths are comments) and other JSON;
* ``loads``: binary artifacts that vLLM and torch load without opening the paths they name,
  left as they are (:data:`LOADS_WITHOUT_THEIR_PATHS`, each with its evidence);
* ``not relocatable``: any other file; vLLM or torch may open the node's path, which the pod
  does not have. The install report and ``tunecache doctor`` name it.

vLLM's compile index (``vllm_compile_cache.py``), whose graph handles vLLM opens as they are, is
relocated on its own (:func:`tunecache.engines.vllm.compile_cache.relocate_compile_index`).

Pure: the standard library only.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Iterable
from pathlib import Path, PurePosixPath
from typing import Any

TEXT, LOADS, NOT_RELOCATABLE = "text", "loads", "not relocatable"

#: vLLM's record of a backbone directory's factors (``VllmBackend.__call__`` in
#: ``vllm/compilation/backends.py`` writes it when it is missing, never reads it).
FACTORS_RECORD = "cache_key_factors.json"
#: Text files: rewritten (the compile index excepted, relocated on its own).
TEXT_SUFFIXES = (".py", ".json")
#: Binary artifacts (patterns of their path under ``torch_compile_cache/``) that vLLM and torch
#: load without opening the node paths they name -> why (vLLM 0.25's and torch 2.11's code; the
#: H200 pod boots of ``results/gpu/2026-12-03-fleet-pods-all-setups``, under another HOME,
#: cache directories and package prefix with the tuner's work directory removed, loaded them).
LOADS_WITHOUT_THEIR_PATHS: dict[str, str] = {
    "torch_aot_compile/*/rank_*/model": (
        "the AOT artifact: torch.compiler.load_compiled_function imports modules by name and keeps code objects' "
        "file names for tracebacks; vLLM checks the traced sources by module name "
        "(decorators.py::_verify_source_unchanged)"),
    "*/rank_*/*/artifact_*": (
        "Inductor's compiled graph, opened at the path the relocated compile index names; "
        "torch._inductor.CompiledArtifact.load loads its cache entries by key and writes their code under the "
        "pod's own Inductor cache"),
    "torch_aot_compile/*/inductor_cache/fxgraph/*": "Inductor's FX graph cache entries, looked up by key",
    "torch_aot_compile/*/inductor_cache/aotautograd/*": "AOTAutograd's cache entries, looked up by key",
    "torch_aot_compile/*/inductor_cache/triton/*": (
        "Triton kernels, found by their hash directory (group files pointed at the pod's paths); file names in "
        "a binary are line information"),
}
#: At most this many files are named per run (the record is bounded like everything a client holds).
MAX_NAMED = 1000


def relocation(relative: str) -> str:
    """What a file (its path under ``torch_compile_cache/``) that names node paths is:
    :data:`TEXT`, :data:`LOADS` or :data:`NOT_RELOCATABLE`."""
    if PurePosixPath(relative).suffix in TEXT_SUFFIXES:
        return TEXT
    if any(fnmatch.fnmatchcase(relative, pattern) for pattern in LOADS_WITHOUT_THEIR_PATHS):
        return LOADS
    return NOT_RELOCATABLE


def node_path_files(tree: Path, prefixes: Iterable[str]) -> dict[str, str]:
    """Each file under ``tree`` (a ``torch_compile_cache/``) whose bytes name one of
    ``prefixes`` -> its :func:`relocation` (at most :data:`MAX_NAMED`, not-relocatable ones first)."""
    needles = [p.encode() for p in prefixes if p]
    found: dict[str, str] = {}
    for path in sorted(tree.rglob("*")):
        if not path.is_file() or path.is_symlink():
            continue
        data = path.read_bytes()
        if any(needle in data for needle in needles):
            relative = path.relative_to(tree).as_posix()
            found[relative] = relocation(relative)
    ordered = sorted(found.items(), key=lambda item: (item[1] != NOT_RELOCATABLE, item[0]))
    return dict(ordered[:MAX_NAMED])


def rewrite_paths(text: str, moves: dict[str, str]) -> tuple[str, int]:
    """``text`` with each node path of ``moves`` (node -> pod) replaced, the longest first so a
    directory's own move wins over its parent's; ``(new text, replacements)``."""
    count = 0
    for node, pod in sorted(moves.items(), key=lambda item: -len(item[0])):
        if node and node != pod and node in text:
            count += text.count(node)
            text = text.replace(node, pod)
    return text, count


def factors_record(env: dict[str, Any], config_hash: str, code_hash: str, compiler_hash: str) -> str:
    """vLLM's ``cache_key_factors.json`` as vLLM writes it (``json.dump(..., indent=2, sort_keys=True)``)."""
    return json.dumps({"env": env, "config_hash": config_hash, "code_hash": code_hash,
                       "compiler_hash": compiler_hash}, indent=2, sort_keys=True)


def summary(files: dict[str, str]) -> str | None:
    """One line on the binary files that name node paths (``None``: none): those that load
    without them, and those that are not relocatable."""
    loads = sorted(f for f, kind in files.items() if kind == LOADS)
    stuck = sorted(f for f, kind in files.items() if kind == NOT_RELOCATABLE)
    parts = []
    if stuck:
        parts.append(f"not relocatable: {len(stuck)} files name the tuning node's paths, which vLLM or torch may "
                     f"open ({', '.join(stuck[:3])}{', ...' if len(stuck) > 3 else ''})")
    if loads:
        parts.append(f"{len(loads)} artifacts name the tuning node's paths and load without them "
                     f"({', '.join(sorted({PurePosixPath(f).name for f in loads})[:3])})")
    return "; ".join(parts) or None
