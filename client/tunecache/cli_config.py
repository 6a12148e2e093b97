"""The ``tunecache`` command's config file and where each of a command's settings came from.

``$XDG_CONFIG_HOME/tunecache/config.toml`` (``~/.config/tunecache/config.toml`` when
``XDG_CONFIG_HOME`` is unset) holds an operator's defaults, top-level string keys only::

    server = "https://tunecache.example.internal"
    token_file = "~/.config/tunecache/admin.token"
    trusted_keys = "~/.config/tunecache/trusted.pub"

A flag or a variable always wins over the file: ``--server`` then ``TUNECACHE_URL`` then
``server``; ``--token``, ``TUNECACHE_TOKEN``, ``TUNECACHE_TOKEN_FILE`` then ``token_file``
(a file of the operator's own naming: sent to any server, as ``TUNECACHE_TOKEN_FILE`` is);
``TUNECACHE_TRUSTED_KEYS`` then ``trusted_keys``. A relative path in the file is relative to
the file's directory. With no server given anywhere, a command takes the address of the
``tunecache serve`` on this machine that recorded where it listens in its data dir
(:mod:`tunecache.formats.local_token`), and only once that service has proved it holds its
admin token (:func:`tunecache.cli.client.client_for`): a stale record whose port another
program now holds is never talked to.

Part of the command kit (stdlib, the contract and :mod:`tunecache.formats` only): the
``--server`` option of every distribution's commands (:data:`tunecache.cli_kit.ServerOpt`)
resolves its default here; ``tunecache status`` says which source gave each setting.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tomllib
from pathlib import Path

import typer

from tunecache.formats.local_token import default_data_dir, read_record, token_files

#: The config file's name in ``$XDG_CONFIG_HOME/tunecache/``.
CONFIG_FILE_NAME = "config.toml"
#: The most bytes of the config file read.
MAX_CONFIG_BYTES = 64 * 1024
#: The config file's keys and the variable that wins over each.
CONFIG_KEYS = {"server": "TUNECACHE_URL", "token_file": "TUNECACHE_TOKEN_FILE", "trusted_keys": "TUNECACHE_TRUSTED_KEYS"}
#: What the ``--server`` option's default is when no source gives one: :func:`server_given`
#: turns it into click's "missing option" usage error.
NO_SERVER = "\0no server"


class ConfigError(ValueError):
    """The config file cannot be used: one line naming it and what is wrong."""


def config_path() -> Path:
    """``$XDG_CONFIG_HOME/tunecache/config.toml``, else ``~/.config/tunecache/config.toml``."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "tunecache" / CONFIG_FILE_NAME


@dataclasses.dataclass(frozen=True)
class ConfigFile:
    """The config file as read: its path, whether it exists, and its values (paths resolved)."""

    path: Path
    exists: bool
    values: dict[str, str]


def _resolved(path: Path, key: str, value: str) -> str:
    """A path value (``token_file``; ``trusted_keys`` unless it lists keys) made absolute:
    ``~`` expanded, relative to the config file's directory."""
    if key == "server" or (key == "trusted_keys" and value.strip().startswith("ed25519:")):
        return value
    return str(path.parent / Path(value).expanduser())


def read_config(path: Path | None = None) -> ConfigFile:
    """The config file at ``path`` (default :func:`config_path`); an empty one when there is none.

    Raises:
        ConfigError: it cannot be read, is over :data:`MAX_CONFIG_BYTES`, is not TOML, has a
            key other than :data:`CONFIG_KEYS`, or a value that is not a non-empty string.
    """
    path = path or config_path()
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        return ConfigFile(path, False, {})
    except OSError as exc:
        raise ConfigError(f"config file {path}: cannot read it: {exc.strerror}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file {path}: over {MAX_CONFIG_BYTES:,} bytes")
    try:
        table = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"config file {path}: not TOML: {exc}") from None
    values = {}
    for key, value in table.items():
        if key not in CONFIG_KEYS:
            raise ConfigError(f"config file {path}: unknown key {key[:64]!r} (known: {', '.join(CONFIG_KEYS)})")
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"config file {path}: {key} must be a non-empty string")
        values[key] = _resolved(path, key, value.strip())
    return ConfigFile(path, True, values)


@dataclasses.dataclass(frozen=True)
class LocalService:
    """The ``tunecache serve`` on this machine, as its record says: its URL, and the token
    file whose record named it."""

    url: str
    token_file: Path


