"""Who sent a request: the one place the service decides a client's address and scheme.

A request's client is the connection's peer, unless that peer is a proxy named in
``TUNECACHE_TRUSTED_PROXIES`` (addresses and networks; none by default): then it is the
address that proxy wrote into ``X-Forwarded-For`` (the nearest one that is not itself a
named proxy), and the scheme its ``X-Forwarded-Proto``. From anyone else, loopback
included, the two headers are ignored: a process on the service's own machine is one
client, however many addresses it writes there.

:class:`TrustedProxyHeaders` applies this once per request, before any route runs (it is
uvicorn's own ``ProxyHeadersMiddleware``, given only the named proxies: ``tunecache serve``
turns uvicorn's ``proxy_headers`` off, so its default trust of 127.0.0.1 and its
``FORWARDED_ALLOW_IPS`` variable play no part); everything after it reads
:func:`client_address` (a pod report's source, :mod:`tunecache.service.report_bounds`) and
``request.url.scheme`` (the dashboard's ``Secure`` cookies). The per-address connection
bound (:mod:`tunecache.service.connections`) counts connections, which come from the peer
itself: the proxy's address behind a proxy, by design.
"""

from __future__ import annotations

import ipaddress

from starlette.requests import Request
from starlette.types import ASGIApp
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware


def parse_trusted_proxies(text: str) -> list[str]:
    """The proxies of ``TUNECACHE_TRUSTED_PROXIES`` (comma-separated addresses and networks,
    ``10.0.0.5``, ``10.0.0.0/24``, ``fd00::/64``), each in its normal form; blank: none.

    Raises:
        ValueError: an entry that is neither an address nor a network (``*`` too: every
            proxy must be named), naming it.
    """
    proxies = []
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            continue
        try:
            proxies.append(str(ipaddress.ip_network(entry, strict=False)) if "/" in entry
                           else str(ipaddress.ip_address(entry)))
        except ValueError:
            raise ValueError(f"{entry!r} is not an IP address or network (name each proxy; `*` is not accepted)") from None
    return proxies


class TrustedProxyHeaders(ProxyHeadersMiddleware):
    """Sets a request's client and scheme from ``X-Forwarded-For`` and ``X-Forwarded-Proto``
    when, and only when, its peer is one of ``proxies`` (:func:`parse_trusted_proxies`;
    uvicorn's ``ProxyHeadersMiddleware``, whose walk of ``X-Forwarded-For`` from the right
    skips the named proxies). With no proxies it changes nothing."""

    def __init__(self, app: ASGIApp, proxies: list[str]):
        super().__init__(app, trusted_hosts=list(proxies))
        self.proxies = list(proxies)

    async def __call__(self, scope, receive, send) -> None:
        if not self.proxies:  # uvicorn's would trust nothing either; skip its header scan
            return await self.app(scope, receive, send)
        return await super().__call__(scope, receive, send)


def client_address(request: Request) -> str | None:
    """The address of who sent ``request`` (see the module), or ``None`` when unknown."""
    return request.client.host if request.client else None
