"""Pod-side settings, read from ``TUNECACHE_*`` environment variables (pydantic-settings).

One :class:`ClientSettings` serves the CLI, the Python API and the vLLM plugin alike:

==============================  ===========  ==================================================
variable                        default      meaning
==============================  ===========  ==================================================
``TUNECACHE_URL``               (none)       the tunecache server, e.g. ``http://tunecache:8321``
``TUNECACHE_TOKEN``             (none)       sent as ``Authorization: Bearer <token>``
``TUNECACHE_CONNECT_TIMEOUT``   ``5``        seconds to connect
``TUNECACHE_READ_TIMEOUT``      ``30``       seconds to wait for each read
``TUNECACHE_TOTAL_TIMEOUT``     ``120``      seconds one attempt may take in all
``TUNECACHE_ATTEMPTS``          ``3``        tries per request for transient failures
``TUNECACHE_MAX_RETRY_AFTER``   ``30``       most seconds a server's ``Retry-After`` is obeyed
``TUNECACHE_JIT``               ``true``     plugin: also install the run's JIT modules
``TUNECACHE_PUSH_BACK``         ``false``    plugin: upload a pod's own tuning after a miss
``TUNECACHE_DTYPE``             ``auto``     plugin: the key's dtype (vLLM's ``--dtype``)
``TUNECACHE_QUANTIZATION``      ``auto``     plugin: the key's quantization
``TUNECACHE_ENVIRONMENT_FILE``  (none)       plugin: environment from this file, not detected
==============================  ===========  ==================================================
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


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
    jit: bool = True
    push_back: bool = False
    dtype: str = "auto"
    quantization: str = "auto"
    environment_file: Path | None = None

    @field_validator("token")
    @classmethod
    def _token_fits_a_header(cls, token: SecretStr | None) -> SecretStr | None:
        value = token.get_secret_value() if token is not None else None
        if value is not None and not (value.isascii() and value.isprintable() and " " not in value and value):
            raise ValueError("must be printable ASCII without spaces (it is sent in an HTTP header)")
        return token


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
