"""A virtual environment per vLLM release that can build that release's real ``VllmConfig`` on
the CPU, for the contract tests (tests/contract/test_vllm_config_names.py).

Each holds torch's CPU build (``torch==2.13.0``: every release's config code imports torch, none
runs a kernel here), ``vllm==<version>`` installed without its dependencies (its CUDA wheels and
its own torch pin are not needed to build a config), and the pure-Python packages its
``import vllm.config`` and ``EngineArgs.create_engine_config()`` need, pinned in
``tests/contract/vllm_envs/<version>.txt``. Built once under ``TUNECACHE_VLLM_ENVS`` (default
``~/.cache/tunecache-tests/vllm-envs``), named by the version and the hash of what it holds, under a
file lock (parallel test workers build it once); a release whose environment cannot be built
(no package index) skips, naming why.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REQUIREMENTS = Path(__file__).resolve().parents[1] / "contract" / "vllm_envs"


def _root() -> Path:
    root = Path(os.environ.get("TUNECACHE_VLLM_ENVS") or Path.home() / ".cache" / "tunecache-tests" / "vllm-envs")
    root.mkdir(parents=True, exist_ok=True)
    return root


def release_python(version: str) -> Path:
    """The interpreter of ``version``'s environment, built when it is not there yet."""
    requirements = REQUIREMENTS / f"{version}.txt"
    if not requirements.is_file():
        pytest.skip(f"no pinned dependencies for vLLM {version} ({requirements.name}): only 0.25.0 and 0.34.0 have them")
    digest = hashlib.sha256(requirements.read_bytes() + version.encode()).hexdigest()[:12]
    env = _root() / f"vllm-{version}-{digest}"
    python = env / "bin" / "python"
    with (_root() / f"vllm-{version}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (env / ".complete").is_file():
            return python
        shutil.rmtree(env, ignore_errors=True)
        constraints = env.with_name(env.name + ".constraints")
        constraints.write_text(f"torch==2.13.0\nvllm=={version}\n")
        steps = [[sys.executable, "-m", "venv", str(env)],
                 [str(python), "-m", "pip", "install", "-q", "--no-compile", "-c", str(constraints), "torch==2.13.0"],
                 [str(python), "-m", "pip", "install", "-q", "--no-compile", "--no-deps", f"vllm=={version}"],
                 [str(python), "-m", "pip", "install", "-q", "--no-compile", "-c", str(constraints), "--no-deps", "-r", str(requirements)]]
        for step in steps:
            done = subprocess.run(step, capture_output=True, text=True, timeout=1200)
            if done.returncode != 0:
                shutil.rmtree(env, ignore_errors=True)
                pytest.skip(f"cannot build vLLM {version}'s environment ({' '.join(step[2:5])}): "
                            f"{(done.stderr or done.stdout).strip()[-300:]}")
        (env / ".complete").write_text(digest)
    return python
