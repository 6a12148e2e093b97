"""The service's routes the HTTP store calls, declared once (as Prefect's client declares its
``ServerRoutes``): each :class:`Route` is a method and a path as the service's router spells
it (``/v1/tunings/{run_id}/pin``); a client method builds its request from its routes
(:meth:`Route.call`) and says which it calls (:func:`calls`).

``tests/unit/client/store/test_http_routes.py`` matches them with the routes of the service's
app: a route the service does not serve (a mistyped path or method) fails, and so does a route
of the service that no client method calls.
"""

from __future__ import annotations

import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar


@dataclass(frozen=True)
class Route:
    """A route of the service: its HTTP method and its path template."""

    method: str
    template: str

    def call(self, **params: object) -> tuple[str, str]:
        """``(method, path)`` with the template's parameters filled in from ``params``, which
        must name each of them and nothing else.

        Raises:
            TypeError: a parameter missing or one the template does not have.
        """
        names = {name for _, name, _, _ in string.Formatter().parse(self.template) if name}
        if names != set(params):
            raise TypeError(f"{self.method} {self.template} takes {sorted(names)}, not {sorted(params)}")
        return self.method, self.template.format(**params)

    def __str__(self) -> str:
        return f"{self.method} {self.template}"


HEALTH = Route("GET", "/v1/health")
WHOAMI = Route("GET", "/v1/whoami")
LOOKUP = Route("POST", "/v1/tunings/lookup")
LIST_RUNS = Route("GET", "/v1/tunings")
RECORD_RUN = Route("POST", "/v1/tunings")
GET_RUN = Route("GET", "/v1/tunings/{run_id}")
DIFF_RUNS = Route("GET", "/v1/tunings/{run_a}/diff/{run_b}")
RECORD_VERIFICATION = Route("PUT", "/v1/tunings/{run_id}/verification")
PROMOTE_RUN = Route("POST", "/v1/tunings/{run_id}/promote")
PIN_RUN = Route("PUT", "/v1/tunings/{run_id}/pin")
UNPIN_RUN = Route("DELETE", "/v1/tunings/{run_id}/pin")
RETIRE_RUN = Route("POST", "/v1/tunings/{run_id}/retire")
GET_ARTIFACT = Route("GET", "/v1/artifacts/{sha256}")
HAS_ARTIFACT = Route("HEAD", "/v1/artifacts/{sha256}")
PUT_ARTIFACT = Route("PUT", "/v1/artifacts/{sha256}")
CREATE_JOB = Route("POST", "/v1/tuning-jobs")
LIST_JOBS = Route("GET", "/v1/tuning-jobs")
GET_JOB = Route("GET", "/v1/tuning-jobs/{job_id}")
CANCEL_JOB = Route("DELETE", "/v1/tuning-jobs/{job_id}")
LIST_WORKERS = Route("GET", "/v1/workers")
CREATE_TOKEN = Route("POST", "/v1/tokens")
LIST_TOKENS = Route("GET", "/v1/tokens")
REVOKE_TOKEN = Route("DELETE", "/v1/tokens/{name}")
TOKEN_PROOF = Route("GET", "/v1/token-proof")
AUDIT = Route("GET", "/v1/audit")
REPORT = Route("POST", "/v1/reports")
FLEET = Route("GET", "/v1/fleet")

Function = TypeVar("Function", bound=Callable)


def calls(*routes: Route) -> Callable[[Function], Function]:
    """Declare the routes a client method (or function) calls, as ``__routes__``."""
    def declare(function: Function) -> Function:
        function.__routes__ = routes
        return function
    return declare
