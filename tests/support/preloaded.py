"""Python scripts of the stand-in vLLM (an engine's main process, a tuning node's compile) run as
processes forked from one that imported torch once, as a real vLLM process has imported torch
before its plugins load.

A stand-in engine's boot took about 3.2 s of CPU, two thirds of it importing torch and the
CUTLASS DSL under FlashInfer, and the end-to-end tests boot several dozen. Here a server process
per test process (started on first use) imports :data:`PRELOAD` once, noting which environment
variables those imports read, and forks a child per script: the child takes the script's
environment, working directory and ``sys.path`` as a new interpreter given them would
(the script's directory first, PYTHONPATH's entries after what site-packages' ``.pth`` files put
first), runs the script as ``__main__`` and exits
as the interpreter does (:func:`tests.support.forked.exit_as_interpreter`). FlashInfer itself is
not preloaded: it reads its workspace from the environment as it is imported.

What this cannot carry, :func:`run` runs as a new interpreter instead: an environment that gives
a variable the preload read another value (the server notes what Python code read, by name or by
a walk it knows; ``HOME``, ``TMPDIR`` and ``USER`` among them, so a boot under another HOME is a
new interpreter), other ``PYTHON*`` variables than the server's, or a ``PYTHONPATH`` directory
holding a module of a package the server imported (a stand-in ``torch``, say). What torch's C++
reads from the environment is not noted; the stand-in boots set none of it.
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.support.forked import captured, exit_as_interpreter, interpreter_variables, standard_streams
from tests.support.paths import ROOT

#: What the server imports before it forks (FlashInfer's CUTLASS DSL: ``cutlass``).
PRELOAD = ("torch", "cutlass")


def run(argv: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    """``subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=timeout,
    env=env)``, the script ``argv[0]`` forked from the preloaded server where that is the same."""
    server = _server()
    if server is None or not server.carries(env):
        return subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=timeout, env=env)
    return captured([sys.executable, *argv], lambda out, err: server.run(
        {"argv": argv, "env": env, "cwd": os.getcwd(), "stdout": str(out), "stderr": str(err)}, timeout))


class _Client:
    """The test process's end of a running server."""

    def __init__(self, process: subprocess.Popen, path: str, ready: dict):
        self.process, self.path = process, path
        self.read: dict[str, str | None] = ready["read"]
        self.prefixes: tuple[str, ...] = tuple(ready["prefixes"])
        self.environ: dict[str, str] = ready["environ"]
        self.modules: set[str] = set(ready["modules"])
        self.interpreter = _but_pythonpath(interpreter_variables(self.environ))
        self.pids: set[int] = set()

    def carries(self, env: dict[str, str]) -> bool:
        if any(env.get(name) != value for name, value in self.read.items()):
            return False
        walked = {name for name in {*env, *self.environ} if name.startswith(self.prefixes)}
        if any(env.get(name) != self.environ.get(name) for name in walked):
            return False
        if _but_pythonpath(interpreter_variables(env)) != self.interpreter:  # PYTHONPATH: laid out by the child
            return False
        for entry in _pythonpath(env):
            if any((Path(entry) / name).exists() or (Path(entry) / f"{name}.py").exists() for name in self.modules):
                return False
        return True

    def run(self, request: dict, timeout: float) -> int:
        with socket.socket(socket.AF_UNIX) as connection:
            connection.connect(self.path)
            connection.sendall(json.dumps(request).encode() + b"\n")
            answers = _Lines(connection)
            pid = answers.next(None)["pid"]
            self.pids.add(pid)
            try:
                return answers.next(timeout)["code"]
            except TimeoutError:
                os.kill(pid, signal.SIGKILL)
                answers.next(None)
                raise subprocess.TimeoutExpired([sys.executable, *request["argv"]], timeout) from None
            finally:
                self.pids.discard(pid)


class _Lines:
    """The server's answers on a connection: one JSON object a line."""

    def __init__(self, connection: socket.socket):
        self.connection, self.buffer = connection, b""

    def next(self, timeout: float | None) -> dict:
        self.connection.settimeout(timeout)
        while b"\n" not in self.buffer:
            part = self.connection.recv(4096)
            if not part:
                raise RuntimeError("the preloaded server closed the connection without an answer")
            self.buffer += part
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)


_started: list[_Client | None] = []


def _server() -> _Client | None:
    """This test process's server, started on first use (``None``: it could not start)."""
    if not _started:
        path = os.path.join(tempfile.mkdtemp(prefix="tunecache-preloaded-"), "socket")
        process = subprocess.Popen([sys.executable, "-c", "import sys; from tests.support.preloaded import serve; "
                                    "serve(sys.argv[1])", path], cwd=ROOT, stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE)
        line = process.stdout.readline()
        _started.append(_Client(process, path, json.loads(line)) if line else None)
    return _started[0]


