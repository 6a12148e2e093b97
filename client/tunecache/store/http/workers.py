"""GPU job workers (``/v1/workers``): which are live, and for which GPU, arch and vLLM."""

from __future__ import annotations

from tunecache.store.http import routes
from tunecache.store.http.routes import calls
from tunecache.store.http.transport import Transport
from tunecache.contract import WorkerList


class WorkersClient(Transport):
    """The job workers a tunecache server has seen."""

    @calls(routes.LIST_WORKERS)
    def workers(self, gpu_name: str | None = None, arch: str | None = None) -> WorkerList:
        """``GET /v1/workers``: the GPU job workers seen in the last day (of ``gpu_name`` and
        ``arch`` when given), each with ``live``; :meth:`WorkerList.live_for` picks those
        that would take a job of a key.

        Raises:
            ServerUnreachable, ServerError (404 from a server older than the route).
        """
        params = {k: v for k, v in {"gpu_name": gpu_name, "arch": arch}.items() if v is not None}
        return self._answer(self._request(*routes.LIST_WORKERS.call(), params=params), WorkerList)
