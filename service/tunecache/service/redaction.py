"""What reads show, and to whom: every read route and dashboard page passes the rows it
answers with through here, one function per concern.

* **Identities** (:func:`shows_identities`): the names of tokens (``recorded_by``,
  ``cancelled_by``) and of machines (a run's ``node``: a tuner node's or a pod's host name; a
  job's ``worker`` and the workers' names: ``host:pid``; a report's ``pod``), and a job's log
  tail, which names hosts, addresses and paths of its node. Only an ``admin`` token sees
  them: they are what the token list and the audit log (admin routes) already name, and a
  ``read``, ``push`` or ``tune`` token is held by pods, dashboards and GPU nodes, none of
  which needs another machine's name or a token's to do its work. Others get
  :data:`HIDDEN` in their place (the log tail: ``None``), so a row still says that it had
  one. ``TUNECACHE_READS_SHOW_IDENTITIES`` shows them to every reader.
* **Engine arguments** (:func:`engine_args_for_readers`): shown to every reader, admins
  included, only as far as the contract's allow-list takes them (rows stored before the
  doors checked them may hold anything a client once sent).

A lookup (``POST /v1/tunings/lookup``) is a pod's answer, cached as bytes for every caller
alike: it carries no identities unless the setting shows them to everyone
(:func:`run_for_readers` with ``identities`` from the setting alone).

Each function copies what it changes (``model_copy``) and reads each row once: O(rows) on
the request path, no database work.
"""

from __future__ import annotations

from typing import Any

from tunecache.contract import (FleetView, allowed_engine_args, FleetVariant, Scope, TuningJobPage, TuningJobRead, TuningRunPage, TuningRunRead,
                                WorkerList)
from tunecache.service.settings import Settings
from tunecache.service.tokens import Caller

#: What a reader below :data:`IDENTITY_SCOPE` sees in place of a token's or a machine's name.
HIDDEN = "(hidden)"
#: The scope that sees identities (see the module).
IDENTITY_SCOPE = Scope.ADMIN


def shows_identities(caller: Caller, settings: Settings) -> bool:
    """Whether ``caller`` is shown token and host names: an ``admin`` token, or anyone with
    ``TUNECACHE_READS_SHOW_IDENTITIES``."""
    return settings.reads_show_identities or (caller.scope is not None and caller.scope.includes(IDENTITY_SCOPE))


def _hidden(value: str | None) -> str | None:
    return None if value is None else HIDDEN


def engine_args_for_readers(args: Any) -> dict[str, Any] | None:
    """The engine arguments (``vllm.LLM`` keywords) a read shows of ``args``: exactly those the
    contract's allow-list takes today (:func:`tunecache.contract.allowed_engine_args`: each
    allowed name with a value in its bounds, of a nested object its allowed fields), whatever
    a row stored before the doors checked them holds; ``None`` when none is left (or ``args``
    is not an object)."""
    return allowed_engine_args(args) or None


def run_for_readers(run: TuningRunRead, identities: bool) -> TuningRunRead:
    """A run as a read shows it: its summary's ``engine_args`` through
    :func:`engine_args_for_readers`; without ``identities``, ``node`` and ``recorded_by``
    :data:`HIDDEN`."""
    update: dict[str, Any] = {}
    if "engine_args" in run.summary:
        summary = {**run.summary, "engine_args": engine_args_for_readers(run.summary["engine_args"])}
        if summary["engine_args"] is None:
            del summary["engine_args"]
        update["summary"] = summary
    if not identities:
        update["node"], update["recorded_by"] = _hidden(run.node), _hidden(run.recorded_by)
    return run.model_copy(update=update) if update else run


def runs_page_for_readers(page: TuningRunPage, identities: bool) -> TuningRunPage:
    """A page of the history with each run as :func:`run_for_readers` shows it."""
    return page.model_copy(update={"items": [run_for_readers(run, identities) for run in page.items]})


def job_for_readers(job: TuningJobRead, identities: bool) -> TuningJobRead:
    """A tuning job as a read shows it: its ``engine_args`` through
    :func:`engine_args_for_readers`; without ``identities``, ``worker`` and ``cancelled_by``
    :data:`HIDDEN` and no ``log_tail``."""
    update: dict[str, Any] = {"engine_args": engine_args_for_readers(job.engine_args)}
    if not identities:
        update.update(worker=_hidden(job.worker), cancelled_by=_hidden(job.cancelled_by), log_tail=None)
    return job.model_copy(update=update)


def jobs_page_for_readers(page: TuningJobPage, identities: bool) -> TuningJobPage:
    """A page of jobs with each job as :func:`job_for_readers` shows it."""
    return page.model_copy(update={"items": [job_for_readers(job, identities) for job in page.items]})


def workers_for_readers(workers: WorkerList, identities: bool) -> WorkerList:
    """The job workers; without ``identities``, each ``name`` (``host:pid``) :data:`HIDDEN`."""
    if identities:
        return workers
    return workers.model_copy(update={"items": [w.model_copy(update={"name": HIDDEN}) for w in workers.items]})


def _variant_for_readers(variant: FleetVariant) -> FleetVariant:
    return variant.model_copy(update={"engine_args": engine_args_for_readers(variant.engine_args)})


def fleet_for_readers(view: FleetView) -> FleetView:
    """The fleet view with each engine variant's ``engine_args`` through
    :func:`engine_args_for_readers` (it names no token or host: counts only)."""
    keys = [key.model_copy(update={"variants": [_variant_for_readers(v) for v in key.variants]}) if key.variants else key
            for key in view.keys]
    return view.model_copy(update={"keys": keys, "wanted_variants": [_variant_for_readers(v) for v in view.wanted_variants]})


def pod_for_readers(pod: str, identities: bool) -> str:
    """A report's pod (its host name); without ``identities``, :data:`HIDDEN`."""
    return pod if identities else HIDDEN
