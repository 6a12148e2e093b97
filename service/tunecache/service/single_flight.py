"""Concurrent calls for the same key that share one computation (:class:`SingleFlight`): a
lookup answer not cached yet, an artifact being mirrored, a health probe."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import TypeVar

T = TypeVar("T")


class SingleFlight:
    """Concurrent calls for the same key share one computation (on one event loop)."""

    def __init__(self) -> None:
        self._pending: dict[Hashable, asyncio.Future] = {}

    async def run(self, key: Hashable, compute: Callable[[], Awaitable[T]]) -> T:
        """``compute()``'s result, computed once for every caller that asks for ``key``
        while it runs; a caller that gives up does not cancel it for the others.

        Raises:
            whatever ``compute`` raises, to every caller that waited on it.
        """
        pending = self._pending.get(key)
        if pending is None:
            pending = self._pending[key] = asyncio.ensure_future(compute())
            pending.add_done_callback(lambda _: self._pending.pop(key, None))
        return await asyncio.shield(pending)
