#!/usr/bin/env bash
# Run the test suite from a fresh checkout: make .venv, install, run pytest.
#   scripts/test.sh            the whole suite (what CI runs), in parallel where safe
#   scripts/test.sh --fast     the unit tests only (tests/unit), on SQLite, in parallel
# Further arguments go to pytest. TUNECACHE_TEST_WORKERS: the number of xdist workers (default auto).
# PostgreSQL tests use TUNECACHE_TEST_POSTGRES_URL (default postgresql+psycopg://postgres@127.0.0.1:5432/test)
# and skip with the reason where it is unreachable (TUNECACHE_REQUIRE_POSTGRES=1 makes that a failure).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
. .venv/bin/activate
# Installed once per version of what declares the dependencies (the editable installs follow
# the checkout's code by themselves): a stamp in .venv holds their hash.
stamp=.venv/.tunecache-installed
declared=$(cat pyproject.toml client/pyproject.toml scripts/test.sh | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$declared" ]; then
  python -m pip install -q --upgrade pip
  # --no-compile: pip would byte-compile every module of the 3 GB it installs (torch, FlashInfer,
  # CUTLASS's DSL), about half the install's time; Python compiles the few the tests import as
  # they first import them, and keeps them (bytecode writing is on below).
  # CPU build of torch (from the local wheel store where there is one), then FlashInfer: the
  # tests exercise FlashInfer's real cache loader and the tuner's child process on the CPU.
  python -m pip install -q --no-compile torch==2.13.0
  # Both distributions from the checkout: tunecache-client (client/) and tunecache-server (.).
  python -m pip install -q --no-compile -e ./client -e '.[test,tuner]'
  echo "$declared" > "$stamp"
fi

# Let Python cache bytecode (the checkout's and pytest's rewritten test modules): the suite
# starts a few hundred `tunecache` processes, and an image that sets PYTHONDONTWRITEBYTECODE
# would have each of them compile the checkout's modules again.
unset PYTHONDONTWRITEBYTECODE

# pytest's exit 5 ("no tests collected") is not a failure here: a part the arguments leave empty.
pytest_part() { python -m pytest "$@" || { status=$?; [ "$status" -eq 5 ] && return 5; return "$status"; }; }
workers="${TUNECACHE_TEST_WORKERS:-auto}"

if [ "${1:-}" = "--fast" ]; then
  # The unit tests only (tests/unit: in process, no servers, CLI subprocesses or browser), in
  # parallel, on SQLite only: their PostgreSQL half (the `postgres` marker) runs in the whole suite.
  # --dist loadgroup: the tests that import torch (tests/support/torch_tests.py) share one worker.
  shift
  status=0; pytest_part -n "$workers" --dist loadgroup -m "not postgres" tests/unit "$@" || status=$?
  [ "$status" -eq 5 ] && status=0
  exit "$status"
fi

# The whole suite: everything that may share the machine in parallel (each test has its own
# data dir, free ports and PostgreSQL schema), then the tests conftest.py lists in SERIAL
# (wall-clock windows, the boot storm, wheel builds) one at a time.
# --dist worksteal: a worker that runs out of tests takes some of another's, so one slow test
# near the end of a worker's share does not leave the other idle.
parallel=0; TUNECACHE_TEST_PART=parallel pytest_part -n "$workers" --dist worksteal "$@" || parallel=$?
serial=0; TUNECACHE_TEST_PART=serial pytest_part -p no:xdist "$@" || serial=$?
if [ "$parallel" -eq 5 ] && [ "$serial" -eq 5 ]; then exit 5; fi
[ "$parallel" -eq 5 ] && parallel=0
[ "$serial" -eq 5 ] && serial=0
[ "$parallel" -ne 0 ] && exit "$parallel"
exit "$serial"
