"""The install pipeline: which destination installs each kind, and what a pod installs, by kind.

Every route that installs a run (``tunecache pull``, the Python API, the vLLM plugin's main
process and its workers) names the kinds it installs and, where it is not this pod's own,
where; :meth:`InstallTarget.of` makes each kind's registered destination
(:func:`destinations_of`) for them, and :func:`tunecache.client.install.install` stages and
writes them in :data:`tunecache.contract.KINDS`' order, the tactics last. A caller never
names a kind's fields: a new kind is one more entry in the contract's table and one more
registered destination.

Importing this module registers every destination (:mod:`tunecache.client.jit_caches`, :mod:`tunecache.client.jit_install`,
:mod:`tunecache.client.layouts`, :mod:`tunecache.client.warm_state`); the registry itself
(:mod:`tunecache.client.destinations`) imports none of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from tunecache.client import jit_caches, jit_install, layouts, startup_plan, warm_state  # noqa: F401 - importing them registers their destinations
from tunecache.client.destinations import DESTINATIONS, Destination
from tunecache.contract import KINDS, ArtifactKind, kinds_where

#: What makes a boot compile nothing besides the tactics, which a pod installs only from a run
#: signed by a trusted key: FlashInfer's JIT modules, DeepGEMM's cache, Triton's cache, vLLM's
#: model inspections and its compile cache (:data:`tunecache.contract.KINDS`' ``executable``).
BOOT_KINDS: tuple[ArtifactKind, ...] = kinds_where(executable=True)
#: The warm state ``tunecache pull --warm-state`` installs: :data:`BOOT_KINDS` but the JIT
#: modules, which ``--jit`` asks for apart.
WARM_STATE: tuple[ArtifactKind, ...] = tuple(k for k in BOOT_KINDS if k is not ArtifactKind.FLASHINFER_JIT_MODULE)

#: Where a kind's destination is made for a route that does not install into this pod's own
#: directory: the directory, or a destination made by the caller (e.g. JIT modules that load
#: through FlashInfer's AOT path).
Where = Path | Destination | None


def destinations_of(kind: ArtifactKind) -> tuple[type[Destination], ...]:
    """The destination classes that install ``kind`` (``()``: pods do not install it), in the
    order they registered (the tactics have one per layout)."""
    return DESTINATIONS.get(kind, ())


@dataclass(frozen=True)
class InstallTarget:
    """Where this pod installs a fetched run: the kinds it installs besides the tactics, each
    through its destination (:attr:`steps`, in :data:`tunecache.contract.KINDS`' order), and the
    tactics' destination (``None``: installed elsewhere, e.g. by the vLLM plugin's workers),
    written last so that a failure before them leaves the files FlashInfer or vLLM read as they
    were. Made with :meth:`of`."""

    kinds: tuple[ArtifactKind, ...] = ()
    steps: tuple[Destination, ...] = ()
    tactics: Destination | None = None

    @classmethod
    def of(cls, kinds: Iterable[ArtifactKind], tactics: Destination | None = None,
           at: Mapping[ArtifactKind, Where] | None = None) -> InstallTarget:
        """The target installing ``kinds`` (each one pods install) and ``tactics``: each kind by
        its registered destination, made for the kinds of it asked for
        (:meth:`~tunecache.client.destinations.Destination.made_for`) in this pod's own
        directory, or where ``at`` says (a path, or a destination made by the caller).

        Raises:
            ValueError: a kind pods do not install."""
        asked = set(kinds)
        at = dict(at or {})
        ordered = tuple(kind for kind in KINDS if kind in asked)
        given = {type(d): d for d in at.values() if isinstance(d, Destination)}  # each covers its class's kinds
        made: dict[type[Destination], Destination] = {}
        for kind in ordered:
            classes = destinations_of(kind)
            if not classes:
                raise ValueError(f"{kind} is kept with the run only: pods do not install it")
            destination_class = next((c for c in classes if c in given), classes[0])
            if destination_class in made:
                continue
            if destination_class in given:
                made[destination_class] = given[destination_class]
                continue
            mine = frozenset(k for k in destination_class.kinds if k in asked)
            where = next((at[k] for k in destination_class.kinds if isinstance(at.get(k), Path)), None)
            made[destination_class] = destination_class.made_for(mine, where)
        steps = list(made.values())
        return cls(ordered, tuple(steps), tactics)

    def destinations(self) -> list[Destination]:
        """The destinations set, in the order they are written (the tactics last)."""
        return [*self.steps, *([self.tactics] if self.tactics is not None else [])]

    def fetch_options(self) -> dict[str, bool]:
        """What :func:`tunecache.client.install.fetch_tuning` must fetch besides the tactics for
        this target: each kind's ``fetch_option`` (:data:`tunecache.contract.KINDS`)."""
        options = {facts.fetch_option for facts in KINDS.values() if facts.fetch_option}
        return {option: any(KINDS[kind].fetch_option == option for kind in self.kinds) for option in sorted(options)}

