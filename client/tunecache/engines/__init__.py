"""The inference engines tunecache serves, each behind one adaptor
(:class:`tunecache.engines.base.EngineAdaptor`): :data:`ENGINES` by name, :func:`engine_for`.

An engine is a package here (:mod:`tunecache.engines.vllm`) with its adaptor; a release of an
engine is a row of its adaptor's releases table. Pure, as :mod:`tunecache.formats` is, so that
the pod's code and the service both ask it.
"""

from __future__ import annotations

from tunecache.engines.base import EngineAdaptor
from tunecache.engines.vllm.adaptor import VllmAdaptor

#: Every engine tunecache knows, by the name keys give it: exactly the contract's
#: :data:`tunecache.contract.ENGINE_NAMES` (a key's ``engine``), each adaptor under its own
#: :attr:`~tunecache.engines.base.EngineAdaptor.name`. Where to add an engine: its adaptor
#: package here, its name there (docs/architecture.md).
ENGINES: dict[str, EngineAdaptor] = {"vllm": VllmAdaptor()}


def engine_for(name: str) -> EngineAdaptor:
    """The adaptor of engine ``name``.

    Raises:
        KeyError: an engine tunecache does not know (the message names those it knows)."""
    try:
        return ENGINES[name]
    except KeyError:
        raise KeyError(f"engine {name!r} is not one tunecache knows ({', '.join(sorted(ENGINES))})") from None
