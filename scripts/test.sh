#!/usr/bin/env bash
# Run the test suite from a fresh checkout: make .venv, install, run pytest.
# PostgreSQL tests use TUNECACHE_TEST_POSTGRES_URL (default postgresql+psycopg://postgres@127.0.0.1:5432/test)
# and skip with the reason where it is unreachable (TUNECACHE_REQUIRE_POSTGRES=1 makes that a failure).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
# CPU build of torch (from the local wheel store where there is one), then FlashInfer: the
# tests exercise FlashInfer's real cache loader and the tuner's child process on the CPU.
python -m pip install -q torch==2.13.0
# Both distributions from the checkout: tunecache-client (client/) and tunecache-server (.).
python -m pip install -q -e ./client -e '.[test,tuner]'
exec python -m pytest "$@"
