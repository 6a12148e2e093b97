"""Opening a run's gzip'd tarballs within bounds.

A pod unpacks what a server sent, and a 2 MB gzip can declare a 2 GiB file or a hundred
thousand small ones. :func:`open_bounded` reads the tarball's headers one by one and
stops at the first that would take the tarball past :func:`max_unpack_files` entries or
:func:`max_unpack_bytes` bytes, before the data of that entry is decompressed and before
anything is written. Both are settings of the pod (``TUNECACHE_MAX_UNPACK_FILES``,
``TUNECACHE_MAX_UNPACK_BYTES``); the defaults are far above what a warm state holds (an 8B
model's compile cache is about 23 MB in about 150 files; a FlashInfer JIT module under
10 MB; Triton's cache about 8 MB).
"""

from __future__ import annotations

import gzip
import io
import os
import tarfile
import zlib
from collections.abc import Iterator
from typing import IO, Any, Union

#: What a run's tarball is read from: its bytes, a file's path, or an object whose ``open()``
#: gives a binary file of them (a downloaded artifact, :class:`tunecache.client.artifact_file.ArtifactFile`).
TarSource = Union[bytes, "os.PathLike[str]", Any]


def open_source(source: TarSource, once: bool = False) -> IO[bytes]:
    """A binary file of ``source``'s bytes (:data:`TarSource`), read from its start. ``once``:
    for one reader that reads it front to back, once; a source that can give its bytes as they
    arrive (``stream()``: a download streamed into its one pass,
    :class:`tunecache.client.artifact_stream.ArtifactStream`) gives them so (its end, where the
    reader sees it, comes after the bytes' sha256 checked)."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return io.BytesIO(source)
    if isinstance(source, (str, os.PathLike)):
        return open(source, "rb")
    if once and hasattr(source, "stream"):
        return source.stream()
    return source.open()


class _OwningTarFile(tarfile.TarFile):
    """A ``TarFile`` that closes the file it was opened over (:func:`open_source`'s) with itself."""

    _source: IO[bytes] | None = None

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self._source is not None:
                self._source.close()

#: The tar's own read size in :func:`stream_bounded` (its headers are 512 bytes), and the most
#: of a file's bytes copied at a time.
_TAR_BUFFER_BYTES = 64 * 1024
_COPY_BYTES = 64 * 1024
#: Default of ``TUNECACHE_MAX_UNPACK_BYTES``: the most one tarball may unpack to.
DEFAULT_MAX_UNPACK_BYTES = 1 << 30
#: Default of ``TUNECACHE_MAX_UNPACK_FILES``: the most entries one tarball may hold.
DEFAULT_MAX_UNPACK_FILES = 20_000
#: The largest extended header (pax, GNU long name) one entry may carry. tarfile reads such a
#: header whole into memory before it returns the entry (``TarInfo._proc_pax``), so the byte
#: bound above came too late: a 2.3 MB tarball declaring a huge pax header took 1.7 GiB.
#: What a run's tarballs carry is a path and the exact file time (:mod:`tunecache.formats.jit_module`).
MAX_EXTENDED_HEADER_BYTES = 1 << 20
_EXTENDED_TYPES = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE, tarfile.GNUTYPE_LONGNAME,
                   tarfile.GNUTYPE_LONGLINK)


class _ExtendedHeaderTooLarge(ValueError):
    pass


class _BoundedTarInfo(tarfile.TarInfo):
    """A ``TarInfo`` that refuses an extended header over :data:`MAX_EXTENDED_HEADER_BYTES`
    before tarfile reads it: ``fromtarfile`` as CPython's own (3.10 to 3.13), with the check
    between parsing the header block and processing the member."""

    @classmethod
    def fromtarfile(cls, tarfile_: tarfile.TarFile) -> tarfile.TarInfo:
        buf = tarfile_.fileobj.read(tarfile.BLOCKSIZE)
        obj = cls.frombuf(buf, tarfile_.encoding, tarfile_.errors)
        obj.offset = tarfile_.fileobj.tell() - tarfile.BLOCKSIZE
        if obj.type in _EXTENDED_TYPES and obj.size > MAX_EXTENDED_HEADER_BYTES:
            raise _ExtendedHeaderTooLarge(f"an extended header of {obj.size:,} bytes (at most "
                                          f"{MAX_EXTENDED_HEADER_BYTES:,})")
        return obj._proc_member(tarfile_)


