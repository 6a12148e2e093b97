"""The pod commands' HTTP store, as every command that takes ``--server URL`` opens it: the
pods' settings (:class:`~tunecache.client.settings.ClientSettings`) with ``tunecache --token``,
and one line and an exit code for a bad setting (:func:`tunecache.cli_kit.server_store`).
Shared by the command modules of :mod:`tunecache.cli` (pod, fleet, admin)."""

from __future__ import annotations

from tunecache.cli_kit import connection_settings, server_store
from tunecache.client.settings import ClientSettings
from tunecache.store.http import TunecacheClient


def client_settings() -> ClientSettings:
    """The environment's :class:`~tunecache.client.settings.ClientSettings` with ``--token``,
    or exit 2 naming a bad setting (13 for an empty token)."""
    return connection_settings(ClientSettings)


def client_for(server: str, settings: ClientSettings | None = None) -> TunecacheClient:
    """A client for ``server`` with ``settings`` (default: :func:`client_settings`); exit 2
    naming a bad setting, 13 when a token would go in clear text to another machine."""
    return server_store(server, settings or client_settings())
