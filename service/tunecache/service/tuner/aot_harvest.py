"""The tuner's half of vLLM 0.33/0.34's compile cache: what each worker's vLLM compiled its
mega AOT artifact under, and the record of the artifacts harvested
(:class:`tunecache.engines.vllm.aot.AotArtifacts`, signed inside the compile-cache tarball).

The vLLM warmup's script calls :func:`aot_rank_facts` in every worker
(``LLM.collective_rpc``) and writes the list into its compile facts (``aot_ranks``);
:func:`aot_record` turns it and the ``torch_aot_compile/<sha256>/rank_*/model`` files vLLM saved
(``decorators.py::save_aot_compiled_function``) into the record, and, where vLLM compiled with
``VLLM_COMPILE_ON_ONE_RANK=1`` and every rank's artifact is byte-identical, keeps one artifact
for all ranks (the others' removed from the harvested tree).
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import Any

from tunecache.engines.vllm.aot import (AOT_DIR, AOT_RECORD_FILE, COMPILE_ON_ONE_RANK, MODEL_FILE, RANK_DIR,
                                        AotArtifacts, AotRank, rank_facts)


def aot_rank_facts(worker: Any) -> dict[str, Any]:
    """In one worker of the tuner's engine: its rank and data-parallel index (as
    ``decorators.py`` names the rank directory), the CUDA device index it compiles on
    (``torch.cuda.current_device()``, the index Inductor bakes into the artifact), vLLM 0.34's
    ``VllmConfig.compile_factors()`` (flattened), ``vllm.envs.compile_factors()`` and torch's
    ``torch._dynamo.package.SystemInfo.current()``: torch's and vLLM's own functions."""
    import dataclasses

    import torch
    import vllm.envs as envs

    try:
        from torch._dynamo.package import SystemInfo

        system = dataclasses.asdict(SystemInfo.current())
    except Exception:
        system = {}
    return rank_facts(worker.vllm_config, envs.compile_factors(),
                      int(torch.cuda.current_device()) if torch.cuda.is_available() else None, system)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def aot_record(tree: Path, facts: dict[str, Any]) -> AotArtifacts | None:
    """The record of the AOT artifacts under ``tree`` (a copy of ``torch_compile_cache/``, which
    this may thin to one artifact for all ranks) and the engine's compile facts ``facts``
    (``vllm_version``, ``aot_ranks`` from :func:`aot_rank_facts`); ``None`` when vLLM saved no
    AOT artifact, saved several hash directories, or the facts lack a rank (then said on stderr)."""
    hashes = sorted(p for p in (tree / AOT_DIR).iterdir() if p.is_dir()) if (tree / AOT_DIR).is_dir() else []
    if not hashes:
        return None
    if len(hashes) > 1:
        print(f"tunecache: AOT artifacts not recorded: {len(hashes)} hash directories under {AOT_DIR}", file=sys.stderr)
        return None
    saved = {}
    for rank_dir in sorted(hashes[0].iterdir()):
        match = RANK_DIR.match(rank_dir.name)
        if match and (rank_dir / MODEL_FILE).is_file():
            saved[(int(match[1]), int(match[2]))] = rank_dir / MODEL_FILE
    ranks = {(int(f["rank"]), int(f["dp_rank"])): f for f in facts.get("aot_ranks") or []}
    if not saved or set(saved) - set(ranks):
        print(f"tunecache: AOT artifacts not recorded: the engine's facts name ranks {sorted(ranks)}, vLLM saved "
              f"{sorted(saved)}", file=sys.stderr)
        return None
    first = ranks[min(saved)]
    entries = [AotRank(rank=r, dp_rank=dp, device_index=ranks[(r, dp)].get("device_index"), sha256=_digest(path))
               for (r, dp), path in sorted(saved.items())]
    one_rank = str(first.get("env", {}).get(COMPILE_ON_ONE_RANK) or "").strip().lower() in ("1", "true")
    identical = len({e.sha256 for e in entries}) == 1
    if one_rank and not identical:
        print(f"tunecache: {COMPILE_ON_ONE_RANK}=1, yet the ranks' AOT artifacts differ: each rank's is kept, bound "
              "to its device index", file=sys.stderr)
    if one_rank and identical:
        for path in sorted(saved.values())[1:]:
            path.unlink()
            if not any(path.parent.iterdir()):
                path.parent.rmdir()
        entries = entries[:1]
    record = AotArtifacts(vllm_version=str(facts["vllm_version"]), aot_dir=hashes[0].name, ranks=entries,
                          one_for_all_ranks=one_rank and identical, compile_factors=first.get("compile_factors") or {},
                          env=first.get("env") or {}, system=first.get("system") or {},
                          variant_factors=facts.get("variant_factors") or None)
    (tree / AOT_RECORD_FILE).write_text(record.model_dump_json(indent=1))
    return record
