"""The two distributions: both build as wheels, each holds only its half of ``tunecache``,
and a pod that installs only ``tunecache-client`` (a fresh virtual environment, nothing
else) gets none of the server's packages, loads the vLLM plugin and runs ``tunecache pull``
against a real server."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import venv
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from tests.support.cli import tunecache
from tests.support.paths import CUDNN_FILE
from tests.support.paths import ROOT

#: What a pod must never get from installing the client.
SERVER_PACKAGES = {"fastapi", "starlette", "uvicorn", "sqlalchemy", "alembic", "psycopg", "psycopg-binary"}
POD_COMMANDS = ("pull", "push", "doctor", "diff", "history", "fleet", "retune", "job", "token", "keys", "promote", "pin", "unpin", "retire",
                "status", "env", "show", "workers", "audit", "completion", "export", "import")
SERVER_COMMANDS = ("serve", "tune", "db", "prune")


def _commands(help_text: str) -> set[str]:
    """The command names listed in the Commands panel of ``tunecache --help`` (rows ``│ name  ...``)."""
    panel = help_text.split("Commands", 1)[1]
    return set(re.findall(r"^│ ([a-z][a-z-]*)\s", panel, flags=re.MULTILINE))


def _run(*args: str | Path, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=600, **kwargs)
    assert result.returncode == 0, f"{args} failed:\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, Path]:
    """Both wheels, built from the checkout (hatchling, no build isolation)."""
    out = tmp_path_factory.mktemp("wheels")
    for project in (ROOT / "client", ROOT):
        _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", out, project)
    built = {path.name.split("-")[0]: path for path in out.glob("*.whl")}
    assert set(built) == {"tunecache_client", "tunecache_server"}, built
    return built


def _wheel(path: Path) -> tuple[set[str], dict, str]:
    """(file names, METADATA headers with Requires-Dist as a list, entry_points.txt)."""
    with zipfile.ZipFile(path) as wheel:
        names = set(wheel.namelist())
        info = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(wheel.read(info).decode())
        entry_points = wheel.read(info.replace("METADATA", "entry_points.txt")).decode()
    return names, {"Name": metadata["Name"], "Requires-Dist": metadata.get_all("Requires-Dist") or []}, entry_points


def _requirement_names(requires: list[str]) -> set[str]:
    return {r.split(";")[0].split("[")[0].split("=")[0].split(">")[0].split("<")[0].strip().lower() for r in requires
            if "extra ==" not in r}


def test_client_wheel_holds_the_pod_side_only(wheels):
    names, metadata, entry_points = _wheel(wheels["tunecache_client"])
    assert metadata["Name"] == "tunecache-client"
    assert {"tunecache/contract/__init__.py", "tunecache/contract/identity.py", "tunecache/store/__init__.py", "tunecache/store/base.py", "tunecache/cli/__init__.py", "tunecache/cli/__main__.py", "tunecache/cli_kit.py", "tunecache/client/boot/hooks.py"} <= names
    assert {"tunecache/store/http/__init__.py", "tunecache/store/http/transport.py", "tunecache/store/http/runs.py"} <= names
    # the formats both sides read ship with the pod side; the server uses them from here
    assert {"tunecache/formats/__init__.py", "tunecache/formats/autotune_file.py", "tunecache/formats/jit_module.py"} <= names
    assert not [n for n in names if n.startswith("tunecache/service")]
    assert "tunecache/__init__.py" not in names  # a namespace package shared with the server
    assert not _requirement_names(metadata["Requires-Dist"]) & SERVER_PACKAGES
    assert "tunecache = tunecache.cli:main" in entry_points
    assert "[vllm.general_plugins]" in entry_points
    assert "tunecache.server_store" not in entry_points  # the server opens the HTTP store of tunecache.store itself


def test_server_wheel_builds_on_the_client(wheels):
    names, metadata, entry_points = _wheel(wheels["tunecache_server"])
    assert metadata["Name"] == "tunecache-server"
    assert "tunecache-client==0.2.0" in metadata["Requires-Dist"]
    assert {"tunecache/service/app.py", "tunecache/service/cli/__init__.py", "tunecache/service/migrations/env.py"} <= names
    assert not [n for n in names if n.startswith(("tunecache/client", "tunecache/contract", "tunecache/cli",
                                                  "tunecache/formats"))]
    assert "tunecache/__init__.py" not in names
    assert "[tunecache.cli]" in entry_points and "tunecache.service.cli:register" in entry_points
    assert "console_scripts" not in entry_points  # the command is the client's


def test_both_installed_show_every_command():
    assert _commands(tunecache("--help", check=True).stdout) == set(POD_COMMANDS + SERVER_COMMANDS)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_client_only_install_pulls_with_none_of_the_servers_packages(wheels, server, tmp_path):
    pod = tmp_path / "pod-venv"
    venv.create(pod, with_pip=True)
    python, command = pod / "bin" / "python", pod / "bin" / "tunecache"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    _run(python, "-m", "pip", "install", "-q", "--disable-pip-version-check", wheels["tunecache_client"], env=env)

    installed = {p["name"].lower() for p in json.loads(_run(python, "-m", "pip", "list", "--format=json", env=env).stdout)}
    assert "tunecache-client" in installed and "tunecache-server" not in installed
    assert not installed & SERVER_PACKAGES, installed & SERVER_PACKAGES

    loaded = _run(python, "-c", "import sys, tunecache.client.boot.hooks, tunecache.cli; "
                  "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))", env=env).stdout.split()
    assert not set(loaded) & SERVER_PACKAGES

    assert _commands(_run(command, "--help", env=env).stdout) == set(POD_COMMANDS)

    key = ["--server", server, "--model", "meta-llama/Llama-3.1-8B", "--max-num-batched-tokens", "8192"]
    _run(command, "push", CUDNN_FILE, *key, env=env)
    dest = tmp_path / "installed"
    pulled = _run(command, "pull", *key, "--environment", CUDNN_FILE, "--dest", dest, env=env)
    path = Path(pulled.stdout.strip().splitlines()[-1])
    assert path.parent == dest and path.read_bytes() == CUDNN_FILE.read_bytes()


def test_the_client_module_runs_the_whole_command_and_the_server_module_its_own():
    """``python -m tunecache.cli`` (GPU machines that run from the source roots, with the
    distributions' metadata) is the whole command: the server's commands through their entry
    point, every command once. ``python -m tunecache.service`` runs the server's commands
    alone, through the command kit, without loading the pod code."""
    shown = _run(sys.executable, "-m", "tunecache.cli", "--help").stdout
    assert _commands(shown) == set(POD_COMMANDS + SERVER_COMMANDS)
    assert shown.count("│ serve ") == 1
    assert _commands(_run(sys.executable, "-m", "tunecache.service", "--help").stdout) == set(SERVER_COMMANDS)
    loaded = _run(sys.executable, "-c", "import sys, runpy; sys.argv = ['tunecache', '--help']\n"
                  "try: runpy.run_module('tunecache.service', run_name='__main__')\n"
                  "except SystemExit: print(' '.join(m for m in sys.modules if m.startswith('tunecache.')))").stdout
    loaded = set(loaded.split())
    assert "tunecache.service.cli" in loaded and "tunecache.cli_kit" in loaded
    assert not {m for m in loaded if m == "tunecache.cli" or m.startswith("tunecache.client")}, loaded
