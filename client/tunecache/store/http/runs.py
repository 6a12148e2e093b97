"""Tuning runs (``/v1/tunings``): the lookup, the history and its CSV export, one run and
the diff of two, recording a run and its verification, promoting and pinning a run."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import httpx
from pydantic import ValidationError

from tunecache.store.http.answers import answer_detail, body_detail, json_object
from tunecache.store.http import routes
from tunecache.store.http.routes import calls
from tunecache.store.http.failures import Transient
from tunecache.store.http.transport import Transport
from tunecache.contract import (
    EnvironmentMetadata,
    LookupMiss,
    LookupRequest,
    PromoteRequest,
    RunSignature,
    RunVerification,
    TuningKey,
    TuningRunCreate,
    TuningRunDiff,
    TuningRunPage,
    TuningRunQuery,
    TuningRunRead,
    RunRetired,
)
from tunecache.store import NoCompatibleTuning, ServerError


def _names_dependencies(response: httpx.Response) -> bool:
    """Whether a 422's body (FastAPI's list of errors) names the lookup's ``dependencies``."""
    try:
        errors = response.json().get("detail")
    except (ValueError, AttributeError):
        return False
    return isinstance(errors, list) and any(
        isinstance(e, dict) and "dependencies" in (e.get("loc") or ()) for e in errors)


