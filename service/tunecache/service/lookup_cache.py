"""Lookup answers without the database where that is safe: :class:`LookupCache` keeps the
serialized answers per ``(generation, key, environment)``; the generation
(``repository.generation``) moves in the transaction that changes a current tuning, and a
request reads it (:class:`GenerationReader`, on a :class:`GenerationConnection` of its own)
before it looks in the cache, so no pod gets a run older than one that was current when its
request began, whichever process or replica answers."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable

import anyio.to_thread
from cachetools import LRUCache
from sqlalchemy import Connection, Engine

from tunecache.contract import EnvironmentMetadata, TuningKey
from tunecache.service import repository
from tunecache.service.single_flight import SingleFlight


class LookupCache:
    """Serialized lookup answers of one process, at most ``entries`` of them (LRU), and the
    computation of a missing one shared by every request that asks for it meanwhile.

    ``entries=0`` turns the cache off (every request computes its own answer). Used from
    one event loop; ``get``/``put`` are also thread-safe.
    """

    def __init__(self, entries: int):
        self._answers: LRUCache | None = LRUCache(maxsize=entries) if entries > 0 else None
        self._lock = threading.Lock()
        self._computing = SingleFlight()

    @staticmethod
    def _key(generation: int, key: TuningKey, environment: EnvironmentMetadata, variant: str | None,
             image: str | None) -> tuple:
        return (generation, tuple(key.model_dump().values()), environment.environment_hash(), variant, image)

    def get(self, generation: int, key: TuningKey, environment: EnvironmentMetadata,
            variant: str | None = None, image: str | None = None) -> tuple[int, bytes] | None:
        """``(status, body)`` answered at this generation (for this engine ``variant`` and the
        pods of this ``image``), or ``None``."""
        if self._answers is None:
            return None
        with self._lock:
            return self._answers.get(self._key(generation, key, environment, variant, image))

    def put(self, generation: int, key: TuningKey, environment: EnvironmentMetadata, status: int, body: bytes,
            variant: str | None = None, image: str | None = None) -> None:
        if self._answers is not None:
            with self._lock:
                self._answers[self._key(generation, key, environment, variant, image)] = (status, body)

    async def answer(self, generation: int, key: TuningKey, environment: EnvironmentMetadata,
                     compute: Callable[[], Awaitable[tuple[int, bytes]]], variant: str | None = None,
                     image: str | None = None) -> tuple[int, bytes]:
        """The cached ``(status, body)``, or ``compute()``'s, awaited once for all the requests
        that miss on the same ``(generation, key, environment, variant, image)`` at the same time
        (a cold process under a boot storm runs one lookup query, not one per pod).

        Raises:
            whatever ``compute`` raises, to every request waiting on it (nothing is cached).
        """
        if self._answers is None:
            return await compute()
        cached = self.get(generation, key, environment, variant, image)
        if cached is not None:
            return cached

        async def compute_and_keep() -> tuple[int, bytes]:
            status, body = await compute()
            self.put(generation, key, environment, status, body, variant, image)
            return status, body

        return await self._computing.run(self._key(generation, key, environment, variant, image), compute_and_keep)


class GenerationReader:
    """Shared reads of the tuning generation for the requests of one event loop.

    ``read`` is the blocking read (run in a worker thread). :meth:`current` returns a
    value read by a query that started after the call: a request never gets a generation
    older than the one committed before it arrived.
    """

    def __init__(self, read: Callable[[], int], limiter: anyio.CapacityLimiter | None = None):
        self._read = read
        self._limiter = limiter  # threads of its own: never behind routes that wait for the database
        self._next: asyncio.Future[int] | None = None  # for requests that came in after the read in flight began
        self._reading = False
        self._tasks: set[asyncio.Task] = set()
        #: The last generation read, and when its read began (``time.monotonic()``); ``None`` before the first.
        self.last: tuple[int, float] | None = None

    def last_read(self, max_age_s: float) -> int | None:
        """The generation of the last successful read if that read began at most
        ``max_age_s`` seconds ago (what a stale answer may be served at), else ``None``."""
        last = self.last
        if last is None or time.monotonic() - last[1] > max_age_s:
            return None
        return last[0]

    def age(self) -> float:
        """Seconds since the last successful read began (``inf`` before the first)."""
        return time.monotonic() - self.last[1] if self.last is not None else float("inf")

    async def current(self) -> int:
        """The generation, from a read that began after this call.

        Raises:
            whatever the read raises (database unavailable: ``OperationalError``, ...).
        """
        if self._next is None:
            self._next = asyncio.get_running_loop().create_future()
        waiting = self._next
        if not self._reading:
            self._start()
        return await asyncio.shield(waiting)

    def _start(self) -> None:
        waiting, self._next = self._next, None
        self._reading = True

        async def read() -> None:
            began = time.monotonic()
            try:
                value = await anyio.to_thread.run_sync(self._read, limiter=self._limiter)
                self.last = (value, began)
                waiting.set_result(value)
            except BaseException as exc:  # every waiter gets the failure
                waiting.set_exception(exc)
            finally:
                self._reading = False
                if self._next is not None:
                    self._start()

        task = asyncio.get_running_loop().create_task(read())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


class GenerationConnection:
    """One autocommit connection that reads the tuning generation: a read is one round trip
    (no pool checkout, no pre-ping, no BEGIN/COMMIT), which under a boot storm on a busy
    machine is the difference between a few and a hundred milliseconds at p99.

    Used by one thread at a time (:class:`GenerationReader` runs one read at a time). After
    a failed read the connection is dropped and the next read opens a new one.
    """

    def __init__(self, engine: Engine):
        self._engine = engine
        self._connection: Connection | None = None

    def read(self) -> int:
        """The current generation.

        Raises:
            sqlalchemy.exc.OperationalError (or another DBAPI error): the database is
                unreachable or the statement timed out.
        """
        try:
            if self._connection is None:
                self._connection = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            return repository.generation(self._connection)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self._connection is not None:
            connection, self._connection = self._connection, None
            try:
                connection.invalidate()
                connection.close()
            except Exception:  # noqa: BLE001 - already broken; the next read reconnects
                pass
