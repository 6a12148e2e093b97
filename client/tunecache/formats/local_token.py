"""The admin tokens ``tunecache serve`` writes in its data dir, and the record beside each
naming the service it belongs to.

A service's first start on a database without tokens writes its admin token to
``<data dir>/admin.token``, or, where that file is another database's, to
``admin-<12 hex of the database's sha256>.token``: two services on one machine (the SQLite
quick start, then PostgreSQL) never overwrite each other's. Beside each token file,
``<file>.json`` (:class:`LocalAdminToken`) names its database and the addresses its service
listens on (each start of that service adds its own). A client on the same machine sends
such a token only to a server URL one of those addresses reaches (:func:`reaches`), and only
once the service there has proved it holds the token (:func:`tunecache.contract.tokens.token_proof`,
``tunecache.store.http.local_token``): never to another port, another address, or another service.

Written by the service (``tunecache.service.cli``), read by the client; no I/O beyond the
data dir's files.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import tempfile
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

#: The documented token file: the first service's on a machine (the single-service case).
ADMIN_TOKEN = "admin.token"
#: The most token files of a data dir looked at, the most addresses one record keeps (the
#: newest), and the most bytes of a record read.
MAX_TOKEN_FILES = 64
MAX_LISTENERS = 8
MAX_RECORD_BYTES = 64 * 1024


class Listener(BaseModel):
    """One address a service listens on, as ``tunecache serve`` was told (``--host``, ``--port``)."""

    scheme: Literal["http", "https"]
    host: str = Field(min_length=1, max_length=255)
    port: int = Field(gt=0, lt=65536)

    @property
    def url(self) -> str:
        return f"{self.scheme}://{f'[{self.host}]' if ':' in self.host else self.host}:{self.port}"


class LocalAdminToken(BaseModel):
    """``<token file>.json``: whose admin token the file beside it is."""

    database: str = Field(max_length=4096, description="the service's database (URL, password hidden)")
    listeners: list[Listener] = Field(max_length=MAX_LISTENERS, description="where it listens, newest last")


def default_data_dir() -> Path:
    """The data dir of a ``tunecache serve`` on this machine, as the service and its clients
    read it: ``$TUNECACHE_DATA_DIR``, else ``$XDG_DATA_HOME/tunecache`` or
    ``~/.local/share/tunecache``."""
    return Path(os.environ.get("TUNECACHE_DATA_DIR") or os.path.join(
        os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share"), "tunecache"))


def record_path(token_file: Path) -> Path:
    """The record beside ``token_file`` (``admin.token`` -> ``admin.token.json``)."""
    return token_file.with_name(token_file.name + ".json")


def token_files(data_dir: Path) -> list[Path]:
    """The admin token files in ``data_dir``: ``admin.token`` first, then ``admin-*.token`` by
    name; at most :data:`MAX_TOKEN_FILES`."""
    try:
        others = sorted(p for p in Path(data_dir).glob("admin-*.token") if p.is_file())
    except OSError:
        others = []
    first = Path(data_dir) / ADMIN_TOKEN
    return ([first] if first.is_file() else []) + others[:MAX_TOKEN_FILES - 1]


def per_database_file(data_dir: Path, database: str) -> Path:
    """The token file of ``database`` where ``admin.token`` is another's."""
    return Path(data_dir) / f"admin-{hashlib.sha256(database.encode()).hexdigest()[:12]}.token"


def read_record(token_file: Path) -> LocalAdminToken | None:
    """The record beside ``token_file``; ``None`` when there is none, or it cannot be read or is
    not one (then the token file names no service, and no client sends it)."""
    try:
        with open(record_path(token_file), "rb") as f:
            data = f.read(MAX_RECORD_BYTES + 1)
    except OSError:
        return None
    if len(data) > MAX_RECORD_BYTES:
        return None
    try:
        return LocalAdminToken.model_validate_json(data)
    except ValidationError:
        return None


def read_token(token_file: Path) -> str | None:
    """The token in ``token_file`` (its first line); ``None`` when it cannot be read or is empty."""
    try:
        with open(token_file, "rb") as f:
            data = f.read(4096)
        lines = data.decode("ascii").strip().splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    return lines[0].strip() if lines else None


def write_record(token_file: Path, record: LocalAdminToken) -> None:
    """Write the record beside ``token_file`` as the token is written: staged under a random
    name (mode 0600, never through a link) and renamed into place.

    Raises:
        OSError: it cannot be written.
    """
    target = record_path(token_file)
    fd, staged = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(record.model_dump_json(indent=2) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(staged, target)
    except OSError:
        Path(staged).unlink(missing_ok=True)
        raise


def with_listener(record: LocalAdminToken | None, database: str, listener: Listener) -> LocalAdminToken:
    """``record`` (or a new one of ``database``) with ``listener`` last, once; the newest
    :data:`MAX_LISTENERS` kept."""
    listeners = [known for known in (record.listeners if record else []) if known != listener] + [listener]
    return LocalAdminToken(database=database, listeners=listeners[-MAX_LISTENERS:])


def _default_port(scheme: str) -> int:
    return 443 if scheme == "https" else 80


def reaches(listener: Listener, scheme: str, host: str, port: int | None) -> bool:
    """Whether a request to ``scheme://host:port`` goes to a service listening at ``listener``:
    the same scheme and port, and the same host, or the service listens on every IPv4 address
    (``0.0.0.0``) and ``host`` is an IPv4 loopback address, or on every address (``::``) and
    ``host`` is ``::1``. A name (``localhost``) reaches only a service told to listen on that
    name: it may resolve to an address another process listens on."""
    if scheme != listener.scheme or (port or _default_port(scheme)) != listener.port:
        return False
    wanted, listening = host.strip("[]").lower(), listener.host.strip("[]").lower()
    if wanted == listening:
        return True
    try:
        address = ipaddress.ip_address(wanted)
    except ValueError:
        return False
    if listening == "0.0.0.0":
        return address.version == 4 and address.is_loopback
    if listening in ("::", ""):
        return address.is_loopback
    return False
