"""How the HTTP store connects, read from ``TUNECACHE_*`` environment variables
(pydantic-settings): the server's URL, the token and where it comes from (the local admin
token of a ``tunecache serve`` on this machine included, :mod:`.local_token`), timeouts,
attempts, TLS, the install deadline and install reports.

:class:`ConnectionSettings` is what :meth:`tunecache.store.http.TunecacheClient.from_settings`
reads, and all a command needs to open the HTTP store of a ``--server URL`` (the server's
``tune --server``, through :func:`tunecache.cli_kit.server_store`). The pods' settings
(:class:`tunecache.client.settings.ClientSettings`) are these and the pod's own. Each field's
``description`` is its documentation (``scripts/settings_docs.py`` writes the pod guide's table).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple, TypeVar

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


def _is_local(url: str) -> bool:
    """Whether ``url`` names a server on this machine (``localhost`` or a loopback address)."""
    import ipaddress
    from urllib.parse import urlsplit

    try:
        host = urlsplit(url).hostname or ""
    except ValueError:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def default_token_file() -> Path:
    """``admin.token`` in the data dir of a ``tunecache serve`` on this machine
    (``$TUNECACHE_DATA_DIR``, else ``$XDG_DATA_HOME/tunecache`` or ``~/.local/share/tunecache``)."""
    from tunecache.formats.local_token import ADMIN_TOKEN, default_data_dir

    return default_data_dir() / ADMIN_TOKEN


class ConnectionSettings(BaseSettings):
    """Settings of a connection to a tunecache server (each field's ``description`` says what it does)."""

    model_config = SettingsConfigDict(env_prefix="TUNECACHE_", extra="ignore")

    url: str | None = Field(default=None, description=(
        "the tunecache server, e.g. `http://tunecache:8321` (the default `--server` of the pod commands; the plugin "
        "does nothing without it)"))
    token: SecretStr | None = Field(default=None, description=(
        "sent as `Authorization: Bearer <token>` on every request (`--token` overrides it); printable ASCII without "
        "spaces; an empty one is refused (exit 13), never taken as no token"))
    connect_timeout: float = Field(default=5.0, gt=0, le=3600, description="seconds to connect")
    read_timeout: float = Field(default=30.0, gt=0, le=3600, description="seconds to wait for each read")
    total_timeout: float = Field(default=120.0, gt=0, le=86400, description=(
        "seconds one request may take in all: every attempt, its wait for the first byte and the waits between "
        "attempts together (no retry starts that would begin past it)"))
    attempts: int = Field(default=3, gt=0, le=100, description=(
        "tries per request for transient failures (refused, reset, timeouts, cut-short bodies, 429, 502, 503, 504)"))
    max_retry_after: float = Field(default=30.0, ge=0, le=3600, description=(
        "the most seconds a server's `Retry-After` is waited for"))
    install_deadline: float = Field(default=30.0, gt=0, le=3600, description=(
        "seconds one install (the lookup and every artifact download together: `pull`, the Python API, the plugin) "
        "may take in all, not counting the seconds an artifact's body arrives at `TUNECACHE_MIN_DOWNLOAD_RATE` or "
        "faster; past it the install gives up and writes nothing, and the pod boots as without tunecache "
        "(`pull`: exit 4)"))
    token_file: Path = Field(default_factory=default_token_file, json_schema_extra={
        "shown_default": "`<data dir>/admin.token`"}, description=(
        "a file holding the token, read when `TUNECACHE_TOKEN` is unset and the file exists, and sent to any server. "
        "Unset: the admin token a `tunecache serve` on this machine wrote in its data dir (the data dir as the "
        "service's: `TUNECACHE_DATA_DIR`, else `$XDG_DATA_HOME/tunecache` or `~/.local/share/tunecache`; "
        "`admin.token`, or `admin-<hash>.token` for a second database), sent only to that service: to an address "
        "its record beside the file (`admin.token.json`) lists, once the service there has proved it holds the token "
        "([trust.md](trust.md#the-local-admin-token))"))
    ca_bundle: Path | None = Field(default=None, description=(
        "CA certificates (PEM) to verify the server's TLS certificate with (default: the system's); TLS is always "
        "verified"))
    allow_insecure: bool = Field(default=False, description=(
        "allow sending a token over plain `http://` to a host that is not loopback (refused otherwise: exit 13)"))
    report: bool = Field(default=True, description=(
        "after each install (`pull`, the Python API, the plugin) send the server a report of it, in the background; "
        "`0`: never"))
    report_timeout: float = Field(default=2.0, gt=0, le=60, description=(
        "seconds one report may take in all (one attempt; connect, send and answer together)"))

    def resolved_token(self, server_url: str | None = None) -> str | None:
        """The token to send to ``server_url``: :meth:`resolved_credential`'s."""
        return self.resolved_credential(server_url).token

    def resolved_credential(self, server_url: str | None = None) -> "Credential":
        """The token to send to ``server_url`` and where it comes from: ``token``
        (``--token`` or ``TUNECACHE_TOKEN``), else the first line of a ``TUNECACHE_TOKEN_FILE``
        that is set, read for any server, else the admin token a ``tunecache serve`` on this
        machine left in its data dir, for that service only: ``server_url`` must be an
        address its record lists and the service there must prove it holds the token
        (:mod:`tunecache.store.http.local_token`; one request), so no other listener or service
        ever gets it. Else no token, and the source says why none.

        Raises:
            ValueError: a ``TUNECACHE_TOKEN_FILE`` that is set exists but cannot be read, is
                empty or is not text.
        """
        if self.token is not None:
            value = self.token.get_secret_value()
            source = "TUNECACHE_TOKEN" if os.environ.get("TUNECACHE_TOKEN") == value else "--token"
            return Credential(value, source)
        if "token_file" in self.model_fields_set:
            return self._token_file_credential()
        if server_url is None or not _is_local(server_url):
            return Credential(None, "no token")
        import ssl

        import httpx

        from tunecache.store.http.local_token import local_admin_token

        try:
            verify = ssl.create_default_context(cafile=str(self.ca_bundle)) if self.ca_bundle is not None else True
        except (ssl.SSLError, OSError):
            verify = True  # the client made with these settings says what is wrong with the bundle
        # the proof is one small answer: a service that does not give it within seconds gets no token
        local = local_admin_token(server_url, self.token_file.parent, verify=verify, timeout=httpx.Timeout(
            min(self.read_timeout, PROOF_TIMEOUT_S), connect=min(self.connect_timeout, PROOF_TIMEOUT_S)))
        if local.token is not None:
            return Credential(local.token, f"the admin token of the tunecache serve listening there ({local.path})")
        return Credential(None, f"no token ({local.why_not})" if local.why_not else "no token")

    def _token_file_credential(self) -> "Credential":
        where = f"TUNECACHE_TOKEN_FILE={str(self.token_file)!r}"
        try:
            text = self.token_file.read_text(encoding="ascii").strip()
        except FileNotFoundError:
            return Credential(None, f"no token ({where} does not exist)")
        except UnicodeDecodeError:
            raise ValueError(f"{where}: not a token (the file is not ASCII text)") from None
        except OSError as exc:
            raise ValueError(f"{where}: cannot read it: {exc.strerror}") from None
        if not text:
            raise ValueError(f"{where}: the file is empty")
        return Credential(text.splitlines()[0].strip(), where)

    @field_validator("token")
    @classmethod
    def _token_fits_a_header(cls, token: SecretStr | None) -> SecretStr | None:
        value = token.get_secret_value() if token is not None else None
        if value == "":  # never "no token": that would fall back to the token file (an admin's, on a server's machine)
            raise ValueError(EMPTY_TOKEN)
        if value is not None and not (value.isascii() and value.isprintable() and " " not in value and value):
            raise ValueError("must be printable ASCII without spaces (it is sent in an HTTP header)")
        return token


#: The most seconds a local service's proof that it holds its admin token is waited for
#: (to connect, and for the answer).
PROOF_TIMEOUT_S = 5.0


class Credential(NamedTuple):
    """A token to send (``None``: none) and where it comes from, as a 401 names it: ``--token``,
    ``TUNECACHE_TOKEN``, ``TUNECACHE_TOKEN_FILE='...'``, the local service's admin token (its
    file), or ``no token`` with why."""

    token: str | None
    source: str


#: Why an empty token is refused (the CLI exits 13 with it).
EMPTY_TOKEN = ("is set but empty: an empty token is refused, never taken as no token (which would fall back to "
               "TUNECACHE_TOKEN_FILE or a local server's admin.token); unset it, or give a token")


Settings = TypeVar("Settings", bound=ConnectionSettings)


def load_settings(settings_class: type[Settings], **overrides: object) -> Settings:
    """The environment's ``settings_class`` with ``overrides`` (``None`` values are ignored).

    Raises:
        ValueError: one line naming the variable and what is wrong with it, e.g.
            ``TUNECACHE_ATTEMPTS='x': Input should be a valid integer``.
    """
    given = {name: value for name, value in overrides.items() if value is not None}
    try:
        return settings_class(**given)
    except ValidationError as exc:
        error = exc.errors()[0]
        name = str(error["loc"][0]) if error["loc"] else "?"
        shown_input = "<hidden>" if name == "token" else repr(error.get("input"))
        shown = f"TUNECACHE_{name.upper()}={shown_input}" if name not in given else f"{name}={shown_input}"
        raise ValueError(f"{shown}: {error['msg']}") from None
