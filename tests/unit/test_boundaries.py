"""Import boundaries (import-linter, contracts in pyproject.toml): the client never imports
the service or the server's packages, the contract is pure data, the service never imports
the pod code (``tunecache.client``) or the pod commands (``tunecache.cli``), the command kit
(``tunecache.cli_kit``) imports neither, nor does the store both distributions import
(``tunecache.store``), ``tunecache.formats`` and ``tunecache.engines`` are pure, and inside the service
the dashboard calls no route handler, publishing and storage call nothing above them, and
the settings import nothing they would build; no import is left out of a contract (no
``ignore_imports``)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from tests.support.paths import ROOT



def _lint_imports(config: Path) -> subprocess.CompletedProcess:
    executable = shutil.which("lint-imports")
    assert executable, "import-linter is not installed (pip install -e '.[test]')"
    return subprocess.run([executable, "--config", str(config)], capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_import_contracts_are_kept():
    result = _lint_imports(ROOT / "pyproject.toml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "12 kept, 0 broken" in result.stdout
    assert "ignore_imports" not in (ROOT / "pyproject.toml").read_text()
    for contract in ("the service never imports the pod code", "the command kit imports no pod code",
                     "the store holds no pod code",
                     "formats and engines are pure", "the dashboard calls the service's", "publishing and storage know no HTTP",
                     "storage decides nothing", "settings only hold values"):
        assert any(contract in line and "KEPT" in line for line in result.stdout.splitlines()), result.stdout


def test_the_check_sees_imports_across_both_source_roots(tmp_path):
    """A contract that forbids an arrow the code has (service -> contract) is broken: the
    graph spans both distributions, so a reversed arrow would be seen the same way."""
    config = tmp_path / "reversed.toml"
    config.write_text(
        '[tool.importlinter]\nroot_packages = ["tunecache"]\n\n'
        '[[tool.importlinter.contracts]]\nname = "service must not use the contract"\ntype = "forbidden"\n'
        'source_modules = ["tunecache.service"]\nforbidden_modules = ["tunecache.contract"]\n'
    )
    result = _lint_imports(config)
    assert result.returncode == 1, result.stdout
    assert "BROKEN" in result.stdout and "tunecache.service" in result.stdout


def test_the_server_reaches_the_http_store_without_the_pod_code():
    """``tune --server`` of tunecache-server opens the HTTP store through the command kit
    (``tunecache.cli_kit.server_store``): a :class:`tunecache.store.http.TunecacheClient`, with
    no module of the pod code (``tunecache.client``, ``tunecache.cli``) loaded on the way and
    no entry point into the pod commands (the ``tunecache.server_store`` group is gone)."""
    import subprocess
    import sys

    probe = ("import sys\n"
             "from tunecache import cli_kit\n"
             "store = cli_kit.server_store('http://127.0.0.1:9')\n"
             "store.close()\n"
             "print(type(store).__module__, type(store).__name__)\n"
             "print(' '.join(m for m in sys.modules if m.startswith(('tunecache.client', 'tunecache.cli.')) "
             "or m == 'tunecache.cli'))\n")
    shown = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert shown.returncode == 0, shown.stderr
    kind, pod_modules = (shown.stdout.splitlines() + [""])[:2]
    assert kind == "tunecache.store.http TunecacheClient"
    assert pod_modules == "", pod_modules

