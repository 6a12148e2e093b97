"""`tunecache` commands started from a fork server that imported the command's modules once.

Most of a `tunecache serve` start (about 1 s of 1.5 s on two cores) and a third of a short
`tunecache pull` are Python importing FastAPI, SQLAlchemy, Alembic, httpx and pydantic, and the
end-to-end tests start several hundred of them. Here each command is still a process of its own,
running the console script's own ``main`` (``tunecache.cli:main``, as the ``tunecache`` script
does) with its own argv, environment, working directory and output files, and exiting as the
interpreter does (non-daemon threads joined, ``atexit`` handlers run, buffers flushed); only the
imports come from a fork server (:mod:`multiprocessing`'s ``forkserver``: one per test process,
started on first use, which imports :data:`PRELOAD` and forks a child per command).

What this cannot carry, the command runs as a new interpreter instead (:func:`popen`, :func:`run`):
an environment whose ``PYTHON*`` variables differ from the fork server's (a ``PYTHONPATH`` that
puts other modules first is read only when an interpreter starts), and a ``preexec_fn`` (run
between fork and exec). Tests that start
`tunecache` through :func:`tunecache_executable` keep starting the installed
console script itself.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable
from pathlib import Path

#: What the fork server imports before it forks (:mod:`tests.support.forked_preload`).
PRELOAD = ["tests.support.forked_preload"]


def tunecache_executable() -> str:
    exe = shutil.which("tunecache")
    assert exe, "the tunecache console script is not installed (pip install -e ./client -e .)"
    return exe


_context = multiprocessing.get_context("forkserver")
_context.set_forkserver_preload(PRELOAD)
_started: list[multiprocessing.process.BaseProcess] = []
#: The interpreter's variables the fork server started with (it starts with the first command).
_server_variables: dict[str, str] | None = None


def interpreter_variables(env: dict[str, str]) -> dict[str, str]:
    """The ``PYTHON*`` variables of ``env``: what a new interpreter reads as it starts."""
    return {name: value for name, value in env.items() if name.startswith("PYTHON")}


def _forkable(env: dict[str, str]) -> bool:
    """Whether a child of the fork server starts as a new interpreter given ``env`` would: the
    same ``PYTHON*`` variables as the fork server's (this process's, where it is not started yet)."""
    started_with = _server_variables if _server_variables is not None else interpreter_variables(dict(os.environ))
    return interpreter_variables(env) == started_with


def _command(argv: list[str], env: dict[str, str], cwd: str, stdout: str, stderr: str) -> None:
    """The child: ``tunecache <argv>`` in ``env`` and ``cwd``, output to the files named."""
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    standard_streams(stdout, stderr)
    sys.argv = [tunecache_executable(), *argv]

    def main() -> None:
        from tunecache.cli import main

        main()

    exit_as_interpreter(main)


def standard_streams(stdout: str, stderr: str) -> None:
    """fds 0-2 as a new interpreter has them, inheritable (uvicorn's processes are spawned with
    its stdin): stdin /dev/null (multiprocessing closed it), stdout and stderr the files named."""
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, stdout, os.O_WRONLY | os.O_CREAT | os.O_APPEND),
                            (2, stderr, os.O_WRONLY | os.O_CREAT | os.O_APPEND)):
        target = os.open(path, flags)
        os.dup2(target, fd)
        os.close(target)
    sys.stdin = open(0, closefd=False)


def exit_as_interpreter(main: Callable[[], object]) -> None:
    """Run ``main`` and end this process as the interpreter ends one whose program it was: an
    exit status from ``SystemExit`` (or 1 and the traceback printed), non-daemon threads joined,
    ``atexit`` handlers run, the standard streams flushed; never returns."""
    code = 0
    try:
        main()
    except SystemExit as exc:  # as the interpreter turns SystemExit into an exit status
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - the interpreter prints it and exits 1
        traceback.print_exc()
        code = 1
    for thread in threading.enumerate():  # the interpreter's exit: non-daemon threads first
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a stream the command closed
            pass
    os._exit(code & 0xFF)


class Forked:
    """A forked `tunecache` command with the part of :class:`subprocess.Popen` the tests use."""

    def __init__(self, args: list[str], process: multiprocessing.process.BaseProcess):
        self.args = args
        self._process = process
        self.pid = process.pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        self.returncode = self._process.exitcode
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self.poll() is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, signal: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signal)

    def terminate(self) -> None:
        if self.poll() is None:
            self._process.terminate()

    def kill(self) -> None:
        if self.poll() is None:
            self._process.kill()


def popen(argv: list[str], env: dict[str, str], stdout: Path, stderr: Path | None = None) -> Forked | subprocess.Popen:
    """Start ``tunecache <argv>`` with its output written to ``stdout`` (and ``stderr``, by default
    the same file), each emptied first."""
    global _server_variables
    stderr = stderr or stdout
    for path in {stdout, stderr}:
        open(path, "w").close()
    if not _forkable(env):
        with open(stdout, "a") as out, open(stderr, "a") as err:
            return subprocess.Popen([tunecache_executable(), *argv], stdout=out, stderr=err, env=env)
    process = _context.Process(target=_command, args=(argv, env, os.getcwd(), str(stdout), str(stderr)),
                               name=f"tunecache {' '.join(argv[:1])}")
    if _server_variables is None:  # this start starts the fork server, with this environment
        _server_variables = interpreter_variables(dict(os.environ))
    process.start()
    _started.append(process)
    return Forked([tunecache_executable(), *argv], process)


def run(argv: list[str], env: dict[str, str] | None = None, timeout: float = 120,
        preexec_fn: Callable[[], object] | None = None) -> subprocess.CompletedProcess:
    """``subprocess.run(["tunecache", *argv], capture_output=True, text=True, timeout=timeout,
    env=env, preexec_fn=preexec_fn)``; ``env`` by default this process's."""
    env = dict(os.environ if env is None else env)
    if preexec_fn is not None or not _forkable(env):
        return subprocess.run([tunecache_executable(), *argv], capture_output=True, text=True, timeout=timeout, env=env,
                              preexec_fn=preexec_fn)

    def to_end(out: Path, err: Path) -> int:
        process = popen(argv, env, out, err)
        try:
            return process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise

    return captured([tunecache_executable(), *argv], to_end)


def captured(args: list[str], to_end: Callable[[Path, Path], int]) -> subprocess.CompletedProcess:
    """What ``subprocess.run(args, capture_output=True, text=True)`` gives, for a process whose
    output ``to_end(stdout, stderr)`` sends to two files of a directory of its own and which it
    waits for (its exit status)."""
    with tempfile.TemporaryDirectory(prefix="tunecache-command-") as where:
        out, err = Path(where) / "stdout", Path(where) / "stderr"
        code = to_end(out, err)
        return subprocess.CompletedProcess(args, code, _read(out), _read(err))


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


@atexit.register
def _stop_leftovers() -> None:
    """A command a failed test left running is killed as this test process exits (multiprocessing
    would wait for it)."""
    for process in _started:
        if process.is_alive():
            process.kill()