def recorded_local_service(data_dir: Path | None = None) -> LocalService | None:
    """The address the ``tunecache serve`` on this machine last listened on, from the records
    beside its admin tokens in ``data_dir`` (default: the service's, :func:`default_data_dir`):
    the newest listener of each record, a wildcard address (``0.0.0.0``, ``::``) read as the
    loopback address; ``None`` when no record names one, or the records name more than one
    (two services on this machine: which is meant is the operator's to say)."""
    found: dict[str, Path] = {}
    for token_file in token_files(data_dir or default_data_dir()):
        record = read_record(token_file)
        if record is None or not record.listeners:
            continue
        listener = record.listeners[-1]
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "::1"}.get(listener.host.strip("[]"), listener.host)
        found.setdefault(listener.model_copy(update={"host": host}).url, token_file)
    if len(found) != 1:
        return None
    (url, token_file), = found.items()
    return LocalService(url, token_file)


@dataclasses.dataclass(frozen=True)
class Origin:
    """Where the server of the command being run came from: ``source`` in words (``--server``,
    ``TUNECACHE_URL``, the config file, the local service's record); ``local``: the record
    of a ``tunecache serve`` on this machine (the service must prove it is that one)."""

    url: str
    source: str
    local: LocalService | None = None


#: The default :func:`default_server` found, and where the command's server came from
#: (:func:`server_given`); one command runs per process.
_default_origin: Origin | None = None
_server_origin: Origin | None = None


def default_server() -> str:
    """The ``--server`` option's default: the config file's ``server``, else the recorded
    local service's address (:func:`recorded_local_service`), else :data:`NO_SERVER`.

    Raises:
        ConfigError: the config file cannot be used.
    """
    global _default_origin
    config = read_config()
    if "server" in config.values:
        _default_origin = Origin(config.values["server"], f"server in {config.path}")
    elif (local := recorded_local_service()) is not None:
        _default_origin = Origin(local.url, f"the tunecache serve on this machine ({local.token_file}.json)", local)
    else:
        return NO_SERVER
    return _default_origin.url


def server_given(source_name: str, value: str) -> Origin | None:
    """Record where the command's server ``value`` came from, by click's name of the
    parameter's source (``COMMANDLINE``, ``ENVIRONMENT``, ``DEFAULT``). ``None`` when no
    source gave one (:data:`NO_SERVER`): the option is missing."""
    global _server_origin
    if value == NO_SERVER:
        return None
    if source_name == "COMMANDLINE":
        _server_origin = Origin(value, "--server")
    elif source_name == "ENVIRONMENT":
        _server_origin = Origin(value, "TUNECACHE_URL")
    else:
        _server_origin = _default_origin if _default_origin and _default_origin.url == value else Origin(value, "default")
    return _server_origin


def default_server_option() -> str:
    """``--server``'s default (:func:`default_server`); a config file that cannot be used is
    one line and exit 2, as the kit's ``fail`` says one (it is read while the command line is
    parsed)."""
    try:
        return default_server()
    except ConfigError as exc:
        typer.echo(f"tunecache: error: {exc}", err=True)
        raise typer.Exit(2) from None


def server_given_option(ctx: typer.Context, param: typer.CallbackParam, value: str) -> str:
    """``--server``'s callback: record where it came from (:func:`server_given`); click's
    "missing option" usage error when no source gave one."""
    source = ctx.get_parameter_source(param.name)
    if server_given(getattr(source, "name", "DEFAULT"), value) is None:
        raise sys.modules[typer.BadParameter.__module__].MissingParameter(ctx=ctx, param=param)
    return value


#: How ``--server`` takes its default (:data:`tunecache.cli_kit.ServerOpt`): the options of its ``typer.Option``.
SERVER_DEFAULT = {"default_factory": default_server_option, "callback": server_given_option, "show_default": False}


def server_origin() -> Origin | None:
    """Where the server of the command being run came from (``None``: it takes none, or not yet)."""
    return _server_origin


def setting_overrides(config: ConfigFile | None = None) -> dict[str, str]:
    """The client settings the config file gives (``token_file``, ``trusted_keys``) where no
    variable sets them, for :func:`tunecache.client.settings.load_client_settings`.

    Raises:
        ConfigError: the config file cannot be used.
    """
    config = config or read_config()
    return {key: value for key, value in config.values.items()
            if key != "server" and not os.environ.get(CONFIG_KEYS[key])}
