"""The pod commands' HTTP client, as every command that takes ``--server URL`` opens it: the
client's settings with ``tunecache --token``, and one line and an exit code for a bad setting.
Shared by the command modules of :mod:`tunecache.cli` (pod, fleet, admin)."""

from __future__ import annotations

from tunecache.cli_kit import ExitCode, fail, given_token
from tunecache.client.http import InsecureTransport, TunecacheClient
from tunecache.client.settings import EMPTY_TOKEN, load_client_settings


def client_settings():
    """The environment's :class:`~tunecache.client.settings.ClientSettings` with ``--token``,
    or exit 2 naming a bad setting."""
    try:
        return load_client_settings(token=given_token())
    except ValueError as exc:
        if EMPTY_TOKEN in str(exc):
            fail(ExitCode.NOT_AUTHORISED, f"{'--token' if given_token() == '' else 'TUNECACHE_TOKEN'} {EMPTY_TOKEN}")
        fail(ExitCode.USAGE, str(exc))


def client_for(server: str, settings=None) -> TunecacheClient:
    """A client for ``server`` with ``settings`` (default: :func:`client_settings`); exit 2
    naming a bad setting, 13 when a token would go in clear text to another machine."""
    try:
        return TunecacheClient.from_settings(settings or client_settings(), server)
    except ValueError as exc:
        fail(ExitCode.NOT_AUTHORISED if isinstance(exc, InsecureTransport) else ExitCode.USAGE, str(exc))
