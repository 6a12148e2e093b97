"""The development variables: read by the tests, ``scripts/test.sh`` and the benchmarks, never
by tunecache itself. Each declared as a setting's field is, its default and its ``description``
(README's table of them is made from these by ``scripts/settings_docs.py``)."""

from __future__ import annotations

from pydantic import Field
from pydantic.fields import FieldInfo

DEVELOPMENT_VARIABLES: dict[str, FieldInfo] = {
    "TUNECACHE_TEST_POSTGRES_URL": Field(default="postgresql+psycopg://postgres@127.0.0.1:5432/test", description=(
        "the PostgreSQL server of the tests' PostgreSQL variants; each test gets its own schema, dropped "
        "afterwards; where it cannot be reached they skip with the reason")),
    "TUNECACHE_REQUIRE_POSTGRES": Field(default=None, description=(
        "`1`: a PostgreSQL variant that would skip fails instead (`.ci/run` sets it)")),
    "TUNECACHE_TEST_PART": Field(default=None, json_schema_extra={"shown_default": "unset: every test"}, description=(
        "`parallel` or `serial`: the tests of that part only (`scripts/test.sh` runs the tests that must run alone "
        "in a second, serial pytest run after the rest in parallel)")),
    "TUNECACHE_TEST_WORKERS": Field(default="auto", description=(
        "the number of pytest-xdist workers of `scripts/test.sh` (`auto`: one per CPU core)")),
    "TUNECACHE_VLLM_RELEASES": Field(default=None, json_schema_extra={
        "shown_default": "the oldest and the newest release"}, description=(
        "the vLLM releases the contract tests (`tests/contract/`) read: comma-separated versions, or `all` (one "
        "of each minor release of `tunecache.engines.vllm.releases`' table)")),
    "TUNECACHE_VLLM_WHEELS": Field(default="~/.cache/tunecache-tests/vllm-wheels", description=(
        "where those vLLM wheels are kept; a release whose wheel cannot be downloaded skips, naming why")),
    "TUNECACHE_VLLM_ENVS": Field(default="~/.cache/tunecache-tests/vllm-envs", description=(
        "where `tests/contract/test_vllm_config_names.py` keeps an environment per release (0.25.0, 0.34.0) in "
        "which that release builds its real `VllmConfig` on the CPU, built once; one that cannot be built skips, "
        "naming why")),
    "TUNECACHE_CHROMIUM": Field(default="/usr/bin/chromium", description=(
        "the Chromium the dashboard's browser tests drive; they skip, naming the reason, where it is not installed")),
    "TUNECACHE_DASHBOARD_SCREENSHOT": Field(default=None, description=(
        "a path the dashboard test copies its fleet page's screenshot to")),
    "TUNECACHE_DASHBOARD_SCREENSHOTS": Field(default=None, description=(
        "a directory the dashboard's layout test keeps its pictures in, the fleet page and one other page at each "
        "of 1280, 1440 and 1920 px (`docs`: the operator guide's `docs/dashboard-<page>-<width>.png`)")),
    "TUNECACHE_API_DOCS_SCREENSHOT": Field(default=None, description=(
        "a path the dashboard test copies the first screen of `/docs` to (`docs/api-docs-offline.png`)")),
    "TUNECACHE_BENCH_POSTGRES_URL": Field(default="postgresql+psycopg://postgres@127.0.0.1:5432/test", description=(
        "the PostgreSQL server of `bench/boot_storm.py` and `bench/request_memory.py` (their `--postgres`)")),
}
