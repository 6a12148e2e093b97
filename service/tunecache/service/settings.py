"""Service settings, read from ``TUNECACHE_*`` environment variables (pydantic-settings)."""

from __future__ import annotations

import os
from pathlib import Path

from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def _default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "tunecache"


class Settings(BaseSettings):
    """Configuration of one service process.

    Environment variables (prefix ``TUNECACHE_``):

    * ``TUNECACHE_DATABASE_URL``: SQLAlchemy URL. Default: SQLite file
      ``<data_dir>/tunecache.db``. PostgreSQL: ``postgresql+psycopg://user@host/db``.
    * ``TUNECACHE_DATA_DIR``: where the default SQLite file lives
      (default ``$XDG_DATA_HOME/tunecache`` or ``~/.local/share/tunecache``).
    * ``TUNECACHE_MAX_UPLOAD_BYTES``: largest request body accepted (HTTP 413 above it).
    * ``TUNECACHE_HOST`` / ``TUNECACHE_PORT``: where ``tunecache serve`` listens.
    * ``TUNECACHE_WORKER``: ``auto`` (run the job worker when this node has a CUDA GPU),
      ``on`` (refuse to start without one) or ``off`` (lookups only).
    * ``TUNECACHE_LEASE_SECONDS``: a claimed job's lease, renewed every third of it.
    * ``TUNECACHE_JOB_TIMEOUT_SECONDS``: the tuner child is killed after this long.
    * ``TUNECACHE_JOB_MAX_ATTEMPTS``: claims of one job before it is failed.
    * ``TUNECACHE_WORKER_POLL_SECONDS``: idle worker's wait between claim attempts.
    """

    model_config = SettingsConfigDict(env_prefix="TUNECACHE_", extra="ignore")

    database_url: str | None = None
    data_dir: Path = Field(default_factory=_default_data_dir)
    max_upload_bytes: int = Field(default=256 * 1024 * 1024, gt=0)
    host: str = "127.0.0.1"
    port: int = Field(default=8321, gt=0, lt=65536)
    worker: Literal["auto", "on", "off"] = "auto"
    lease_seconds: float = Field(default=60.0, gt=0)
    job_timeout_seconds: float = Field(default=3600.0, gt=0)
    job_max_attempts: int = Field(default=3, gt=0)
    worker_poll_seconds: float = Field(default=2.0, gt=0)

    def resolved_database_url(self) -> str:
        """The database URL; the SQLite default is ``sqlite:///<data_dir>/tunecache.db``."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{self.data_dir / 'tunecache.db'}"