class RunsClient(Transport):
    """The tuning runs of a tunecache server (:mod:`tunecache.service.routes.tunings`)."""

    @calls(routes.LOOKUP)
    def lookup(self, key: TuningKey, environment: EnvironmentMetadata, variant: str | None = None,
               dependencies: Mapping[str, str] | None = None) -> TuningRunRead:
        """``POST /v1/tunings/lookup``: the current tuning run for this key and environment
        (with ``variant``: that engine variant's current run where it has one, else the key's;
        with ``dependencies``, this pod's package versions
        (:func:`tunecache.formats.dependencies.installed_versions`): never a run of another
        image where this pod's image has one of its own).

        Raises:
            NoCompatibleTuning: 404, with the closest stored tunings and their differences.
            InstallDeadlineExceeded: inside :meth:`deadline_scope`, the deadline passed first.
            ServerUnreachable, ServerError.
        """
        versions = {name: str(version)[:64] for name, version in (dependencies or {}).items()} or None
        request = LookupRequest(key=key, environment=environment, variant=variant, dependencies=versions)
        response = self._request(*routes.LOOKUP.call(), content=request.model_dump_json(exclude_none=True),
                                 headers={"Content-Type": "application/json"})
        if versions and response.status_code == 422 and _names_dependencies(response):
            # a service before images refuses a field it does not know: asked again as before them
            request = request.model_copy(update={"dependencies": None})
            response = self._request(*routes.LOOKUP.call(), content=request.model_dump_json(exclude_none=True),
                                     headers={"Content-Type": "application/json"})
        if response.status_code == 404:
            try:
                miss = LookupMiss.model_validate_json(response.content)
            except ValidationError:
                raise ServerError(404, answer_detail(response)) from None
            raise NoCompatibleTuning(miss)
        return self._answer(response, TuningRunRead)

    @calls(routes.LIST_RUNS)
    def list_runs(self, query: TuningRunQuery = TuningRunQuery()) -> TuningRunPage:
        """``GET /v1/tunings``: one page of the tuning history, newest first, filtered as
        ``query`` says (any key or environment field, status, trigger, ``since``/``until``,
        ``current_only``); from ``query.cursor`` (a page's ``next_cursor``) or ``offset``.

        Raises:
            ServerError: 422 naming an invalid parameter; ServerUnreachable.
        """
        params = query.model_dump(mode="json", exclude_defaults=True, exclude={"format"})
        return self._answer(self._request(*routes.LIST_RUNS.call(), params=params), TuningRunPage)

    def iter_runs(self, query: TuningRunQuery = TuningRunQuery()) -> Iterator[TuningRunRead]:
        """Every run matching ``query``'s filters, newest first, page after page
        (``query.limit`` per request) by cursor: each run once, also while runs are
        recorded meanwhile (those come before the first page and are not listed).

        Raises:
            as :meth:`list_runs`.
        """
        page = self.list_runs(query)
        while True:
            yield from page.items
            if page.next_cursor is None:
                return
            page = self.list_runs(query.model_copy(update={"cursor": page.next_cursor, "offset": 0}))

    @calls(routes.LIST_RUNS)
    def export_runs_csv(self, query: TuningRunQuery, write: Callable[[bytes], Any]) -> None:
        """``GET /v1/tunings?format=csv``: every run matching ``query``'s filters (from its
        cursor on) as CSV, header first, handed to ``write`` part by part as it arrives
        (never whole in memory). One attempt: a retry would repeat what was written.

        Raises:
            ServerError: 422 naming an invalid parameter, other error statuses;
            ServerUnreachable (also when the answer stops short).
        """
        params = query.model_dump(mode="json", exclude_defaults=True, exclude={"limit", "offset", "format"})
        params["format"] = "csv"

        def read(response: httpx.Response, deadline: float) -> None:
            if response.is_error:
                raise self.error_of(response.status_code, body_detail(self._read_body(response, deadline)))
            self._read_body(response, deadline, sink=write)

        try:
            self._exchange(*routes.LIST_RUNS.call(), read, params=params)
        except Transient as transient:
            raise transient.error from None

    @calls(routes.GET_RUN)
    def get_run(self, run_id: int) -> TuningRunRead:
        """``GET /v1/tunings/{id}``: one run. Raises ServerError (404 when there is none)."""
        return self._answer(self._request(*routes.GET_RUN.call(run_id=run_id)), TuningRunRead)

    @calls(routes.DIFF_RUNS)
    def diff_runs(self, run_a: int, run_b: int) -> TuningRunDiff:
        """``GET /v1/tunings/{run_a}/diff/{run_b}``: which entries of FlashInfer's autotune
        file run ``run_b`` added, removed or changed tactic in against run ``run_a``, with
        the recorded times (ms), margins and regression flags, and the counts.

        Raises:
            ServerError: 404 naming the missing run; 422 when a run has no readable
                FlashInfer autotune file (the detail says which and why).
            ServerUnreachable.
        """
        return self._answer(self._request(*routes.DIFF_RUNS.call(run_a=run_a, run_b=run_b)), TuningRunDiff)

    @calls(routes.RECORD_RUN)
    def record_run(self, run: TuningRunCreate, force: bool = False, trusted_signature: bool = False) -> TuningRunRead:
        """``POST /v1/tunings``: record a run whose artifacts were uploaded first; ``force``
        (admin): past the service's promotion policy; ``trusted_signature``: only if the run's
        signature checks against the service's trusted keys (a run carried in from another
        service), else 409 and nothing is stored. The answer's ``held`` says why a run did not
        become current.

        Raises:
            ServerError: 422 naming the field, or the artifacts never uploaded; 403 ``force``
                without an admin token; 409 ``trusted_signature`` and the service does not
                trust the signature; other errors.
            ServerUnreachable.
        """
        method, path = routes.RECORD_RUN.call()
        flags = [name for name, on in (("force", force), ("trusted_signature", trusted_signature)) if on]
        response = self._request(method, path + ("?" + "&".join(f"{f}=true" for f in flags) if flags else ""),
                                 content=run.model_dump_json(),
                                 headers={"Content-Type": "application/json"})
        if response.status_code == 422:
            body = json_object(response) or {}
            if isinstance(body.get("missing"), list):
                error = ServerError(422, answer_detail(response))
                error.missing = [str(sha) for sha in body["missing"]]
                raise error
        return self._answer(response, TuningRunRead)

    @calls(routes.RECORD_VERIFICATION)
    def record_verification(self, run_id: int, verification: RunVerification) -> TuningRunRead:
        """``PUT /v1/tunings/{id}/verification`` (tune): store a run's verification boot.

        Raises:
            ServerError: 404 no such run; 409 it did not succeed; 401/403 without a tune token.
            ServerUnreachable.
        """
        response = self._request(*routes.RECORD_VERIFICATION.call(run_id=run_id), content=verification.model_dump_json(),
                                 headers={"Content-Type": "application/json"})
        return self._answer(response, TuningRunRead)

    @calls(routes.PROMOTE_RUN)
    def promote_run(self, run_id: int, signature: RunSignature | None = None) -> TuningRunRead:
        """``POST /v1/tunings/{id}/promote`` (admin): make the run current for its key and
        environment (roll back to it, or take a run the promotion policy held); with
        ``signature``, the run's manifest signed anew (pods then take it as the newest).

        Raises:
            ServerError: 404 no such run; 409 it cannot be current (the detail says why);
                401/403 without an admin token.
            ServerUnreachable.
        """
        body = PromoteRequest(signature=signature).model_dump_json() if signature is not None else None
        response = self._request(*routes.PROMOTE_RUN.call(run_id=run_id), content=body,
                                 headers={"Content-Type": "application/json"} if body else None)
        return self._answer(response, TuningRunRead)

    @calls(routes.PIN_RUN)
    def pin_run(self, run_id: int) -> TuningRunRead:
        """``PUT /v1/tunings/{id}/pin`` (admin): pin a run, so that retention
        (``TUNECACHE_RUN_RETENTION``) never deletes it. Idempotent.

        Raises:
            ServerError: 404 no such run (or one retention already deleted); 401/403 without
                an admin token.
            ServerUnreachable.
        """
        return self._answer(self._request(*routes.PIN_RUN.call(run_id=run_id)), TuningRunRead)

    @calls(routes.UNPIN_RUN)
    def unpin_run(self, run_id: int) -> TuningRunRead:
        """``DELETE /v1/tunings/{id}/pin`` (admin): unpin a run; retention keeps or deletes it
        as any other from its next pass. Idempotent.

        Raises:
            ServerError: 404 no such run; 401/403 without an admin token.
            ServerUnreachable.
        """
        return self._answer(self._request(*routes.UNPIN_RUN.call(run_id=run_id)), TuningRunRead)

    @calls(routes.RETIRE_RUN)
    def retire_run(self, run_id: int) -> RunRetired:
        """``POST /v1/tunings/{id}/retire`` (admin): take a run out of use for good (never
        current, never served, kept for history). Idempotent. ``current_run_id`` of the answer:
        the run current for its key and environment in its place (``None``: none).

        Raises:
            ServerError: 404 no such run; 401/403 without an admin token.
            ServerUnreachable.
        """
        return self._answer(self._request(*routes.RETIRE_RUN.call(run_id=run_id)), RunRetired)
