"""A gzip file's bytes inflated in a thread of their own, ahead of their reader.

A run's tarball is read in one pass (:func:`tunecache.formats.tarball.stream_bounded`): its
gzip inflated, its tar entries parsed and their files written, front to back. In tarfile's own
stream mode (``r|gz``) all of that is one thread's work, ten kilobytes at a time. Here the
inflating (``zlib``, which lets other threads run while it works) happens in a thread of its
own (:class:`tunecache.formats.read_ahead.ReadAhead`) while the reader parses and writes the
part before: on a machine of two cores or more the two overlap, as ``curl | tar`` overlaps its
download with its unpacking.

Bounded: at most :data:`~tunecache.formats.read_ahead.PART_BYTES` is read or inflated at a time (a small gzip that inflates
to a huge file is never whole in memory), at most :data:`~tunecache.formats.read_ahead.AHEAD_PARTS` parts ahead of the reader.
"""

from __future__ import annotations

import io
import zlib
from typing import IO

from tunecache.formats.read_ahead import AHEAD_PARTS, PART_BYTES, Put, ReadAhead

#: ``zlib`` reading a gzip member (its header and trailer checked: CRC-32 and size).
_GZIP_WBITS = 16 + zlib.MAX_WBITS


def _inflate(source: IO[bytes], put: Put) -> None:
    """Inflate the gzip ``source`` (one member; what follows it is read to the end and
    ignored, as tarfile's stream mode ignores it), each part to ``put``.

    Raises:
        zlib.error: not gzip, or its trailer does not check; EOFError: it ends before its end."""
    inflater = zlib.decompressobj(_GZIP_WBITS)
    pending = b""
    while True:
        if not pending:
            pending = source.read(PART_BYTES)
            if not pending:
                break
        if inflater.eof:
            pending = b""
            continue
        out = inflater.decompress(pending, PART_BYTES)
        pending = inflater.unconsumed_tail
        if out:
            put(out)
    if not inflater.eof:
        raise EOFError("compressed file ended before the end-of-stream marker was reached")


def inflating(source: IO[bytes]) -> IO[bytes]:
    """A buffered reader of ``source``'s inflated bytes, inflated ahead of it in a thread of
    its own; the source is read to its end before the reader sees the end of the bytes. Close
    the reader (it does not close ``source``)."""
    return io.BufferedReader(ReadAhead(lambda put: _inflate(source, put), AHEAD_PARTS, "tunecache-inflate"),
                             PART_BYTES)
