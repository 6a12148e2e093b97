"""Where this pod installs each artifact kind: the destinations, registered against the
contract's kinds (:data:`tunecache.contract.KINDS`).

A destination is one kind's pod-side half: made with where to install (``None`` fields: this
pod's own directories), it stages a fetched run's artifacts of its kinds
(``stage(fetched) -> Commit``: checks and resolves everything, writes nothing; the commit
writes) and tells, before any boot, what would become of a stored run's artifacts of a kind
here (``preflight(run, kind)``, for ``tunecache doctor``). Each class registers with
:func:`registers` for the kinds it installs (the tactics have one per layout: a plain file,
vLLM's rank files, FlashInfer's v2 store).

The classes live beside what they install with (:mod:`tunecache.client.jit_install`,
:mod:`tunecache.client.layouts`, :mod:`tunecache.client.warm_state`), which import this
module and nothing imports back: :mod:`tunecache.client.pipeline` imports them all (which
registers them) and answers which classes install a kind.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from tunecache.contract import KINDS, ArtifactKind

#: Writes one artifact kind's staged install; returns the :class:`~tunecache.client.install.InstallResult`
#: fields it sets.
Commit = Callable[[], dict[str, Any]]


class Destination:
    """Base of every destination: the kinds it installs and what it says of them before a boot."""

    kinds: ClassVar[tuple[ArtifactKind, ...]] = ()

    @classmethod
    def made_for(cls, kinds: frozenset[ArtifactKind], where: Path | None) -> Destination:
        """The destination installing ``kinds`` (of its :attr:`kinds`) into ``where`` (``None``:
        this pod's own directory); by default its first field is where."""
        return cls() if where is None else cls(where)  # type: ignore[call-arg]

    def stage(self, fetched: Any) -> Commit:
        """Check and resolve everything for installing ``fetched`` (a
        :class:`~tunecache.client.install.FetchedTuning`) here; the returned commit writes."""
        raise NotImplementedError

    def preflight(self, run: Any, kind: ArtifactKind) -> tuple[bool | None, str]:
        """What becomes of ``run``'s (a :class:`tunecache.contract.TuningRunRead`) artifacts of
        ``kind`` here, fetched nothing and written nothing: whether they load (``None``: cannot be
        told before vLLM builds its config) and why, in one line. Trust and package versions are
        checked apart (:func:`tunecache.client.preflight.preflight`)."""
        raise NotImplementedError


#: The destination classes of each kind a pod installs, in the order they registered.
DESTINATIONS: dict[ArtifactKind, tuple[type[Destination], ...]] = {}

D = TypeVar("D", bound=type[Destination])


def registers(*kinds: ArtifactKind) -> Callable[[D], D]:
    """Class decorator: the class installs ``kinds`` (each one a pod installs, by its facts).

    Raises:
        ValueError: a kind the contract says pods do not install.
    """

    def register(cls: D) -> D:
        for kind in kinds:
            if not KINDS[kind].installed:
                raise ValueError(f"{kind} is kept with the run only: pods do not install it")
            DESTINATIONS[kind] = (*DESTINATIONS.get(kind, ()), cls)
        cls.kinds = tuple(kinds)
        return cls

    return register

