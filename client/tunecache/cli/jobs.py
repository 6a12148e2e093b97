"""The operator's view of a service's work: ``job list``, ``job show ID``, ``job wait ID``,
``workers`` and ``audit``; registered on the ``tunecache`` app by :func:`register`."""

from __future__ import annotations

import time
from typing import Annotated, Optional

import typer

from tunecache.cli.admin import job_app
from tunecache.cli.client import client_for
from tunecache.cli_kit import ExitCode, ServerOpt, client_errors, fail
from tunecache.cli.text import age, aligned, key_text, printable, when
from tunecache.contract import MAX_ID, JobStatus, TuningJobRead
from tunecache.store import TunecacheError

JsonOpt = Annotated[bool, typer.Option("--json", help="print the API's answer as JSON")]
JobIdArg = Annotated[int, typer.Argument(min=1, max=MAX_ID, help="the job's id (retune and job list print it)")]
#: ``job wait``'s exit code by the job's end state.
END_STATE_CODES = {JobStatus.SUCCEEDED: ExitCode.OK, JobStatus.FAILED: ExitCode.TUNING_FAILED,
                   JobStatus.CANCELLED: ExitCode.JOB_CANCELLED}


def _steps(job: TuningJobRead) -> str:
    return f"{job.stage or '-'}" + (f" {job.step}/{job.total}" if job.step is not None and job.total else "")


def job_list(
    server: ServerOpt,
    status: Annotated[Optional[JobStatus], typer.Option("--status", help="only jobs in this state")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=500, help="jobs per page")] = 50,
    offset: Annotated[int, typer.Option("--offset", min=0, max=MAX_ID, help="jobs before the page")] = 0,
    as_json: JsonOpt = False,
) -> None:
    """Tuning jobs, newest first: id, state, key, stage and step, worker, queued, seconds taken, the run it recorded.

    Worker names are shown to an admin token only. One page of --limit jobs from --offset; the next page's --offset is printed. Exit 0; 4 server unreachable; 5 server error; 13 not authorised.
    """
    with client_for(server) as client:
        try:
            page = client.list_jobs(status, limit=limit, offset=offset)
        except TunecacheError as exc:
            client_errors(exc)
    if as_json:
        typer.echo(page.model_dump_json(indent=2))
        return
    if not page.items:
        typer.echo("no tuning jobs" + (f" {status}" if status else "") + (f" past {offset}" if offset else ""))
        return
    rows = [("ID", "STATUS", "KEY", "STAGE", "WORKER", "QUEUED (UTC)", "SECONDS", "RUN")]
    rows += [(str(j.id), str(j.status), key_text(j.key), _steps(j), j.worker or "-", when(j.created_at),
              "-" if j.duration_s is None else f"{j.duration_s:.1f}", "-" if j.run_id is None else str(j.run_id))
             for j in page.items]
    for line in aligned(rows):
        typer.echo(line)
    following = page.offset + len(page.items)
    more = f"; next page: --offset {following}" if following < page.total else ""
    typer.echo(f"{len(page.items)} of {page.total} job{'' if page.total == 1 else 's'}{more}", err=True)


def _job_lines(job: TuningJobRead) -> list[str]:
    lines = [f"job {job.id}: {job.status}", f"key: {key_text(job.key)}", f"warmup: {job.warmup}",
             f"stage: {_steps(job)}", f"worker: {job.worker or '-'}", f"attempts: {job.attempts}",
             f"queued: {when(job.created_at)}", f"started: {when(job.started_at)}", f"finished: {when(job.finished_at)}"]
    if job.duration_s is not None:
        lines.append(f"seconds: {job.duration_s:.1f}")
    if job.engine_args:
        lines.append(f"engine args: {job.engine_args}")
    if job.run_id is not None:
        lines.append(f"run: {job.run_id} (tunecache show {job.run_id})")
    if job.cancel_requested_at:
        lines.append(f"cancel requested: {when(job.cancel_requested_at)}" + (f" by {job.cancelled_by}" if job.cancelled_by else ""))
    if job.error:
        lines.append(f"error: {job.error}")
    if job.log_tail:
        lines += ["log tail:", *("  " + line for line in job.log_tail.splitlines())]
    return [printable(line) for line in lines]


def job_show(server: ServerOpt, job_id: JobIdArg, as_json: JsonOpt = False) -> None:
    """One tuning job: state, key, stage and step, worker, timings, its run, its error and the tuner's last output (the log to an admin token only).

    Exit 0; 5 when there is no such job; 4 server unreachable; 13 not authorised.
    """
    with client_for(server) as client:
        try:
            job = client.get_job(job_id)
        except TunecacheError as exc:
            client_errors(exc)
    if as_json:
        typer.echo(job.model_dump_json(indent=2))
        return
    for line in _job_lines(job):
        typer.echo(line)


