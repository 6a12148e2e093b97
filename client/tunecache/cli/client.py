"""The pod commands' HTTP store, as every command that takes ``--server URL`` opens it: the
pods' settings (:class:`~tunecache.client.settings.ClientSettings`) with ``tunecache --token``
and the config file's (:mod:`tunecache.cli_config`), and one line and an exit code for a bad
setting (:func:`tunecache.cli_kit.server_store`). Shared by the command modules of
:mod:`tunecache.cli` (pod, fleet, admin, and the operator's: status, jobs, show)."""

from __future__ import annotations

from tunecache import cli_config
from tunecache.cli_kit import ExitCode, connection_settings, fail, server_store
from tunecache.client.settings import ClientSettings
from tunecache.store.http import TunecacheClient


def client_settings() -> ClientSettings:
    """The environment's :class:`~tunecache.client.settings.ClientSettings` with ``--token``
    and what the config file gives where no variable does, or exit 2 naming a bad setting
    (13 for an empty token)."""
    return connection_settings(ClientSettings)


def _check_local_service(server: str, settings: ClientSettings) -> None:
    """Where the server is the address a local ``tunecache serve`` recorded (no server was
    given), exit 4 unless the service there proves it holds that service's admin token: a
    stopped service's port may be another program's now."""
    origin = cli_config.server_origin()
    if origin is None or origin.local is None or origin.url != server:
        return
    import ssl

    import httpx

    from tunecache.store.http.local_token import local_admin_token
    from tunecache.store.http.settings import PROOF_TIMEOUT_S

    try:  # a service with its own certificate: the CA bundle the client verifies it with
        verify = ssl.create_default_context(cafile=str(settings.ca_bundle)) if settings.ca_bundle is not None else True
    except (ssl.SSLError, OSError):
        verify = True  # the client made with these settings says what is wrong with the bundle
    local = local_admin_token(server, origin.local.token_file.parent, verify=verify, timeout=httpx.Timeout(
        min(settings.read_timeout, PROOF_TIMEOUT_S), connect=min(settings.connect_timeout, PROOF_TIMEOUT_S)))
    if local.token is None:
        fail(ExitCode.SERVER_UNREACHABLE, f"no --server given, and the tunecache serve recorded in "
                                          f"{origin.local.token_file}.json does not answer at {server} as itself "
                                          "(stopped?): start it, or give --server or TUNECACHE_URL")


def client_for(server: str, settings: ClientSettings | None = None) -> TunecacheClient:
    """A client for ``server`` with ``settings`` (default: :func:`client_settings`); exit 2
    naming a bad setting, 13 when a token would go in clear text to another machine, 4 when
    no server was given and the local service recorded in the data dir does not prove it is
    listening where it recorded."""
    settings = settings or client_settings()
    _check_local_service(server, settings)
    return server_store(server, settings)
