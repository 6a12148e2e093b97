"""What tunecache asks of an inference engine, behind one interface: :class:`EngineAdaptor`.

One adaptor per engine (the way vLLM keeps each compiler behind
``vllm/compilation/compiler_interface.py::CompilerInterface``), with the engine's release
branches inside it: which releases tunecache knows and what each gets, where a release reads
its autotune results, the names of its compile cache, what the tuner points the engine's caches
at while it harvests, and which of the engine's functions the pod's plugin wraps. Callers ask
the adaptor (:func:`tunecache.engines.engine_for`), never the engine's modules.

Pure, as :mod:`tunecache.formats` is: the standard library, pydantic and the contract at import
time; an engine's own modules are imported inside the methods that ask them. What runs in the
pod (the hooks themselves, installing) stays in ``tunecache.client`` and asks the adaptor.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar


@dataclass(frozen=True)
class HookTarget:
    """One function of the engine the plugin wraps: ``module``'s ``qualname`` (``Class.method``
    for a method), named by what the plugin does there (``role``)."""

    role: str
    module: str
    """Its module's import name (``vllm.v1.worker.gpu_worker``)."""
    qualname: str
    """``function`` or ``Class.method``."""

    @property
    def source_path(self) -> str:
        """Where its module's source is in the engine's wheel, if it is a module (not a package)."""
        return self.module.replace(".", "/") + ".py"


class EngineAdaptor(ABC):
    """Everything tunecache knows of one inference engine. Its releases are rows of its own
    type (each adaptor's ``Release``); ``None`` where a release is not one tunecache knows."""

    name: ClassVar[str]
    """The engine's name, as keys and runs name it (``vllm``)."""

    @abstractmethod
    def release_of(self, version: str) -> Any | None:
        """The release row of ``version`` (``"0.25.0"``, ``"0.33.0rc1"``), ``None`` for a
        release tunecache does not know."""

    @abstractmethod
    def known_range(self) -> str:
        """The releases tunecache knows, for a one-line refusal (``"0.25-0.34"``)."""

    @abstractmethod
    def this_release(self) -> tuple[str, Any | None]:
        """The version of the engine this process imports, and its row (``None``: unknown).

        Raises:
            ImportError: the engine is not importable here."""

    @abstractmethod
    def autotune_layout(self, release: Any) -> str:
        """Where ``release`` reads FlashInfer's autotune results (a name its module documents)."""

    @abstractmethod
    def hook_targets(self, release: Any) -> tuple[HookTarget, ...]:
        """The functions the plugin wraps in ``release`` (the contract tests check that each
        exists in that release's own code)."""

    @abstractmethod
    def compile_cache_names(self, node: Any, pod: Any | None = None) -> dict[str, str]:
        """The compile cache's directories, as the tuning node's ``node`` factors name them (path
        in the artifact -> path under the engine's compile cache), under the names ``pod``'s
        factors give (``None``: the node's own names)."""

    @abstractmethod
    def compile_cache_differences(self, node: Any, pod: Any) -> list[str]:
        """Each factor by which ``pod`` would not load the node's compile cache, one line each
        (``[]``: it loads it under :meth:`compile_cache_names`)."""

    @abstractmethod
    def harvest_environment(self, scratch: Path) -> dict[str, str]:
        """The variables that point the engine's caches into ``scratch`` while the tuner runs
        its warmup (what it writes there is harvested, kind by kind)."""

    @abstractmethod
    def harvest_dir(self, variable: str) -> str:
        """The directory under the scratch directory that :meth:`harvest_environment` points
        ``variable`` at."""
