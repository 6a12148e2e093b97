"""vLLM's placement factors (tunecache.engines.vllm.placement), derived again from each release's
own ``vllm/envs.py`` (its wheel, as tests/contract/test_vllm_releases.py reads it):

* which variables of ``environment_variables`` have a default that derives from HOME, the user,
  the temporary directory, the working directory or a path (vLLM's package directory, Python's
  prefix): read from the getter's source and from the module functions it calls;
* which of them ``compile_factors()`` hashes (not in its ``ignored_factors``);
* and, as a check on the reading, the release's ``envs.py`` run (standard library only) under
  two placements (another HOME, user, temporary and working directory, package path): every
  variable whose value moves with them must be one the reading found.

A new variable of that kind, or one that a release starts or stops hashing, fails here until
``PLACEMENT_FACTORS`` says what it is.

    TUNECACHE_VLLM_RELEASES=all scripts/test.sh tests/contract
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.vllm_wheels import release_wheel, releases
from tunecache.engines import engine_for

release_of = engine_for("vllm").release_of
from tunecache.engines.vllm.placement import PLACEMENT_ENV_FACTORS, PLACEMENT_FACTORS

#: What a default that is a place derives from, as names in a getter's source: functions and
#: attributes (os.path.expanduser, tempfile.gettempdir, getpass.getuser, Path.home, __file__,
#: os.getcwd, sys.prefix, ...) and the variables they read.
PLACE_SOURCES = {
    "expanduser", "gettempdir", "gettempprefix", "mkdtemp", "getuser", "getpwuid", "getuid", "home", "__file__",
    "abspath", "realpath", "getcwd", "cwd", "prefix", "base_prefix", "exec_prefix", "executable", "user_cache_dir",
    "HOME", "USER", "LOGNAME", "TMPDIR", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME",
}


def _assigned(tree: ast.AST, name: str) -> ast.expr:
    [found] = [n.value for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AnnAssign))
               and name in {getattr(t, "id", None) for t in (n.targets if isinstance(n, ast.Assign) else [n.target])}]
    return found


def placement_derived(source: str) -> dict[str, str]:
    """Each variable of ``environment_variables`` whose getter (or a module function it calls,
    transitively) names one of :data:`PLACE_SOURCES` -> the chain to it."""
    tree = ast.parse(source)
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}

    def names(node: ast.AST):
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name):
                yield sub.id
            elif isinstance(sub, ast.Attribute):
                yield sub.attr
            elif isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                yield sub.value

    def source_of(node: ast.AST, seen: set[str]) -> str | None:
        for name in names(node):
            if name in PLACE_SOURCES:
                return name
            if name in functions and name not in seen:
                seen.add(name)
                found = source_of(functions[name], seen)
                if found:
                    return f"{name} -> {found}"
        return None

    table = _assigned(tree, "environment_variables")
    derived = {}
    for key, getter in zip(table.keys, table.values):
        found = source_of(getter, set())
        if found:
            derived[key.value] = found
    return derived


def hashed(source: str) -> set[str]:
    """The variables ``compile_factors()`` hashes: ``environment_variables`` but ``ignored_factors``."""
    tree = ast.parse(source)
    [function] = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "compile_factors"]
    ignored = ast.literal_eval(_assigned(function, "ignored_factors"))
    return {key.value for key in _assigned(tree, "environment_variables").keys} - set(ignored)


_PROBE = """
import json, sys, types
sys.modules["torch"] = None  # a getter that asks torch (VLLM_DBO_COMM_SMS) fails alike in both places, and fast
module = types.ModuleType("vllm.envs")
module.__file__ = sys.argv[2]
sys.modules["vllm.envs"] = module
exec(compile(open(sys.argv[1]).read(), sys.argv[2], "exec"), module.__dict__)
values = {}
for name, getter in module.environment_variables.items():
    try:
        values[name] = repr(getter())
    except Exception as exc:  # a getter that imports the rest of vLLM
        values[name] = "error " + type(exc).__name__
print(json.dumps(values))
"""


def _values_at(envs_py: Path, place: Path) -> dict[str, str]:
    """The release's ``environment_variables`` evaluated with everything placed under ``place``."""
    for sub in ("home", "tmp", "cwd", "site-packages/vllm"):
        (place / sub).mkdir(parents=True, exist_ok=True)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(place / "home"), "USER": place.name,
           "LOGNAME": place.name, "TMPDIR": str(place / "tmp")}
    result = subprocess.run([sys.executable, "-c", _PROBE, str(envs_py), str(place / "site-packages/vllm/envs.py")],
                            env=env, cwd=place / "cwd", capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout)


def moved_by_placement(envs_py: Path, tmp_path: Path) -> set[str]:
    """The variables whose values differ between two placements, but not between two runs at
    one placement (a random default, such as a shared-memory name, is no place)."""
    first, again, other = (_values_at(envs_py, tmp_path / name) for name in ("node", "node", "pod"))
    return {name for name in first if first[name] != other[name] and first[name] == again[name]}


@pytest.mark.parametrize("version", releases())
def test_every_placement_factor_of_the_release_is_listed_with_the_releases_that_hash_it(wheels, version, tmp_path):
    release = release_of(version)
    assert release is not None, f"vllm {version} is not in tunecache.engines.vllm.releases"
    source = release_wheel(wheels, version).read("vllm/envs.py").decode()

    derived = placement_derived(source)
    unlisted = sorted(set(derived) - set(PLACEMENT_FACTORS))
    assert not unlisted, (f"vllm {version}: defaults that are places, not in vllm_placement.PLACEMENT_FACTORS: "
                          f"{[(name, derived[name]) for name in unlisted]}")
    listed_here = {name for name, factor in PLACEMENT_FACTORS.items() if release.minor in factor.hashed_in}
    assert set(derived) & hashed(source) == listed_here, version
    assert listed_here <= set(PLACEMENT_ENV_FACTORS)

    envs_py = tmp_path / "envs.py"
    envs_py.write_text(source)
    moved = moved_by_placement(envs_py, tmp_path)
    assert moved, "the probe moved nothing: it ran no getter that reads HOME"
    assert moved <= set(derived), f"vllm {version}: values that move with HOME or the user, not read as such: " \
                                  f"{sorted(moved - set(derived))}"


def test_the_reading_finds_a_place_through_a_module_function_and_leaves_plain_defaults_alone():
    source = '''
import os, tempfile
def _package_binary():
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "tool")
environment_variables = {
    "A": lambda: os.path.expanduser(os.getenv("A", "~/.a")),
    "B": lambda: _package_binary(),
    "C": lambda: int(os.getenv("C", "3")),
    "D": lambda: os.getenv("D", tempfile.gettempdir()),
}
def compile_factors():
    ignored_factors = {"D"}
'''
    assert placement_derived(source) == {"A": "expanduser", "B": "_package_binary -> abspath", "D": "gettempdir"}
    assert hashed(source) == {"A", "B", "C"}
