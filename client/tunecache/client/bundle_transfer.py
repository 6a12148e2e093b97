"""Carrying signed runs between two services that have no route between them: choose runs in
one (:func:`chosen_runs`), write them into a bundle (:func:`write_bundle`,
:mod:`tunecache.client.oci_bundle`), and record a bundle's runs in the other
(:func:`import_run`), each only where that service trusts the key that signed it.

A run keeps its signature: the importing service checks it against its own trusted keys
(``POST /v1/tunings?trusted_signature=true``) and refuses it (409, nothing stored) unless one
of them signed it; pods of that service verify it over their own key and environment against
their trusted keys, as a run tuned there. Bytes the service already holds are not sent again
(the record names those missing; only they are uploaded).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tunecache.store.http import TunecacheClient
from tunecache.client.oci_bundle import MAX_BUNDLE_RUNS, BadBundle, BundleEntry, LayoutWriter
from tunecache.contract import RunStatus, TuningRunQuery, TuningRunRead
from tunecache.store import NoCompatibleTuning, ServerError, TunecacheError


class UnsignedRun(TunecacheError):
    """A run chosen for export is not signed: no service could take it in."""


class ImportRefused(TunecacheError):
    """The importing service does not trust the run's signature (its 409); nothing was stored."""


def chosen_runs(client: TunecacheClient, run_ids: Iterable[int], models: Iterable[str],
                filters: dict[str, object], every_key: bool = False) -> list[TuningRunRead]:
    """The runs named by id, then the current run of every key and environment that matches
    ``filters`` (key fields) for each of ``models`` (or every model, with ``every_key``), each
    once, in that order.

    Raises:
        BadBundle: over :data:`~tunecache.client.oci_bundle.MAX_BUNDLE_RUNS` runs.
        UnsignedRun: a chosen run is not signed, or cannot be carried (failed, retired).
        ServerError (404 for a run id), ServerUnreachable.
    """
    chosen: dict[int, TuningRunRead] = {}

    def take(runs: Iterator[TuningRunRead] | list[TuningRunRead]) -> None:
        for run in runs:
            chosen.setdefault(run.id, run)
            if len(chosen) > MAX_BUNDLE_RUNS:
                raise BadBundle(f"over {MAX_BUNDLE_RUNS} runs chosen; a bundle holds at most that: choose fewer")

    take([client.get_run(run_id) for run_id in run_ids])
    for model in ([None] if every_key else list(models)):
        query = {**filters, **({"model": model} if model else {})}
        take(client.iter_runs(TuningRunQuery(current_only=True, limit=500, **query)))
    for run in chosen.values():
        if run.status is not RunStatus.SUCCEEDED or run.retired_at is not None:
            state = "retired" if run.retired_at is not None else str(run.status)
            raise UnsignedRun(f"run {run.id} of {run.key.model} is {state}: only a run that can be current is exported")
        if run.signature is None:
            raise UnsignedRun(f"run {run.id} of {run.key.model} is unsigned: a service imports only runs signed by a "
                              f"key it trusts (sign it: tunecache promote {run.id} --signing-key KEY)")
    return list(chosen.values())


def write_bundle(client: TunecacheClient, runs: list[TuningRunRead], root: Path, tag: str,
                 said: Callable[[TuningRunRead, int], None]) -> tuple[str, int]:
    """Write ``runs`` with their artifacts (downloaded verified) as a bundle into the new
    layout ``root``; ``said(run, bytes)`` after each. Returns the bundle's digest and the
    artifact bytes written."""
    writer = LayoutWriter(root)
    now = dt.datetime.now(dt.timezone.utc)
    for run in runs:
        said(run, writer.add_run(run, client.download_artifact, now))
    return writer.finish(tag), writer.artifact_bytes


@dataclass(frozen=True)
class Imported:
    """What :func:`import_run` did: ``run`` as the importing service holds it, and whether
    it was there already (current, with the same signature: nothing recorded)."""

    run: TuningRunRead
    already: bool = False
    uploaded: int = 0


def _current_there(client: TunecacheClient, entry: BundleEntry) -> TuningRunRead | None:
    """The importing service's current run of the entry's key and environment where it
    carries the same signature (imported before), else ``None``."""
    run = entry.record.run
    try:
        current = client.lookup(run.key, run.environment, variant=run.variant)
    except NoCompatibleTuning:
        return None
    same = current.signature is not None and run.signature is not None and current.signature == run.signature
    return current if same else None


def import_run(client: TunecacheClient, entry: BundleEntry) -> Imported:
    """Record the entry's run in the service of ``client``, its signature kept, only where
    the service trusts it; the artifacts the service lacks are uploaded from the layout.

    Raises:
        ImportRefused: the service does not trust the run's signature (nothing was stored).
        ServerError, ServerUnreachable: as the client raises them.
    """
    already = _current_there(client, entry)
    if already is not None:
        return Imported(already, already=True)
    run = entry.record.run
    try:
        return Imported(client.record_run(run, trusted_signature=True))
    except ServerError as exc:
        if exc.status_code == 409:
            raise ImportRefused(str(exc.detail)) from None
        missing = list(exc.missing)
        if not missing or not set(missing) <= entry.files.keys():
            raise
    for sha in missing:
        client.upload_file(entry.files[sha], again=True)
    return Imported(client.record_run(run, trusted_signature=True),
                    uploaded=sum(entry.files[sha].stat().st_size for sha in missing))
