"""The fleet (``/v1/fleet``) and pod reports (``/v1/reports``): what pods installed, missed
and want, and the reports they send after each install."""

from __future__ import annotations

import os

from pydantic import TypeAdapter, ValidationError

from tunecache.store.http.answers import answer_detail
from tunecache.store.http import routes
from tunecache.store.http.routes import calls
from tunecache.store.http.transport import DEFAULT_REPORT_TIMEOUT_S, Transport
from tunecache.contract import FLEET_PAGE_DEFAULT, FLEET_PAGE_MAX, FleetView, PodReportCreate


def reports_enabled_by_environment() -> bool:
    """``TUNECACHE_REPORT`` as pydantic reads a boolean (unset: ``True``; a value that is not
    a boolean: ``False``), for clients not made from
    :class:`~tunecache.client.settings.ClientSettings`."""
    value = next((v for k, v in os.environ.items() if k.upper() == "TUNECACHE_REPORT"), None)
    if value is None:
        return True
    try:
        return TypeAdapter(bool).validate_python(value)
    except ValidationError:
        return False


class ReportsClient(Transport):
    """The fleet view and the install reports of a tunecache server
    (:mod:`tunecache.service.routes.reports`).

    Args:
        reports: whether installs made with this client report to the server (see
            :mod:`tunecache.client.report`); ``None``: as ``TUNECACHE_REPORT`` says.
        report_timeout_s: seconds one report may take in all (2 s).
        connection: the :class:`~tunecache.store.http.transport.Transport`'s options.
    """

    def __init__(self, base_url: str, *, reports: bool | None = None,
                 report_timeout_s: float = DEFAULT_REPORT_TIMEOUT_S, **connection):
        super().__init__(base_url, **connection)
        self.reports = reports_enabled_by_environment() if reports is None else reports
        self.report_timeout_s = report_timeout_s

    @calls(routes.FLEET)
    def fleet(self, hours: float = 24, *, limit: int = FLEET_PAGE_DEFAULT, offset: int = 0,
              wanted_limit: int = FLEET_PAGE_DEFAULT, wanted_offset: int = 0) -> FleetView:
        """``GET /v1/fleet``: one page of the fleet view over the last ``hours``: at most
        ``limit`` keys (1-1000) from ``offset`` (0-based) of ``total_keys``, with their
        current runs and hit rates, most reports first; at most ``wanted_limit`` tunings
        pods want (miss reports without a current tuning) from ``wanted_offset`` of
        ``total_wanted``, most pods first. :meth:`fleet_all` walks every page.

        Raises:
            ServerError: 422 naming a bad ``hours``, limit or offset; 404 from a server
                older than the route; ServerUnreachable.
        """
        params = {"hours": hours, "limit": limit, "offset": offset, "wanted_limit": wanted_limit,
                  "wanted_offset": wanted_offset}
        return self._answer(self._request(*routes.FLEET.call(), params=params), FleetView)

    def fleet_all(self, hours: float = 24, page_size: int = FLEET_PAGE_MAX) -> FleetView:
        """The whole fleet view over the last ``hours``: pages of ``page_size`` keys and
        ``page_size`` wanted tunings (both lists in the same requests), request after
        request until both are listed, put into one :class:`FleetView`: ``offset`` 0,
        ``limit`` and ``wanted_limit`` the rows asked for in all, ``since`` and
        ``generated_at`` of the first page, ``total_keys`` and ``total_wanted`` of the last.

        The pages are read one after another, not at one instant: a key whose report count
        changes meanwhile may move between pages; one seen twice is listed once (its first
        row), one that moved to a page already read is missed (then fewer rows than the
        totals).

        Raises:
            as :meth:`fleet`.
        """
        pages = [self.fleet(hours, limit=page_size, wanted_limit=page_size)]
        while (len(pages) * page_size < max(pages[-1].total_keys, pages[-1].total_wanted)
               and (pages[-1].keys or pages[-1].wanted)):
            start = len(pages) * page_size
            pages.append(self.fleet(hours, limit=page_size, offset=start, wanted_limit=page_size, wanted_offset=start))
        keys = {}
        wanted = {}
        for page in pages:
            for row in page.keys:
                keys.setdefault(row.key.key_hash(), row)
            for want in page.wanted:
                wanted.setdefault((want.key.key_hash(), want.environment_hash), want)
        first, last = pages[0], pages[-1]
        asked = len(pages) * page_size
        return FleetView(hours=first.hours, since=first.since, generated_at=first.generated_at,
                         total_keys=last.total_keys, limit=asked, offset=0, keys=list(keys.values()),
                         total_wanted=last.total_wanted, wanted_limit=asked, wanted_offset=0,
                         wanted=list(wanted.values()))

    @calls(routes.REPORT)
    def send_report(self, report: PodReportCreate) -> None:
        """``POST /v1/reports``: tell the server what an install came to (202: taken, stored
        in a batch within the server's ``TUNECACHE_REPORT_FLUSH_SECONDS``). Installs
        send it in the background (:mod:`tunecache.client.report`), through a
        :meth:`reporting_client`.

        Raises:
            ServerError: 422 naming the invalid field, 429 past the server's report rate,
                503 when the server holds too many reports not yet stored, other error
                statuses; ServerUnreachable.
        """
        response = self._request(*routes.REPORT.call(), content=report.model_dump_json(exclude_none=True),
                                 headers={"Content-Type": "application/json"})
        if response.is_error:
            raise self.error_of(response.status_code, answer_detail(response))

    def reporting_client(self) -> "ReportsClient":
        """A client for sending one report from another thread: this client's server,
        token and TLS, one attempt, and every timeout (and its deadline) at
        ``report_timeout_s``. The caller closes it."""
        timeout = self.report_timeout_s
        return type(self)(self.base_url, connect_timeout_s=timeout, read_timeout_s=timeout, total_timeout_s=timeout,
                               attempts=1, max_retry_after_s=0, install_deadline_s=timeout, reports=False,
                               report_timeout_s=timeout, **self._connection_options)
