"""Shared fixtures: a migrated database on SQLite and on the real PostgreSQL, and the app.

PostgreSQL: ``TUNECACHE_TEST_POSTGRES_URL`` (default
``postgresql+psycopg://postgres@127.0.0.1:5432/test``). Each test gets its own schema,
dropped afterwards. Where the server cannot be reached the PostgreSQL variants are
skipped with the reason, unless ``TUNECACHE_REQUIRE_POSTGRES=1`` (set by ``.ci/run``),
which turns that skip into a failure.

A test that takes ``engine`` or ``server`` on SQLite gets a copy of a database migrated
once per test process; on PostgreSQL its schema is migrated in the test process. The
migrations run from empty in tests/unit/service/test_migrations.py, in ``tunecache db
upgrade`` (tests/e2e/test_cli.py) and in each ``tunecache serve`` a test starts on a
database of its own.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text

from tunecache.service import db

from tests.support.builders import make_token
from tests.support import forked
from tests.support.serve import free_port, wait_healthy
from tests.support.torch_tests import cuda_available

POSTGRES_URL = os.environ.get(
    "TUNECACHE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


@pytest.fixture(autouse=True)
def _private_data_dir(tmp_path, monkeypatch):
    """Every test (and every process it starts) keeps the service's files in its own
    directory, never in the user's data directory."""
    monkeypatch.setenv("TUNECACHE_DATA_DIR", str(tmp_path / "tunecache-data"))
    # and what pods installed before (tunecache.client.installed) is this test's own
    monkeypatch.setenv("TUNECACHE_STATE_DIR", str(tmp_path / "pod-state"))
    # and the command's config file (tunecache.cli_config) is this test's own, none unless it writes one
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    # and its tuners' GPU lock (tunecache.service.tuner.guard) is its own: tests in parallel hold "one GPU" each
    monkeypatch.setenv("TUNECACHE_GPU_LOCK_DIR", str(tmp_path / "gpu-locks"))
    # Tests that post many jobs from one address are not about the rate limit
    # (tests/unit/service/routes/test_http_semantics.py::test_job_requests_past_the_rate_get_429 is).
    monkeypatch.setenv("TUNECACHE_JOB_REQUEST_RATE", "100000/minute")


def _postgres_unavailable() -> str | None:
    try:
        engine = create_engine(POSTGRES_URL, connect_args={"connect_timeout": 3})
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
        engine.dispose()
        return None
    except Exception as exc:  # any failure to connect is a reason to skip
        return f"PostgreSQL not reachable at {POSTGRES_URL}: {type(exc).__name__}: {str(exc).splitlines()[0]}"


