"""The installed `tunecache` command, run as a pod or an operator runs it."""

from __future__ import annotations

import subprocess

from tests.support import forked
from tests.support.forked import tunecache_executable  # noqa: F401 - the tests' name for it
from tests.support.paths import CUDNN_FILE


def tunecache(*args: str, check: bool = False) -> subprocess.CompletedProcess:
    """``tunecache <args>`` in this test's environment, its output captured (:func:`forked.run`)."""
    result = forked.run(list(args), timeout=120)
    if check:
        assert result.returncode == 0, result.stderr
    return result


MODEL = "meta-llama/Llama-3.1-8B"


def push(server, path=CUDNN_FILE, *extra):
    return tunecache("push", str(path), "--server", server, "--model", MODEL, "--max-num-batched-tokens", "8192", *extra)


def pull(server, dest, environment=CUDNN_FILE, *extra):
    return tunecache(
        "pull", "--server", server, "--model", MODEL, "--max-num-batched-tokens", "8192",
        "--dest", str(dest), "--environment", str(environment), *extra,
    )
