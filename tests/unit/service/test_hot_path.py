"""The boot path's shared work: one computation per key for concurrent callers
(SingleFlight, LookupCache.answer) and the generation read on its own connection, which
survives losing it (GenerationConnection), on SQLite and the real PostgreSQL."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import text, update
from sqlalchemy.exc import DBAPIError

from tunecache.contract import EnvironmentMetadata, TuningKey
from tunecache.service import repository
from tunecache.service.db import session_factory
from tunecache.service.hot_path import GenerationConnection, LookupCache, SingleFlight
from tunecache.service.models import TuningGeneration

KEY = TuningKey(gpu_name="NVIDIA H200", arch="sm90", model="m", max_num_batched_tokens=8192)
ENVIRONMENT = EnvironmentMetadata(flashinfer_version="0.7.4", cuda_version="13.0", cublas_version="13.1",
                                  cudnn_version="91400", cudnn_frontend_version="1.16.0", cutlass_dsl_version="4.3",
                                  gpu="NVIDIA H200")


def test_single_flight_computes_once_for_concurrent_callers_and_again_after():
    calls = 0

    async def compute() -> int:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.05)
        return calls

    async def main() -> tuple[list[int], int]:
        flight = SingleFlight()
        together = await asyncio.gather(*(flight.run("k", compute) for _ in range(50)))
        later = await flight.run("k", compute)
        return together, later

    together, later = asyncio.run(main())
    assert together == [1] * 50
    assert later == 2 and calls == 2


def test_single_flight_gives_the_failure_to_every_waiter_and_keeps_nothing():
    calls = 0

    async def failing() -> int:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.01)
        raise RuntimeError("database gone")

    async def main() -> list:
        flight = SingleFlight()
        results = await asyncio.gather(*(flight.run("k", failing) for _ in range(10)), return_exceptions=True)
        results.append(await flight.run("k", lambda: asyncio.sleep(0, result=7)))
        return results

    results = asyncio.run(main())
    assert all(isinstance(r, RuntimeError) for r in results[:10]) and calls == 1
    assert results[10] == 7


def test_single_flight_survives_a_caller_that_gives_up():
    async def main() -> int:
        flight = SingleFlight()
        slow = lambda: asyncio.sleep(0.05, result=3)  # noqa: E731
        impatient = asyncio.ensure_future(flight.run("k", slow))
        patient = asyncio.ensure_future(flight.run("k", slow))
        await asyncio.sleep(0.01)
        impatient.cancel()
        return await patient

    assert asyncio.run(main()) == 3


def test_lookup_cache_answers_a_cold_herd_with_one_computation_per_generation():
    computed = []

    async def compute() -> tuple[int, bytes]:
        computed.append(1)
        await asyncio.sleep(0.02)
        return 200, b'{"id": 1}'

    async def main() -> None:
        cache = LookupCache(entries=16)
        answers = await asyncio.gather(*(cache.answer(1, KEY, ENVIRONMENT, compute) for _ in range(100)))
        assert set(answers) == {(200, b'{"id": 1}')}
        assert len(computed) == 1
        assert cache.get(1, KEY, ENVIRONMENT) == (200, b'{"id": 1}')
        await cache.answer(1, KEY, ENVIRONMENT, compute)
        assert len(computed) == 1  # cached
        await cache.answer(2, KEY, ENVIRONMENT, compute)
        assert len(computed) == 2  # the generation moved: computed again

    asyncio.run(main())


def test_lookup_cache_off_computes_every_time():
    computed = []

    async def compute() -> tuple[int, bytes]:
        computed.append(1)
        return 404, b"{}"

    async def main() -> None:
        cache = LookupCache(entries=0)
        for _ in range(3):
            assert await cache.answer(1, KEY, ENVIRONMENT, compute) == (404, b"{}")

    asyncio.run(main())
    assert len(computed) == 3


def _move_generation(engine) -> int:
    """What recording a run that becomes current does to the generation."""
    with session_factory(engine).begin() as session:
        session.execute(update(TuningGeneration).where(TuningGeneration.id == 1).values(value=TuningGeneration.value + 1))
    with session_factory(engine).begin() as session:
        return repository.generation(session)


def test_generation_connection_reads_what_was_committed(engine):
    connection = GenerationConnection(engine)
    try:
        before = connection.read()
        after = _move_generation(engine)
        assert after == before + 1
        assert connection.read() == after  # autocommit: no snapshot held between reads
    finally:
        connection.close()


@pytest.mark.postgres
def test_generation_connection_reconnects_after_losing_its_connection(postgres_schema_url):
    from sqlalchemy import create_engine

    from tunecache.service import db

    engine = db.create_db_engine(postgres_schema_url)
    db.upgrade(engine)
    connection = GenerationConnection(engine)
    try:
        first = connection.read()
        backend = connection._connection.exec_driver_sql("SELECT pg_backend_pid()").scalar()
        with create_engine(postgres_schema_url).connect() as admin:
            admin.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": backend})
        with pytest.raises(DBAPIError):
            connection.read()
        assert connection.read() == first  # a new connection, same answer
    finally:
        connection.close()
        engine.dispose()