def job_wait(
    server: ServerOpt,
    job_id: JobIdArg,
    timeout: Annotated[float, typer.Option("--timeout", min=0, help="seconds to wait")] = 7200.0,
    poll: Annotated[float, typer.Option("--poll", min=0.05, max=600, help="seconds between polls")] = 2.0,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress line")] = False,
) -> None:
    """Wait for a tuning job to end, with a progress line on a terminal (state, stage, step of total, time waited); then one line of how it ended.

    Exit 0 when it succeeded, 8 when it failed, 16 when it was cancelled, 10 when --timeout passed first (the job goes on); 5 when there is no such job.
    """
    from tunecache.transfer_progress import JobProgress

    deadline = time.monotonic() + timeout
    with client_for(server) as client, JobProgress(quiet=quiet) as progress:
        try:
            job = client.get_job(job_id)
            while job.status.active:
                progress.job(job)
                if time.monotonic() + poll > deadline:
                    fail(ExitCode.WAIT_TIMEOUT, f"job {job.id} still {job.status} after {timeout:g} s (it goes on)")
                time.sleep(poll)
                job = client.get_job(job_id)
            progress.job(job)
        except TunecacheError as exc:
            client_errors(exc)
    said = {JobStatus.SUCCEEDED: f"succeeded in {job.duration_s or 0:.1f} s; run {job.run_id}",
            JobStatus.FAILED: f"failed: {job.error}",
            JobStatus.CANCELLED: "cancelled" + (f" by {job.cancelled_by}" if job.cancelled_by else "")}[job.status]
    code = END_STATE_CODES[job.status]
    if code is not ExitCode.OK:
        fail(code, printable(f"job {job.id} {said}"))
    typer.echo(printable(f"job {job.id} {said}"))


def workers(
    server: ServerOpt,
    gpu_name: Annotated[Optional[str], typer.Option("--gpu-name", help="only workers of this GPU")] = None,
    arch: Annotated[Optional[str], typer.Option("--arch", help="only workers of this arch, e.g. sm90")] = None,
    as_json: JsonOpt = False,
) -> None:
    """The GPU job workers seen in the last day, latest heartbeat first: name, GPU, arch, vLLM, model config directory, last seen, live.

    A job is taken only by a live worker of its key's GPU and arch. Names (host:pid) are shown to an admin token only. Exit 0; 4 server unreachable; 5 server error; 13 not authorised.
    """
    with client_for(server) as client:
        try:
            listed = client.workers(gpu_name, arch)
        except TunecacheError as exc:
            client_errors(exc)
    if as_json:
        typer.echo(listed.model_dump_json(indent=2))
        return
    if not listed.items:
        typer.echo("no GPU job workers seen in the last day")
        return
    rows = [("NAME", "GPU", "ARCH", "VLLM", "CONFIG DIR", "LAST SEEN", "LIVE")]
    rows += [(w.name, w.gpu_name, w.arch, w.vllm_version or "-", "yes" if w.model_config_dir else "no",
              f"{age(w.seen_s_ago)} ago", "yes" if w.live else ("stopped" if w.stopped_at else "no"))
             for w in listed.items]
    for line in aligned(rows):
        typer.echo(line)
    live = sum(w.live for w in listed.items)
    typer.echo(f"{live} of {len(listed.items)} live (a heartbeat within {listed.live_window_s:g} s)", err=True)


def audit(
    server: ServerOpt,
    limit: Annotated[int, typer.Option("--limit", min=1, max=1000, help="events per page")] = 100,
    before: Annotated[Optional[int], typer.Option("--before", min=1, max=MAX_ID,
                                                  help="events older than this id (the next page's, printed)")] = None,
    as_json: JsonOpt = False,
) -> None:
    """The service's audit log, newest first: every write, with when, the token's name and scope, the request and what it did (needs an admin token).

    One page of --limit events; the next page's --before is printed. Exit 0; 13 without an admin token; 4 server unreachable; 5 server error.
    """
    with client_for(server) as client:
        try:
            page = client.list_audit_events(limit=limit, before=before)
        except TunecacheError as exc:
            client_errors(exc)
    if as_json:
        typer.echo(page.model_dump_json(indent=2))
        return
    if not page.events:
        typer.echo("no audit events" + (f" before {before}" if before else ""))
        return
    rows = [("ID", "AT (UTC)", "TOKEN", "SCOPE", "REQUEST", "WHAT")]
    rows += [(str(e.id), when(e.at), e.token_name, str(e.scope), f"{e.method} {e.path}", e.detail or "-")
             for e in page.events]
    for line in aligned(rows):
        typer.echo(line)
    if page.next_before:
        typer.echo(f"next page: --before {page.next_before}", err=True)


def register(app: typer.Typer) -> None:
    """Add ``job list``, ``job show``, ``job wait`` to the ``job`` commands
    (:data:`tunecache.cli.admin.job_app`), and ``workers`` and ``audit`` to ``app``."""
    job_app.command("list")(job_list)
    job_app.command("show")(job_show)
    job_app.command("wait")(job_wait)
    app.command()(workers)
    app.command()(audit)