def positive_whole_setting(name: str, default: int) -> int:
    """The environment variable ``name`` as a positive whole number, else ``default`` (unset,
    empty or anything else): how the pod's byte and file bounds are read."""
    value = os.environ.get(name, "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else default


def max_unpack_bytes() -> int:
    """``TUNECACHE_MAX_UNPACK_BYTES`` (a positive whole number), else the default (1 GiB)."""
    return positive_whole_setting("TUNECACHE_MAX_UNPACK_BYTES", DEFAULT_MAX_UNPACK_BYTES)


def max_unpack_files() -> int:
    """``TUNECACHE_MAX_UNPACK_FILES`` (a positive whole number), else the default (20,000)."""
    return positive_whole_setting("TUNECACHE_MAX_UNPACK_FILES", DEFAULT_MAX_UNPACK_FILES)


def open_bounded(data: TarSource, what: str, error: type[ValueError]) -> tarfile.TarFile:
    """``data`` (:data:`TarSource`: read from disk when it is a file, never whole in memory) opened as a gzip'd tar with every member's header read (``getmembers()``
    then reads nothing more), within the bounds above.

    Raises:
        error: not a gzip'd tar, or past a bound (the message names ``what`` and the bound's setting).
    """
    limit_bytes, limit_files = max_unpack_bytes(), max_unpack_files()
    tar = None
    total = count = 0
    source = open_source(data)
    try:
        tar = _OwningTarFile.open(fileobj=source, mode="r:gz", tarinfo=_BoundedTarInfo)
        tar._source = source
        while (member := tar.next()) is not None:
            count += 1
            total += max(member.size, 0)
            if count > limit_files:
                raise error(f"{what} artifact holds more than {limit_files:,} entries (TUNECACHE_MAX_UNPACK_FILES)")
            if total > limit_bytes:
                raise error(f"{what} artifact unpacks to more than {limit_bytes:,} bytes (TUNECACHE_MAX_UNPACK_BYTES)")
    except BaseException as exc:
        if tar is not None:
            tar.close()
        source.close()
        if isinstance(exc, _ExtendedHeaderTooLarge):
            raise error(f"{what} artifact holds {exc}") from None
        if isinstance(exc, (tarfile.TarError, OSError, EOFError)):
            raise error(f"{what} artifact is not a gzipped tarball: {exc}") from None
        raise
    return tar


def stream_bounded(data: TarSource, what: str, error: type[ValueError], once: bool = False,
                   ) -> Iterator[tuple[tarfile.TarFile, tarfile.TarInfo]]:
    """Each entry of ``data`` (a gzip'd tar) with the tarball it is read from, in one pass
    (the gzip inflated once, front to back, in a thread of its own a part ahead of the tar's
    parsing: :mod:`tunecache.formats.inflate`; never whole in memory), within the same bounds as
    :func:`open_bounded`, each checked at its header before its data is decompressed. The
    caller reads or extracts an entry before asking for the next. After the last entry the
    source is read to its end (a download streamed in, ``once``: to the end its sha256 is
    checked at, :func:`open_source`).

    Raises:
        error: not a gzip'd tar, or past a bound (the message names ``what`` and the bound's setting).
    """
    from tunecache.formats.inflate import inflating
    from tunecache.formats.read_ahead import PART_BYTES

    limit_bytes, limit_files = max_unpack_bytes(), max_unpack_files()
    total = count = 0
    with open_source(data, once) as source, inflating(source) as inflated:
        try:
            with tarfile.open(fileobj=inflated, mode="r|", bufsize=_TAR_BUFFER_BYTES, tarinfo=_BoundedTarInfo) as tar:
                tar.copybufsize = _COPY_BYTES
                while (member := tar.next()) is not None:
                    count += 1
                    total += max(member.size, 0)
                    if count > limit_files:
                        raise error(f"{what} artifact holds more than {limit_files:,} entries "
                                    "(TUNECACHE_MAX_UNPACK_FILES)")
                    if total > limit_bytes:
                        raise error(f"{what} artifact unpacks to more than {limit_bytes:,} bytes "
                                    "(TUNECACHE_MAX_UNPACK_BYTES)")
                    yield tar, member
            while inflated.read(PART_BYTES):  # what follows the tar's end: the gzip's trailer checked
                pass
        except _ExtendedHeaderTooLarge as exc:
            raise error(f"{what} artifact holds {exc}") from None
        except (tarfile.TarError, EOFError, zlib.error) as exc:
            raise error(f"{what} artifact is not a gzipped tarball: {exc}") from None
        except OSError as exc:
            if isinstance(exc, (gzip.BadGzipFile,)) or exc.errno is None:
                raise error(f"{what} artifact is not a gzipped tarball: {exc}") from None
            raise
