"""What an engine's main process hands to the workers it starts: one typed record over the
environment variables of :data:`tunecache.client.settings.POD_HANDOFF_VARIABLES`.

vLLM starts its engine core and workers as child processes (``fork`` or ``spawn``), which
inherit the main process's ``os.environ``: that is the only way in. The main process sets
the fields it has (:meth:`Handoff.hand_over`, as each phase finishes: the boot's start when
vLLM loads the plugin, the engine arguments, then the installed run's directories); each
worker reads them all (:meth:`Handoff.from_environment`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tunecache.engines.vllm.objects import Json

#: Each field of :class:`Handoff` and the variable that carries it (exactly the variables of
#: :data:`tunecache.client.settings.POD_HANDOFF_VARIABLES`).
VARIABLES: dict[str, str] = {
    "boot_started_ns": "TUNECACHE_BOOT_STARTED_NS",
    "warm_state_run": "TUNECACHE_WARM_STATE_RUN",
    "compile_cache": "TUNECACHE_COMPILE_CACHE",
    "engine_args": "TUNECACHE_ENGINE_ARGS",
    "flashinfer_aot_dir": "TUNECACHE_FLASHINFER_AOT_DIR",
    "deep_gemm_dir": "DG_JIT_CACHE_DIR",
}


@dataclass(frozen=True)
class Handoff:
    """The boot's hand-off from the engine's main process to its workers (``None``: not set)."""

    boot_started_ns: int | None = None
    """When the boot started (nanoseconds since the epoch): the attestation counts files written since."""
    warm_state_run: int | None = None
    """The run whose warm state the main process installed: the workers install that run's
    tactics only, fetched by its id (never what became current meanwhile), or nothing."""
    compile_cache: Path | None = None
    """The run's compile cache, staged under the cache root's ``.tunecache/`` for the workers."""
    engine_args: dict[str, Json] | None = None
    """The pod's engine arguments that differ from vLLM's defaults, for the workers' reports
    (``None`` also when the variable is not a JSON object)."""
    flashinfer_aot_dir: Path | None = None
    """The FlashInfer AOT directory of the run's JIT modules, which each worker points its FlashInfer at."""
    deep_gemm_dir: Path | None = None
    """The DeepGEMM cache directory the run's kernels were merged into (DeepGEMM's own ``DG_JIT_CACHE_DIR``)."""

    def to_environment(self) -> dict[str, str]:
        """The variables of the fields that are set, as their text (``engine_args`` as JSON)."""
        found: dict[str, str] = {}
        for field in fields(self):
            value = getattr(self, field.name)
            if value is None:
                continue
            found[VARIABLES[field.name]] = json.dumps(value) if field.name == "engine_args" else str(value)
        return found

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> Handoff:
        """The hand-off in ``environ`` (this process's environment by default); a variable that
        is empty, or not what its field holds, is not set."""
        environ = os.environ if environ is None else environ
        text = {name: environ.get(variable) or None for name, variable in VARIABLES.items()}
        started, run = (_whole(text[name]) for name in ("boot_started_ns", "warm_state_run"))
        try:
            args = json.loads(text["engine_args"]) if text["engine_args"] else None
        except ValueError:
            args = None
        paths = {name: Path(text[name]) if text[name] else None
                 for name in ("compile_cache", "flashinfer_aot_dir", "deep_gemm_dir")}
        return cls(boot_started_ns=started, warm_state_run=run if run is None or run > 0 else None,
                   engine_args=args if isinstance(args, dict) else None, **paths)

    def hand_over(self) -> None:
        """Put the fields that are set into this process's environment, for the processes it starts."""
        os.environ.update(self.to_environment())


def _whole(text: str | None) -> int | None:
    """``text`` as a whole number (``None``: empty, or not one)."""
    try:
        return int(text) if text and text.strip().isdigit() else None
    except ValueError:
        return None
