"""What the fleet view says of images: the pod boots that left out kinds of the run they
installed because it was made on another image (other torch, Triton or TVM-FFI than theirs,
:mod:`tunecache.formats.dependencies`), by key and by kind, from the reports' ``missing_kinds``.

A fleet upgraded node by node boots pods of an image that has no run of the key yet; they get
the key's current run without what drifts (the compile cache, Triton's kernels) and say so.
:func:`missing_kinds` gives :func:`tunecache.service.reports.fleet_view` each key's
``missing`` and ``missing_kinds`` (:class:`tunecache.contract.FleetKey`).
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from typing import Any

from sqlalchemy import Connection, Select, func, select

from tunecache.contract import ArtifactKind
from tunecache.service.models import PodReport

#: Key hashes per ``IN (...)`` of :func:`missing_kinds`.
_IN_CHUNK = 500
#: The kinds' names (a stored list naming another is not counted by kind).
_KINDS = frozenset(kind.value for kind in ArtifactKind)


def missing_groups(since: dt.datetime, key_hashes: list[str]) -> Select:
    """Reports since ``since`` of ``key_hashes`` that left out kinds, by key and the kinds
    they name: ``(key_hash, missing_kinds, boots)`` (a boot counts once: distinct ``boot_id``,
    plus one per report without one)."""
    boots = func.count(PodReport.boot_id.distinct()) + func.count() - func.count(PodReport.boot_id)
    return (select(PodReport.key_hash, PodReport.missing_kinds, boots)
            .where(PodReport.received_at >= since, PodReport.missing_kinds.is_not(None),
                   PodReport.key_hash.in_(key_hashes))
            .group_by(PodReport.key_hash, PodReport.missing_kinds))


def missing_kinds(connection: Connection, since: dt.datetime, key_hashes: list[str]) -> dict[str, dict[str, Any]]:
    """For each of ``key_hashes`` (a page of the matrix) whose pods left out kinds since
    ``since``: ``{"missing": boots, "missing_kinds": {kind: boots}}``."""
    found: dict[str, dict[str, Any]] = {}
    for start in range(0, len(key_hashes), _IN_CHUNK):
        for key_hash, kinds, boots in connection.execute(missing_groups(since, key_hashes[start:start + _IN_CHUNK])):
            entry = found.setdefault(key_hash, {"missing": 0, "missing_kinds": defaultdict(int)})
            entry["missing"] += boots
            for kind in kinds.split(","):
                if kind in _KINDS:
                    entry["missing_kinds"][kind] += boots
    return {key_hash: {**entry, "missing_kinds": dict(entry["missing_kinds"])} for key_hash, entry in found.items()}
