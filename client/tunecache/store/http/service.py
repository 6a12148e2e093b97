"""The service itself (``/v1/health``, ``/v1/whoami``): whether it is well, which version it
is, and who it takes the caller for (``tunecache status``)."""

from __future__ import annotations

from tunecache.store.http import routes
from tunecache.store.http.routes import calls
from tunecache.store.http.transport import Transport
from tunecache.contract import Health
from tunecache.contract.tokens import WhoAmI


class ServiceClient(Transport):
    """What a tunecache server says of itself and of the caller's token."""

    @property
    def has_token(self) -> bool:
        """Whether this client sends a token (:attr:`token_source` says whose)."""
        return bool(self._connection_options.get("token"))

    @calls(routes.HEALTH)
    def health(self) -> Health:
        """``GET /v1/health`` (anyone): ``ok`` or ``degraded``; with a token, the problems,
        the database and its schema revision.

        Raises:
            ServerUnreachable, ServerError.
        """
        return self._answer(self._request(*routes.HEALTH.call()), Health)

    @calls(routes.WHOAMI)
    def whoami(self) -> WhoAmI:
        """``GET /v1/whoami`` (anyone): the name and scope the service reads the token sent as
        (``anonymous`` for none, or one it does not know), and its version.

        Raises:
            ServerError: 404 from a server older than the route.
            ServerUnreachable.
        """
        return self._answer(self._request(*routes.WHOAMI.call()), WhoAmI)
