"""tests/support/preloaded.py: a stand-in's script forked from the preloaded server sees what it
would see as a new interpreter (argv, sys.path, working directory, environment, exit status,
output), and what the server cannot carry runs as a new interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.support import preloaded

SCRIPT = '''
import json, os, sys
print(json.dumps({"argv": sys.argv, "path": sys.path,
                  "cwd": os.getcwd(), "marker": os.environ.get("STAND_IN_MARKER"), "main": __name__,
                  "torch_loaded": "torch" in sys.modules}))
print("to stderr", file=sys.stderr)
sys.exit(int(sys.argv[1]))
'''


def test_a_forked_script_sees_what_a_new_interpreter_would(tmp_path, monkeypatch):
    script = tmp_path / "scripts" / "probe.py"
    script.parent.mkdir()
    script.write_text(SCRIPT)
    extra = tmp_path / "extra"
    extra.mkdir()
    env = {**os.environ, "PYTHONPATH": f"{extra}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "STAND_IN_MARKER": "m"}
    monkeypatch.chdir(tmp_path)
    assert preloaded._server() is not None and preloaded._server().carries(env)
    forked = preloaded.run([str(script), "3"], env)
    new = subprocess.run([sys.executable, str(script), "3"], capture_output=True, text=True, env=env)
    assert forked.returncode == new.returncode == 3
    assert forked.stderr == new.stderr == "to stderr\n"
    seen_forked, seen_new = json.loads(forked.stdout), json.loads(new.stdout)
    assert seen_forked.pop("torch_loaded") is True and seen_new.pop("torch_loaded") is False
    assert seen_forked == seen_new
    assert seen_new["path"][0] == str(script.parent) and str(extra) in seen_new["path"] and seen_new["main"] == "__main__"


def test_what_the_preload_read_or_a_shadowing_path_runs_as_a_new_interpreter(tmp_path):
    server = preloaded._server()
    assert server is not None and server.carries(dict(os.environ))
    assert "HOME" in server.read  # read while torch imported
    assert not server.carries({**os.environ, "HOME": str(tmp_path)})
    assert not server.carries({**os.environ, "TQDM_DISABLE": "1"})  # tqdm walks the TQDM_ variables
    (tmp_path / "torch").mkdir()
    assert not server.carries({**os.environ, "PYTHONPATH": str(tmp_path)})  # a stand-in torch comes first
    other = "2" if os.environ.get("PYTHONOPTIMIZE") != "2" else "1"
    assert not server.carries({**os.environ, "PYTHONOPTIMIZE": other})  # read as the interpreter starts


def test_a_script_past_its_timeout_is_killed(tmp_path):
    script = tmp_path / "sleeps.py"
    script.write_text(f"import os, time\nopen({str(tmp_path / 'pid')!r}, 'w').write(str(os.getpid()))\ntime.sleep(60)\n")
    try:
        preloaded.run([str(script)], dict(os.environ), timeout=2)
    except subprocess.TimeoutExpired:
        pass
    else:
        raise AssertionError("the script was not given up on")
    pid = int((tmp_path / "pid").read_text())
    try:  # killed and reaped before run() raised
        os.kill(pid, 0)
    except ProcessLookupError:
        pass
    else:
        raise AssertionError(f"the script's process {pid} is still there")
