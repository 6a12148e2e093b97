"""vLLM 0.33/0.34's startup plans from a run (:mod:`tunecache.engines.vllm.startup_plan`), on a pod:
staged by the install, placed by each worker under the fingerprint its own vLLM computes.

The install (``pull --warm-state``, the plugin's main process) writes the run's plans, each
checked to be one vLLM would load under its name, into a staging directory beside vLLM's
(:func:`staged_plans_dir`), never where vLLM reads them. Each worker, right before vLLM's
``Worker.determine_available_memory`` applies a plan (``maybe_apply_startup_plan``, its first
call), computes its fingerprint with vLLM's own
``vllm/v1/worker/startup_plan.py::compute_plan_fingerprint(vllm_config, rank, world_size)`` and
places the run's plan of that fingerprint at vLLM's own ``_plan_path(fingerprint)``
(:func:`place_plan`); a run with none for it is named, and vLLM profiles. Only where the pod
sets ``VLLM_ENABLE_STARTUP_PLAN=1`` (``vllm.envs``), as vLLM reads plans only then.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from tunecache.client.atomic import write_atomically
from tunecache.client.destinations import Commit, Destination, registers
from tunecache.client.warm_state import _open_checked
from tunecache.contract import ArtifactKind
from tunecache.engines.vllm.paths import vllm_cache_root
from tunecache.engines.vllm.startup_plan import MAX_PLAN_BYTES, plan_fingerprint

log = logging.getLogger("vllm.plugins.tunecache")

#: The staging directory under ``VLLM_CACHE_ROOT`` (vLLM's own is ``startup_plan/``).
STAGED_DIR = "tunecache-startup-plans"


def staged_plans_dir() -> Path:
    """Where the install stages a run's plans: ``$VLLM_CACHE_ROOT/tunecache-startup-plans``."""
    return vllm_cache_root() / STAGED_DIR


def _plans_of(data: bytes) -> dict[str, bytes]:
    """The plan files of a ``vllm_startup_plan`` tarball that vLLM would load under their names
    (checked as every warm-state tarball is first)."""
    plans: dict[str, bytes] = {}
    with _open_checked(data, ArtifactKind.VLLM_STARTUP_PLAN.value) as tar:
        for member in tar.getmembers():
            name = PurePosixPath(member.name).name
            if not member.isfile() or member.size > MAX_PLAN_BYTES:
                continue
            content = tar.extractfile(member).read()  # type: ignore[union-attr]
            if plan_fingerprint(name, content):
                plans[name] = content
    return plans


@registers(ArtifactKind.VLLM_STARTUP_PLAN)
@dataclass(frozen=True)
class StartupPlans(Destination):
    """A run's startup plans, staged in ``path`` (``None``: :func:`staged_plans_dir`) for the workers."""

    path: Path | None = None

    def directory(self) -> Path:
        return Path(self.path) if self.path is not None else staged_plans_dir()

    def preflight(self, run: Any, kind: ArtifactKind) -> tuple[bool | None, str]:
        return None, (f"staged in {self.directory()}; each worker places the plan of the fingerprint its own vLLM "
                      "computes (compute_plan_fingerprint: the config, GPU name, memory and capability, torch, CUDA, "
                      "rank, world size), where VLLM_ENABLE_STARTUP_PLAN=1")

    def stage(self, fetched: Any) -> Commit:
        kind = ArtifactKind.VLLM_STARTUP_PLAN
        data = fetched.warm_state.get(kind)
        if data is None:
            return dict
        differs = getattr(fetched, "drift", {}).get(kind)
        if differs:
            return lambda: {"warm_state": (f"startup plans not installed, made with other packages ({differs})",)}
        plans, directory = _plans_of(data), self.directory()

        def commit() -> dict[str, Any]:
            directory.mkdir(parents=True, exist_ok=True)
            for name, content in plans.items():
                write_atomically(directory / name, content)
            return {"warm_state": (f"startup plans ({len(plans)}, staged for the workers)",)}

        return commit


def place_plan(staged: Path, fingerprint: str, target: Path) -> str:
    """Place the staged plan of ``fingerprint`` (this worker's, as its vLLM computes it) at
    ``target`` (vLLM's ``_plan_path``); the line it says. Nothing replaces a plan in place."""
    offered: dict[str, Path] = {}
    for path in sorted(staged.iterdir()) if staged.is_dir() else []:
        if path.is_file() and path.stat().st_size <= MAX_PLAN_BYTES:
            found = plan_fingerprint(path.name, path.read_bytes())
            if found:
                offered[found] = path
    if target.exists():
        return f"startup plan: this worker's (fingerprint {fingerprint}) is in place already, vLLM applies it"
    if fingerprint not in offered:
        return (f"startup plan not placed, vLLM profiles: the run has none for this worker's fingerprint {fingerprint} "
                f"({', '.join(sorted(offered)) or 'none'}): vLLM's compute_plan_fingerprint differs in the config, "
                "GPU name, memory or capability, torch, CUDA, rank or world size")
    target.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(target, offered[fingerprint].read_bytes())
    return (f"startup plan placed at {target} (fingerprint {fingerprint}); vLLM applies it where the GPU has the free "
            "memory it was measured with")


def place_startup_plan(worker: Any) -> str | None:
    """In a worker, before ``determine_available_memory``: :func:`place_plan` with vLLM's own
    ``compute_plan_fingerprint(worker.vllm_config, worker.rank, world_size)`` and ``_plan_path``,
    where the pod sets ``VLLM_ENABLE_STARTUP_PLAN=1`` and a run's plans are staged. Never raises."""
    try:
        import vllm.envs as envs

        staged = staged_plans_dir()
        if not getattr(envs, "VLLM_ENABLE_STARTUP_PLAN", False) or not staged.is_dir():
            return None
        from vllm.v1.worker.startup_plan import _plan_path, compute_plan_fingerprint

        fingerprint = compute_plan_fingerprint(worker.vllm_config, worker.rank, worker.parallel_config.world_size)
        line = place_plan(staged, str(fingerprint), Path(_plan_path(fingerprint)))
        log.info("tunecache: %s (rank %s, pid %s)", line, worker.rank, os.getpid())
        return line
    except Exception as exc:
        log.warning("tunecache: startup plan not placed: %s: %s", type(exc).__name__, exc)
        return None