@atexit.register
def _stop() -> None:
    for client in filter(None, _started):
        for pid in list(client.pids):  # a script a failed test left running
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        client.process.stdin.close()  # the server ends when its stdin does
        client.process.wait(10)
        shutil.rmtree(os.path.dirname(client.path), ignore_errors=True)


def serve(path: str) -> None:
    """The server: import :data:`PRELOAD`, say what that read, fork a child per request."""
    names, prefixes = _import_noting_reads(PRELOAD)
    # sys.path as this interpreter lays it out for a script: "" its directory, the mark PYTHONPATH's
    # entries (after what site-packages' .pth files put first)
    layout = json.loads(subprocess.run([sys.executable, "-c", "import json, sys; print(json.dumps(sys.path))"],
                                       env={**os.environ, "PYTHONPATH": _MARK}, capture_output=True, text=True,
                                       check=True).stdout)
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(64)
    print(json.dumps({"read": {name: os.environ.get(name) for name in names}, "prefixes": sorted(prefixes),
                      "environ": dict(os.environ),
                      "modules": sorted({name.split(".")[0] for name in sys.modules})}), flush=True)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(sys.stdin, selectors.EVENT_READ, "stdin")
    selector.register(wake_read, selectors.EVENT_READ, "child")
    waiting: dict[int, socket.socket] = {}
    while True:
        for key, _ in selector.select():
            if key.data == "stdin":  # the test process went away
                for pid in waiting:
                    os.kill(pid, signal.SIGKILL)
                os._exit(0)
            if key.data == "accept":
                connection, _ = listener.accept()
                request = json.loads(connection.makefile("rb").readline())
                pid = os.fork()
                if pid == 0:
                    selector.close()
                    listener.close()
                    connection.close()
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    os.close(wake_read)
                    os.close(wake_write)
                    _child(layout, **request)
                connection.sendall(json.dumps({"pid": pid}).encode() + b"\n")
                waiting[pid] = connection
            if key.data == "child":
                os.read(wake_read, 4096)
        while waiting:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            connection = waiting.pop(pid)
            connection.sendall(json.dumps({"code": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
            connection.close()


#: Code that the preload runs over the whole environment and what it keeps of it: tqdm's
#: ``envwrap`` reads the ``TQDM_`` variables only. Any other walk counts as reading every variable.
_WALKS = {os.path.join("tqdm", "utils.py"): "TQDM_"}


def _import_noting_reads(modules: tuple[str, ...]) -> tuple[set[str], set[str]]:
    """Import ``modules``; the environment variables Python code read meanwhile, by name and by
    prefix (``""``: all of them)."""
    environ = type(os.environ)
    saved = environ.__getitem__, environ.get, environ.__contains__
    names: set[str] = set()
    prefixes: set[str] = set()
    inside: list[bool] = []  # within get() or `in`, which look the name up themselves

    def getitem(self, key):
        if not inside:
            if sys._getframe(1).f_code.co_filename in ("<frozen _collections_abc>", "<frozen os>"):
                walker = sys._getframe(2).f_code.co_filename  # a walk: items(), values(), copy()
                prefixes.add(next((p for path, p in _WALKS.items() if walker.endswith(path)), ""))
            else:
                names.add(key)
        return saved[0](self, key)

    def looked_up(method):
        def lookup(self, key, *default):
            names.add(key)
            inside.append(True)
            try:
                return method(self, key, *default)
            finally:
                inside.pop()
        return lookup

    environ.__getitem__, environ.get, environ.__contains__ = getitem, looked_up(saved[1]), looked_up(saved[2])
    try:
        for module in modules:
            __import__(module)
    finally:
        environ.__getitem__, environ.get, environ.__contains__ = saved
    return names, prefixes


def _but_pythonpath(variables: dict[str, str]) -> dict[str, str]:
    return {name: value for name, value in variables.items() if name != "PYTHONPATH"}


def _pythonpath(env: dict[str, str]) -> list[str]:
    """PYTHONPATH's entries as the interpreter reads them (none when empty; each made absolute, ""
    the working directory)."""
    return [os.path.abspath(entry) for entry in env["PYTHONPATH"].split(os.pathsep)] if env.get("PYTHONPATH") else []


#: Where PYTHONPATH's entries go in :func:`serve`'s ``layout``.
_MARK = "/preloaded-server-pythonpath-mark"


def _child(layout: list[str], argv: list[str], env: dict[str, str], cwd: str, stdout: str, stderr: str) -> None:
    """The child: the script ``argv[0]`` as ``__main__`` in ``env`` and ``cwd``, as a new interpreter."""
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    standard_streams(stdout, stderr)
    script = os.path.abspath(argv[0])
    own = _pythonpath(env)
    sys.path[:] = [new for entry in layout
                   for new in ([os.path.dirname(script)] if entry == "" else own if entry == _MARK else [entry])]
    sys.argv = list(argv)
    exit_as_interpreter(lambda: runpy.run_path(script, run_name="__main__"))
