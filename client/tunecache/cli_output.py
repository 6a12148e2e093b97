"""The command's stdout as a reader may leave it: a pipe closed early (``tunecache doctor | head
-1``) is not an error of the command, and a stdout that cannot be written (a full disk) is one
(:class:`OutputUnwritable`), which :func:`tunecache.cli_kit.run` turns into one line and an exit
code."""

from __future__ import annotations

import os


class OutputUnwritable(Exception):
    """stdout cannot be written (``tunecache history > /dev/full``: a full disk, an I/O error):
    :func:`tunecache.cli_kit.run` ends the command with one line and exit 12 (``ExitCode.INSTALL_FAILED``, a
    local write that failed). Not an ``OSError``, so that a command's own handling of its files'
    errors never takes it for one of them."""

    def __init__(self, error: OSError) -> None:
        super().__init__(f"cannot write to stdout: {error.strerror or error}")


class ReaderMayLeave:
    """``sys.stdout`` (and its ``buffer``) for a command whose reader may close the pipe early
    (``tunecache doctor | head -1``): what is written after that goes to ``/dev/null``, so the
    command still ends with its own exit code and says its errors on stderr (click ended such a
    command with exit 1 and nothing said). Any other failed write (a full disk) raises
    :class:`OutputUnwritable` (every time: click probes a stream with writes whose errors it
    drops); :func:`tunecache.cli_kit.run` then sends stdout to ``/dev/null`` (:meth:`discard`), so that the
    interpreter's last flush cannot fail again."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text):
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._reader_left()
            return len(text)
        except OSError as exc:
            raise OutputUnwritable(exc) from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._reader_left()
        except OSError as exc:
            raise OutputUnwritable(exc) from None

    def discard(self) -> None:
        """Send what is still buffered, and every later write, to ``/dev/null``."""
        self._reader_left()

    @property
    def buffer(self) -> "ReaderMayLeave":
        """The binary stream under it (``history --csv`` writes bytes), under the same rules."""
        return ReaderMayLeave(self._stream.buffer)

    def _reader_left(self) -> None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self._stream.fileno())
        finally:
            os.close(devnull)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)
