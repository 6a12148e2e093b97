"""Pod-side settings, read from ``TUNECACHE_*`` environment variables (pydantic-settings).

One :class:`ClientSettings` serves the CLI, the Python API and the vLLM plugin alike:

==============================  ===========  ==================================================
variable                        default      meaning
==============================  ===========  ==================================================
``TUNECACHE_URL``               (none)       the tunecache server, e.g. ``http://tunecache:8321``
``TUNECACHE_TOKEN``             (none)       sent as ``Authorization: Bearer <token>``
``TUNECACHE_TOKEN_FILE``        see meaning  a file holding the token, read when
                                             ``TUNECACHE_TOKEN`` is unset; default: the
                                             ``admin.token`` that ``tunecache serve`` writes
                                             in its data dir on this machine, if there is one
``TUNECACHE_CA_BUNDLE``         (none)       CA certificates (PEM) to verify the server's TLS
                                             certificate with (default: the system's)
``TUNECACHE_ALLOW_INSECURE``    ``false``    allow sending a token over plain HTTP to a host
                                             that is not loopback
``TUNECACHE_TRUSTED_KEYS``      (none)       public keys of the fleet's tuner nodes: a file
                                             (one ``ed25519:...`` per line) or a comma list;
                                             runs signed by none of them install no JIT
                                             module, no DeepGEMM cache, and no tactics
``TUNECACHE_STATE_DIR``         see meaning  where a pod remembers the newest signing time it
                                             installed per key (it refuses older runs);
                                             default ``~/.cache/tunecache``
``TUNECACHE_CONNECT_TIMEOUT``   ``5``        seconds to connect
``TUNECACHE_READ_TIMEOUT``      ``30``       seconds to wait for each read
``TUNECACHE_TOTAL_TIMEOUT``     ``120``      seconds one request may take in all: every
                                             attempt, the wait for its first byte and the
                                             waits between attempts together
``TUNECACHE_ATTEMPTS``          ``3``        tries per request for transient failures
``TUNECACHE_MAX_RETRY_AFTER``   ``30``       most seconds a server's ``Retry-After`` is obeyed
``TUNECACHE_INSTALL_DEADLINE``  ``30``       seconds one install (the lookup and every
                                             artifact download together) may take; past
                                             it the pod gives up and installs nothing
``TUNECACHE_MAX_ANSWER_BYTES``  16 MiB       most bytes a JSON answer may take as it expands
``TUNECACHE_MAX_UNPACK_BYTES``  1 GiB        most bytes an artifact may have, and unpack to
``TUNECACHE_MAX_UNPACK_FILES``  ``20000``    most entries a tarball (or a v2 store) may make
``TUNECACHE_JIT``               ``true``     plugin: also install the run's JIT modules
``TUNECACHE_PUSH_BACK``         ``false``    plugin: upload a pod's own tuning after a miss
``TUNECACHE_DTYPE``             ``auto``     plugin: the key's dtype (vLLM's ``--dtype``)
``TUNECACHE_QUANTIZATION``      ``auto``     plugin: the key's quantization
``TUNECACHE_ENVIRONMENT_FILE``  (none)       plugin: environment from this file, not detected
``TUNECACHE_REPORT``            ``true``     after each install (pull, the Python API, the
                                             plugin) send the server a report of it, in the
                                             background (``0``: never)
``TUNECACHE_REPORT_TIMEOUT``    ``2``        seconds a report may take in all (one attempt)
==============================  ===========  ==================================================
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


def default_token_file() -> Path:
    """``admin.token`` in the data dir of a ``tunecache serve`` on this machine
    (``$TUNECACHE_DATA_DIR``, else ``$XDG_DATA_HOME/tunecache`` or ``~/.local/share/tunecache``)."""
    data_dir = os.environ.get("TUNECACHE_DATA_DIR") or os.path.join(
        os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share"), "tunecache")
    return Path(data_dir) / "admin.token"


class ClientSettings(BaseSettings):
    """Settings of a pod's tunecache client (see the module docstring for the variables)."""

    model_config = SettingsConfigDict(env_prefix="TUNECACHE_", extra="ignore")

    url: str | None = None
    token: SecretStr | None = None
    connect_timeout: float = Field(default=5.0, gt=0, le=3600)
    read_timeout: float = Field(default=30.0, gt=0, le=3600)
    total_timeout: float = Field(default=120.0, gt=0, le=86400)
    attempts: int = Field(default=3, gt=0, le=100)
    max_retry_after: float = Field(default=30.0, ge=0, le=3600)
    install_deadline: float = Field(default=30.0, gt=0, le=3600)
    jit: bool = True
    push_back: bool = False
    dtype: str = "auto"
    quantization: str = "auto"
    environment_file: Path | None = None
    token_file: Path = Field(default_factory=default_token_file)
    ca_bundle: Path | None = None
    allow_insecure: bool = False
    trusted_keys: str | None = None
    report: bool = True
    report_timeout: float = Field(default=2.0, gt=0, le=60)

    def resolved_token(self) -> str | None:
        """``token``, else the first line of ``token_file`` when that file exists, else ``None``.

        Raises:
            ValueError: ``token_file`` exists but cannot be read, is empty or is not text.
        """
        if self.token is not None:
            return self.token.get_secret_value()
        where = f"TUNECACHE_TOKEN_FILE={str(self.token_file)!r}"
        try:
            text = self.token_file.read_text(encoding="ascii").strip()
        except FileNotFoundError:
            return None
        except UnicodeDecodeError:
            raise ValueError(f"{where}: not a token (the file is not ASCII text)") from None
        except OSError as exc:
            raise ValueError(f"{where}: cannot read it: {exc.strerror}") from None
        if not text:
            raise ValueError(f"{where}: the file is empty")
        return text.splitlines()[0].strip()

    @field_validator("token")
    @classmethod
    def _token_fits_a_header(cls, token: SecretStr | None) -> SecretStr | None:
        value = token.get_secret_value() if token is not None else None
        if value == "":  # never "no token": that would fall back to the token file (an admin's, on a server's machine)
            raise ValueError(EMPTY_TOKEN)
        if value is not None and not (value.isascii() and value.isprintable() and " " not in value and value):
            raise ValueError("must be printable ASCII without spaces (it is sent in an HTTP header)")
        return token


#: Why an empty token is refused (the CLI exits 13 with it).
EMPTY_TOKEN = ("is set but empty: an empty token is refused, never taken as no token (which would fall back to "
               "TUNECACHE_TOKEN_FILE or a local server's admin.token); unset it, or give a token")


def load_client_settings(**overrides: object) -> ClientSettings:
    """The environment's settings with ``overrides`` (``None`` values are ignored).

    Raises:
        ValueError: one line naming the variable and what is wrong with it, e.g.
            ``TUNECACHE_ATTEMPTS='x': Input should be a valid integer``.
    """
    given = {name: value for name, value in overrides.items() if value is not None}
    try:
        return ClientSettings(**given)
    except ValidationError as exc:
        error = exc.errors()[0]
        name = str(error["loc"][0]) if error["loc"] else "?"
        shown_input = "<hidden>" if name == "token" else repr(error.get("input"))
        shown = f"TUNECACHE_{name.upper()}={shown_input}" if name not in given else f"{name}={shown_input}"
        raise ValueError(f"{shown}: {error['msg']}") from None
