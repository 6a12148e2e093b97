"""Reading what a run's warm-state tarballs say about themselves: the compile cache's factors,
from the tarball as it streams by or from what was unpacked of it (:mod:`tunecache.client.unpack`)."""

from __future__ import annotations

import contextlib
from pathlib import Path

from pydantic import ValidationError
from tunecache.engines.vllm.compile_cache import FACTORS_FILE, CompileFactors
from tunecache.formats.tarball import TarSource, stream_bounded


class BadWarmStateArtifact(ValueError):
    """A warm-state tarball that cannot be installed (unsafe entries, not a gzipped tarball)."""


def _factors_of(raw: bytes) -> CompileFactors:
    try:
        return CompileFactors.model_validate_json(raw)
    except ValidationError as exc:  # one line, each field named
        why = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'document'}: {e['msg']}" for e in exc.errors()[:5])
        raise BadWarmStateArtifact(f"the compile cache's {FACTORS_FILE} is unreadable: {why}") from None
    except ValueError as exc:
        raise BadWarmStateArtifact(f"the compile cache's {FACTORS_FILE} is unreadable: {exc}") from None


def read_compile_factors(data: TarSource) -> CompileFactors | None:
    """The node's factors inside a ``vllm_compile_cache`` tarball (``None``: none recorded),
    read as the tarball streams by, up to that entry (the entries before it checked).

    Raises:
        BadWarmStateArtifact: not a gzipped tarball, unsafe entries, or unreadable factors.
    """
    from tunecache.client.unpack import safe_entry

    check = safe_entry("vllm_compile_cache", BadWarmStateArtifact)
    raw = None
    with contextlib.closing(stream_bounded(data, "vllm_compile_cache", BadWarmStateArtifact)) as entries:
        for tar, member in entries:
            check(member)
            if member.name == FACTORS_FILE and member.isfile():
                found = tar.extractfile(member)
                raw = found.read(1 << 20) if found else b""
                break
    return None if raw is None else _factors_of(raw)


def staged_factors(staged: Path) -> CompileFactors | None:
    """The node's factors in an unpacked compile cache (``None``: none recorded).

    Raises:
        BadWarmStateArtifact: unreadable factors."""
    found = staged / FACTORS_FILE
    if not found.is_file():
        return None
    with found.open("rb") as f:
        return _factors_of(f.read(1 << 20))
