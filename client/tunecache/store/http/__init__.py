"""HTTP client of the tunecache service (httpx): the HTTP implementation of
:class:`tunecache.store.TuningStore`. Answers are the contract's models
(:mod:`tunecache.contract`), never dicts; failures are the typed errors of
:mod:`tunecache.store`, which a CLI maps to exit codes.

Laid out as Prefect's ``client/orchestration``: one transport
(:mod:`~tunecache.store.http.transport`: the connection, timeouts and the install
deadline, retries, body bounds, what a failure is called) and one client per API resource,
each a :class:`~tunecache.store.http.transport.Transport` with that resource's methods:
:mod:`~tunecache.store.http.runs` (lookup, history, record, promote, pin),
:mod:`~tunecache.store.http.artifacts`, :mod:`~tunecache.store.http.reports` (the fleet
view and install reports), :mod:`~tunecache.store.http.jobs`,
:mod:`~tunecache.store.http.workers`, :mod:`~tunecache.store.http.tokens`,
:mod:`~tunecache.store.http.audit` and :mod:`~tunecache.store.http.service` (health, whoami). :class:`TunecacheClient` is all of them over one
connection, and what every caller uses.
"""

from __future__ import annotations

from typing import Any

from tunecache.store.http.artifacts import ArtifactsClient
from tunecache.store.http.audit import AuditClient
from tunecache.store.http.jobs import JobsClient
from tunecache.store.http.reports import ReportsClient, reports_enabled_by_environment
from tunecache.store.http.runs import RunsClient
from tunecache.store.http.service import ServiceClient
from tunecache.store.http.tokens import TokensClient
from tunecache.store.http.answers import retry_after_seconds
from tunecache.store.http.transport import (
    DEFAULT_ATTEMPTS,
    DEFAULT_CONNECT_TIMEOUT_S,
    DEFAULT_INSTALL_DEADLINE_S,
    DEFAULT_MAX_ANSWER_BYTES,
    DEFAULT_MAX_RETRY_AFTER_S,
    DEFAULT_READ_TIMEOUT_S,
    DEFAULT_REPORT_TIMEOUT_S,
    DEFAULT_TOTAL_TIMEOUT_S,
    KEEPALIVE_EXPIRY_S,
    InsecureTransport,
    Transport,
    max_answer_bytes,
)
from tunecache.store.http.workers import WorkersClient
from tunecache.store.http.settings import ConnectionSettings
from tunecache.store import (
    AnswerTooLarge,
    ArtifactCorrupt,
    DownloadTruncated,
    InstallDeadlineExceeded,
    JobConflictError,
    ServerError,
    ServerUnreachable,
)

__all__ = [
    "DEFAULT_ATTEMPTS", "DEFAULT_CONNECT_TIMEOUT_S", "DEFAULT_INSTALL_DEADLINE_S", "DEFAULT_MAX_ANSWER_BYTES",
    "DEFAULT_MAX_RETRY_AFTER_S", "DEFAULT_READ_TIMEOUT_S", "DEFAULT_REPORT_TIMEOUT_S", "DEFAULT_TOTAL_TIMEOUT_S",
    "KEEPALIVE_EXPIRY_S", "AnswerTooLarge", "ArtifactCorrupt", "DownloadTruncated", "InsecureTransport",
    "InstallDeadlineExceeded", "JobConflictError", "ServerError", "ServerUnreachable", "Transport", "TunecacheClient",
    "max_answer_bytes", "reports_enabled_by_environment", "retry_after_seconds",
]


class TunecacheClient(RunsClient, ArtifactsClient, ReportsClient, JobsClient, WorkersClient, TokensClient, AuditClient,
                      ServiceClient):
    """Talks to one tunecache server, every API resource over one connection; implements
    :class:`tunecache.store.TuningStore`.

    Made with the :class:`~tunecache.store.http.transport.Transport`'s arguments (the
    server's URL, timeouts, attempts, the install deadline, token and TLS) and the
    :class:`~tunecache.store.http.reports.ReportsClient`'s (``reports``,
    ``report_timeout_s``); raises as they say. A client is one thread's at a time.
    """

    @classmethod
    def from_settings(cls, settings: ConnectionSettings, url: str | None = None, **kwargs: Any) -> "TunecacheClient":
        """A client for ``url`` (default ``settings.url``) with the settings' timeouts,
        attempts, install deadline, token and its source (:meth:`ConnectionSettings.resolved_credential`) and TLS
        settings.

        Raises:
            ValueError: no URL given or set (``TUNECACHE_URL``), or a bad one; a token file
                that cannot be read; see the class.
        """
        base_url = url or settings.url
        if not base_url:
            raise ValueError("no tunecache server given: pass --server URL or set TUNECACHE_URL")
        credential = settings.resolved_credential(base_url)
        return cls(
            base_url,
            connect_timeout_s=settings.connect_timeout,
            read_timeout_s=settings.read_timeout,
            total_timeout_s=settings.total_timeout,
            attempts=settings.attempts,
            max_retry_after_s=settings.max_retry_after,
            install_deadline_s=settings.install_deadline,
            token=credential.token,
            token_source=credential.source,
            ca_bundle=settings.ca_bundle,
            allow_insecure=settings.allow_insecure,
            reports=settings.report,
            report_timeout_s=settings.report_timeout,
            **kwargs,
        )
