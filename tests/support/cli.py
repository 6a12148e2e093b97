"""The installed `tunecache` command, run as a pod or an operator runs it."""

from __future__ import annotations

import shutil
import subprocess

from tests.support.paths import CUDNN_FILE


def tunecache_executable() -> str:
    exe = shutil.which("tunecache")
    assert exe, "the tunecache console script is not installed (pip install -e ./client -e .)"
    return exe


def tunecache(*args: str, check: bool = False) -> subprocess.CompletedProcess:
    result = subprocess.run([tunecache_executable(), *args], capture_output=True, text=True, timeout=120)
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