def require_postgres() -> None:
    reason = _postgres_unavailable()
    if reason is None:
        return
    if os.environ.get("TUNECACHE_REQUIRE_POSTGRES") == "1":
        pytest.fail(f"TUNECACHE_REQUIRE_POSTGRES=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture
def postgres_schema_url() -> Iterator[str]:
    """URL of a fresh, empty PostgreSQL schema (search_path set through the URL)."""
    require_postgres()
    schema = f"tunecache_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(POSTGRES_URL)
    with admin.begin() as connection:
        connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    sep = "&" if "?" in POSTGRES_URL else "?"
    try:
        yield f"{POSTGRES_URL}{sep}options=-csearch_path%3D{schema}"
    finally:
        with admin.begin() as connection:
            connection.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture(scope="session")
def _migrated_sqlite(tmp_path_factory) -> Path:
    """A SQLite database migrated to the head revision, once per test process."""
    path = tmp_path_factory.mktemp("migrated") / "tunecache.db"
    engine = db.create_db_engine(f"sqlite:///{path}")
    db.upgrade(engine)
    engine.dispose()  # the last connection checkpoints the WAL into the file
    assert not path.with_name(path.name + "-wal").exists()
    return path


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def database_url(request, tmp_path) -> str:
    """A database of each kind: empty, but on SQLite, for a test that takes ``engine`` or
    ``server``, a copy of one already migrated to the head revision."""
    if request.param == "sqlite":
        path = tmp_path / "tunecache.db"
        if {"engine", "server"} & set(request.fixturenames):
            shutil.copyfile(request.getfixturevalue("_migrated_sqlite"), path)
        return f"sqlite:///{path}"
    return request.getfixturevalue("postgres_schema_url")


@pytest.fixture
def engine(database_url) -> Iterator[Engine]:
    """A database migrated to the head revision (on SQLite, ``upgrade`` finds nothing to do)."""
    engine = db.create_db_engine(database_url)
    db.upgrade(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def app_client(engine, tmp_path):
    from fastapi.testclient import TestClient

    from tunecache.service.app import create_app
    from tunecache.service.settings import Settings

    settings = Settings(database_url=str(engine.url), max_upload_bytes=1_000_000, max_json_bytes=1_000_000, worker="off",
                        data_dir=tmp_path / "data")
    with TestClient(create_app(settings, engine=engine)) as client:
        # Sends an admin token unless a test says otherwise (tests/unit/service/test_policy.py is about tokens).
        client.headers["Authorization"] = f"Bearer {make_token(engine, 'test-admin', 'admin')}"
        yield client


@pytest.fixture
def node_signing_key(tmp_path, monkeypatch):
    """A tuner node's signing key; its public key is what this test's pods trust
    (``TUNECACHE_TRUSTED_KEYS``, inherited by every process the test starts)."""
    from tunecache.signing import generate_signing_key, load_signing_key

    files = generate_signing_key(tmp_path / "node-key")
    monkeypatch.setenv("TUNECACHE_TRUSTED_KEYS", str(files.public_path))
    return load_signing_key(files.private_path)


#: Tests that must not share the machine with others, because what they assert is a short
#: wall-clock window that a loaded machine could miss: ``scripts/test.sh`` runs them in a
#: second, serial pytest run (``TUNECACHE_TEST_PART=serial``) after the rest in parallel
#: (``TUNECACHE_TEST_PART=parallel``); unset, every test runs. Matched by module file name or
#: by ``module::test`` name, wherever the module sits under tests/. A test with generous
#: bounds only (a 10 s slack or more, "at least N s", a 60 s liveness window) or none runs
#: in parallel, however long it waits.
SERIAL = {
    # the boot storm saturates the CPUs on purpose; the keep-alive test sleeps 2.5 s against a 1 s setting
    "test_boot_storm.py::test_three_hundred_pods_booting_at_once_are_all_answered",
    "test_boot_storm.py::test_idle_connections_are_closed_after_the_keep_alive_setting",
    # a fast 503 within 5 s of a 1 s statement timeout
    "test_frozen_database.py",
    # issue 21: answers within 8 s of a 2 s lock timeout, health within 3 s; a file served within 10 s while every thread waits;
    # 60 pushes at once within the client's retries
    "test_storage_failures.py::test_a_frozen_database_still_answers_boots_health_and_files",
    "test_storage_failures.py::test_file_serving_never_waits_for_routes_stuck_on_the_database",
    "test_storage_failures.py::test_sixty_identical_pushes_at_once_all_succeed",
    # a 2 s install deadline that a pull through a proxy must also meet; 2.4-3.5 s; under 2 s
    "test_install_deadline.py::test_the_lookup_and_the_download_share_one_deadline",
    "test_install_deadline.py::test_a_body_that_stops_after_a_trickle_is_cut_at_the_deadline",
    "test_install_deadline.py::test_no_retry_is_started_that_could_not_end_before_the_deadline",
    # "about the same time": within the report timeout (1 s) and 1.5 s of slack
    "test_reports.py::test_a_pull_installs_in_about_the_same_time_when_reports_hang_or_fail",
    "test_reports.py::test_a_vllm_worker_boots_in_about_the_same_time_when_reports_hang",
    # a 0.3 s lease, a 0.5 s heartbeat with a cancel within 10 s, a 0.2 s heartbeat seen within 0.6 s
    "test_job_control.py::test_a_marked_job_whose_worker_died_is_settled_cancelled_never_reclaimed",
    "test_job_control.py::test_cancelling_a_running_job_terminates_the_tuner_child_and_records_no_run",
    "test_job_control.py::test_workers_beat_and_say_which_are_live",
    "test_jobs.py::test_retune_wait_follows_the_job_to_its_end",  # a 1 s job, progress polled every 0.2 s
    # every health check and lookup answered within 2 s beside 100-200 slow clients; an
    # unread answer dropped within 4 s of a 1 s send timeout
    "test_slow_clients.py::test_slow_bodies_and_unread_answers_leave_the_service_answering",
    "test_slow_clients.py::test_an_answer_the_client_does_not_read_is_dropped",
}


def _serial(item) -> bool:
    name = item.path.name
    return name in SERIAL or f"{name}::{item.originalname}" in SERIAL


def pytest_collection_modifyitems(config, items):
    """GPU tests run only where CUDA is; elsewhere they skip, pointing at the recorded H200 runs.

    A module that sets ``SERVER_DATABASE_INCIDENTAL = True`` tests what happens on a pod
    (installs, the plugin, deadlines): its server runs on SQLite only, and its PostgreSQL
    variants are deselected (counted as deselected in pytest's summary). Storage, the job
    queue, reports and history run on both databases in their own modules.
    """
    incidental = [item for item in items
                  if getattr(item.module, "SERVER_DATABASE_INCIDENTAL", False)
                  and getattr(item, "callspec", None) is not None
                  and item.callspec.params.get("database_url") == "postgresql"]
    if incidental:
        config.hook.pytest_deselected(items=incidental)
        items[:] = [item for item in items if item not in incidental]
    part = os.environ.get("TUNECACHE_TEST_PART")
    if part in ("parallel", "serial"):
        other = [item for item in items if _serial(item) != (part == "serial")]
        if other:
            config.hook.pytest_deselected(items=other)
            items[:] = [item for item in items if item not in other]
    if cuda_available():
        return
    skip = pytest.mark.skip(
        reason="needs an NVIDIA GPU with FlashInfer; its H200 runs are recorded under results/gpu/"
    )
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def server(database_url, tmp_path):
    """A real `tunecache serve` process on a free port. Its database is at the head revision
    before it starts: on SQLite a copy of a migrated one (serve migrates a new SQLite file
    itself), on PostgreSQL migrated here, where an operator runs `tunecache db upgrade`
    (tests/e2e/test_cli.py runs that command)."""
    if database_url.startswith("postgresql"):
        engine = db.create_db_engine(database_url)
        try:
            db.upgrade(engine)
        finally:
            engine.dispose()
    port = free_port()
    process = forked.popen(["serve", "--port", str(port), "--database", database_url],
                           {**os.environ, "TUNECACHE_WORKER": "off"}, tmp_path / "serve.log")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(process, url, tmp_path / "serve.log", tries=200)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=20)
