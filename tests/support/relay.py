"""A TCP relay's one direction, for tests and benches that stand between a client and a server
(recording what a client sends, pacing what a server answers)."""

from __future__ import annotations

import socket
from collections.abc import Callable


def pump(source: socket.socket, sink: socket.socket, chunk: int, each: Callable[[bytes], object] | None = None) -> None:
    """Copy ``source`` to ``sink`` until either end closes, ``each`` told of every part before it
    is sent (it may record or wait); then both sockets are shut down, so the other direction ends too."""
    try:
        while data := source.recv(chunk):
            if each is not None:
                each(data)
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for end in (source, sink):
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
