"""When a worker's install reports go out during a boot, and what they say of its engine
variant. Building and sending one report is :mod:`tunecache.client.report`'s.

A worker's report waits until its warmup ended (:func:`hold_reports`, from the plugin's hook
on ``compile_or_warm_up_model``), so that it carries what the boot compiled (the attestation,
:func:`send_held_reports`); without that hook it goes at once. Each report says the worker's
engine variant as its compile-cache install found it (:data:`variant_seen`) and the engine
arguments its main process handed over (:attr:`tunecache.client.boot.handoff.Handoff.engine_args`),
and every run the boot installed from (:func:`installed_from`).
Nothing here raises or waits.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tunecache.client.boot.handoff import Handoff
from tunecache.store.http import TunecacheClient
from tunecache.client.install import InstallResult
from tunecache.contract import EnvironmentMetadata, ReportOutcome, ReportSource, TuningKey

if TYPE_CHECKING:  # the pod's settings, imported only where it is booted (not with the plugin)
    from tunecache.client.settings import ClientSettings

log = logging.getLogger("vllm.plugins.tunecache")


@dataclass
class VariantSeen:
    """What this worker found of its engine variant (sent with its reports)."""

    variant: str | None = None
    missing: bool = False
    run: int | None = None
    """The run its variant's compile cache was installed from, when not the boot's own."""


#: This worker's engine variant, set by its compile-cache install
#: (:func:`tunecache.client.boot.staged.install_staged_compile_cache`).
variant_seen = VariantSeen()


def variant_report_fields() -> dict[str, object]:
    """The report fields of this worker's engine variant: ``variant`` (when its compile-cache
    install computed it), ``variant_missing``, ``engine_args`` (:attr:`Handoff.engine_args`)."""
    fields: dict[str, object] = {}
    if variant_seen.variant:
        fields["variant"] = variant_seen.variant
        fields["variant_missing"] = variant_seen.missing
    args = Handoff.from_environment().engine_args
    if args:
        fields["engine_args"] = args
    return fields


def installed_from(result: InstallResult) -> list[int]:
    """Every run this worker's boot installed from, each once: the run whose warm state the
    engine's main process installed (:attr:`Handoff.warm_state_run`), the tactics' run
    (``result``), the run of its engine variant's compile cache (:data:`variant_seen`)."""
    runs = [Handoff.from_environment().warm_state_run,
            result.run_id if result.outcome is ReportOutcome.INSTALLED else None, variant_seen.run]
    return list(dict.fromkeys(run for run in runs if run is not None))


def report_install(key: TuningKey | None, environment: EnvironmentMetadata | None, settings: ClientSettings,
                   client: TunecacheClient | None, started: float | None, rank: int, looked_up: bool,
                   result: InstallResult) -> None:
    """Send this worker's install report (:mod:`tunecache.client.report`) in the background,
    for ``key`` and ``environment`` (the pod record's: nothing when it has none, the lookup
    never got that far or an older plugin wrote it), through ``client``'s server and token
    (a new client of ``settings`` when ``None``), unless ``TUNECACHE_REPORT=0`` or the
    result is not reported (:meth:`InstallResult.report_fields`); held while
    :func:`hold_reports` is in force. Never raises, never waits."""
    fields = result.report_fields()
    if key is None or environment is None or fields is None or not getattr(settings, "report", True):
        return
    seconds = time.monotonic() - started if started is not None else 0.0
    report = (key, environment, settings, client, seconds, rank, looked_up, result)
    if _held is not None:  # sent once the worker warmed up, with what its boot compiled
        _held.append(report)
        return
    _send(*report)


#: Reports held until the worker warmed up (:func:`hold_reports`), else ``None``.
_held: list[tuple] | None = None


def hold_reports() -> None:
    """Hold this worker's install report until :func:`send_held_reports` (the vLLM plugin
    does, when it can count what the boot compiled once the worker warmed up)."""
    global _held
    if _held is None:
        _held = []


def send_held_reports(compiled: dict | None) -> None:
    """Send the held reports, each with the boot's attestation ``compiled``. Never raises."""
    global _held
    held, _held = _held or [], None
    for report in held:
        _send(*report, compiled)


def _send(key: TuningKey, environment: EnvironmentMetadata, settings: ClientSettings, client: TunecacheClient | None,
          seconds: float, rank: int, looked_up: bool, result: InstallResult, compiled: dict | None = None) -> None:
    fields = result.report_fields() or {}
    if compiled is not None:
        fields["compiled"] = compiled
    fields.update(variant_report_fields(), installed_from=installed_from(result))
    try:
        from tunecache.client.report import build_report, send_in_background

        if client is None:
            client = TunecacheClient.from_settings(settings)
            client.close()  # only its server, token and TLS settings are used, by the report's own client
        send_in_background(client, build_report(key, environment, result.outcome, seconds, ReportSource.PLUGIN,
                                                rank=rank, looked_up=looked_up, **fields))
    except Exception as exc:
        log.debug("tunecache: install report not sent: %s: %s", type(exc).__name__, exc)
