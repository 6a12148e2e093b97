"""The audit log (``/v1/audit``, admin): every write, newest first."""

from __future__ import annotations

from tunecache.store.http import routes
from tunecache.store.http.routes import calls
from tunecache.store.http.transport import Transport
from tunecache.contract import AuditPage


class AuditClient(Transport):
    """The audit log of a tunecache server (:mod:`tunecache.service.routes.audit`)."""

    @calls(routes.AUDIT)
    def list_audit_events(self, limit: int = 100, before: int | None = None) -> AuditPage:
        """``GET /v1/audit`` (admin): writes, newest first."""
        params = {"limit": limit} | ({"before": before} if before else {})
        return self._answer(self._request(*routes.AUDIT.call(), params=params), AuditPage)
