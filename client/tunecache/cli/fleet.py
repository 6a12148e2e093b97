"""The fleet's commands of ``tunecache``: ``history``, ``fleet`` and ``diff`` (what an operator
reads of the whole fleet: the runs recorded, what pods have and want, how two runs differ),
registered on the ``tunecache`` app by :func:`register`.

Their tables print text from the service, some of it from anonymous pod reports, with its
control characters escaped (:func:`_printable`).
"""

import datetime as dt
import inspect
import json
import re
import sys
from typing import Annotated, Any, Optional

import typer
from pydantic import ValidationError

from tunecache.cli.client import client_for
from tunecache.cli_kit import ExitCode, ServerOpt, client_errors, fail, with_options
from tunecache.client.http import ServerError
from tunecache.contract import (
    ENVIRONMENT_FIELDS,
    FLEET_MAX_HOURS,
    FLEET_PAGE_DEFAULT,
    FLEET_PAGE_MAX,
    MAX_ID,
    TuningKey,
    TuningRunDiff,
    TuningRunQuery,
)
from tunecache.store import TunecacheError


def register(app: typer.Typer) -> None:
    """Add ``diff``, ``history`` and ``fleet`` to ``app``."""
    for command in (diff, history, fleet):
        app.command()(command)


def _tactic_text(tactic) -> str:
    """A tactic as compact JSON (``[0,[[12,0]]]``); ``-`` for none."""
    return "-" if tactic is None else json.dumps(tactic, separators=(",", ":"))


def _diff_table(diff: TuningRunDiff) -> list[str]:
    """The changed entries of a run diff as aligned text rows under a header: status, op,
    runner, bucket (with the extras where two rows would read the same), tactic a -> b,
    each run's recorded time (ms), the slowdown, each run's margin, and REGRESSION or why not."""
    def pct(value: float | None, signed: bool = False) -> str:
        return "-" if value is None else f"{value * 100:{'+' if signed else ''}.2f}%"

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.6g}"

    seen: dict[tuple[str, str, str], int] = {}
    for e in diff.entries:
        seen[(e.op, e.runner, e.bucket)] = seen.get((e.op, e.runner, e.bucket), 0) + 1
    rows = [("STATUS", "OP", "RUNNER", "BUCKET", "TACTIC A -> B", "A ms", "B ms", "CHANGE", "MARGIN A / B", "")]
    for e in diff.entries:
        bucket = e.bucket + (f" [{e.extras}]" if seen[(e.op, e.runner, e.bucket)] > 1 and e.extras else "")
        margins = "-" if e.margin_a is None and e.margin_b is None else f"{pct(e.margin_a)} / {pct(e.margin_b)}"
        mark = f"REGRESSION ({e.note})" if e.regression else (e.note or "")
        rows.append((str(e.status), e.op, e.runner, bucket, f"{_tactic_text(e.tactic_a)} -> {_tactic_text(e.tactic_b)}",
                     ms(e.time_ms_a), ms(e.time_ms_b), pct(e.slowdown, signed=True), margins, mark))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]


def diff(
    run_a: Annotated[int, typer.Argument(min=1, max=MAX_ID, help="run id a (e.g. the current tuning)")],
    run_b: Annotated[int, typer.Argument(min=1, max=MAX_ID, help="run id b, compared with a (e.g. a re-tune)")],
    server: ServerOpt,
    as_json: Annotated[bool, typer.Option("--json", help="print the diff as JSON (the API's TuningRunDiff)")] = False,
    fail_on_regression: Annotated[bool, typer.Option(
        "--fail-on-regression", help="exit 18 when a changed entry is slower beyond its recorded margin")] = False,
) -> None:
    """Which ops and buckets changed tactic between two stored runs' FlashInfer files.

    One row per entry added, removed, or with another tactic in run B: op, runner, bucketed shapes, tactic A -> B, FlashInfer's recorded times (ms) where the files have them, the change, both margins, and REGRESSION when B's time is slower than A's beyond the larger recorded margin (near-tied tactics flipping between tunings are not). Then one summary line. Exit 0, or 18 with --fail-on-regression when there is a regression; 5 for an unknown run or a run without a FlashInfer file (the server's reason in one line).
    """
    with client_for(server) as client:
        try:
            result = client.diff_runs(run_a, run_b)
        except ServerError as exc:
            if exc.status_code in (404, 422) and isinstance(exc.detail, str):
                fail(ExitCode.SERVER_ERROR, exc.detail)
            client_errors(exc)
        except TunecacheError as exc:
            client_errors(exc)
    s = result.summary
    if as_json:
        typer.echo(result.model_dump_json(indent=2))
    else:
        key = result.key_a
        typer.echo(f"run {run_a} -> run {run_b}: {key.model} on {key.gpu_name}, "
                   f"max_num_batched_tokens {key.max_num_batched_tokens}")
        for d in result.differences:
            typer.echo(f"  differs: {d.field}: {d.stored} -> {d.yours}")
        for line in _diff_table(result) if result.entries else ["no entry changed tactic"]:
            typer.echo(line)
        untimed = [run for run, timed in ((run_a, s.timed_a), (run_b, s.timed_b)) if timed == 0]
        typer.echo(
            f"{s.entries_a} entries in run {run_a}, {s.entries_b} in run {run_b}: {s.added} added, {s.removed} removed, "
            f"{s.changed} changed tactic, {s.unchanged} unchanged; "
            f"{s.regressions} regression{'' if s.regressions == 1 else 's'}"
            + "".join(f"; run {run} has no recorded times" for run in untimed))
    if fail_on_regression and s.regressions:
        fail(ExitCode.REGRESSION, f"{s.regressions} regression{'' if s.regressions == 1 else 's'} (--fail-on-regression): "
                                  f"run {run_b} is slower than run {run_a} beyond the recorded margin in "
                                  f"{s.regressions} entr{'y' if s.regressions == 1 else 'ies'}")


#: Control characters (C0, DEL, C1: what a terminal acts on, ESC and CSI among them) as
#: ``\xNN``: text in the tables of ``history`` and ``fleet`` comes from the service, and
#: some of it from anonymous pod reports.
_CONTROL_ESCAPES = {code: f"\\x{code:02x}" for code in (*range(0x20), *range(0x7F, 0xA0))}


def _printable(text: str) -> str:
    """``text`` with its control characters escaped (:data:`_CONTROL_ESCAPES`), so that
    printing it cannot move the cursor, retitle the terminal or hide what follows."""
    return text.translate(_CONTROL_ESCAPES)


def _aligned(rows: list[tuple[str, ...]]) -> list[str]:
    """Rows of cells as text lines, each column as wide as its widest cell; control
    characters in a cell are escaped (:func:`_printable`)."""
    rows = [tuple(_printable(cell) for cell in row) for row in rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]


def _key_text(key: TuningKey) -> str:
    """A key in one cell: model, GPU, max_num_batched_tokens, tp, and what else is not the default."""
    extra = [f"{name}={getattr(key, name)}" for name, default in (("dtype", "auto"), ("quantization", "auto"),
                                                                  ("data_parallel_size", 1), ("expert_parallel_size", 1))
             if getattr(key, name) != default]
    return " ".join([key.model, f"{key.gpu_name} ({key.arch})", f"mnbt={key.max_num_batched_tokens}",
                     f"tp={key.tensor_parallel_size}", *extra])


def _age(seconds: float) -> str:
    """``45s``, ``12m``, ``5h 3m``, ``2d 4h``."""
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m"
    if seconds < 86400:
        return f"{seconds // 3600}h {seconds % 3600 // 60}m"
    return f"{seconds // 86400}d {seconds % 86400 // 3600}h"


def _when(value: dt.datetime | None) -> str:
    return "-" if value is None else value.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def time_option(option: str, value: str | None) -> dt.datetime | None:
    """``--since``/``--until``: an ISO 8601 time (UTC when it names no zone) or an age back
    from now (``90m``, ``24h``, ``7d``, ``30s``); exit 2 naming the option otherwise."""
    if value is None:
        return None
    age = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd])\s*", value)
    if age:
        unit = {"s": 1, "m": 60, "h": 3600, "d": 86400}[age.group(2)]
        try:
            return dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=float(age.group(1)) * unit)
        except (OverflowError, ValueError):
            fail(ExitCode.USAGE, f"{option} {value[:80]!r} reaches back before the year 1")
    try:
        when = dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00").replace("z", "+00:00"))
        when = when if when.tzinfo is not None else when.replace(tzinfo=dt.timezone.utc)
        return when.astimezone(dt.timezone.utc)
    except ValueError:
        fail(ExitCode.USAGE, f"{option} {value[:80]!r} is not an ISO 8601 time (2026-12-01T08:00:00Z) "
                             "or an age (90m, 24h, 7d)")
    except OverflowError:
        fail(ExitCode.USAGE, f"{option} {value[:80]!r} is outside the years 1-9999 once in UTC")


def _query_error(exc: ValidationError) -> str:
    """The first problem of a history query, naming the option it came from."""
    error = exc.errors()[0]
    where = [str(part) for part in error["loc"]]
    message = error["msg"].removeprefix("Value error, ")
    return f"--{where[0].replace('_', '-')}: {message}" if where else message


#: ``history``'s filter options that say more than ``only this <field>``: (more names, help).
_HISTORY_FILTER_HELP: dict[str, tuple[tuple[str, ...], str]] = {
    "model": ((), "only runs of this model"),
    "gpu_name": ((), "only runs for this GPU, e.g. 'NVIDIA H200'"),
    "arch": ((), "only runs for this arch, e.g. sm90"),
    "tensor_parallel_size": (("-tp",), "only this tensor-parallel size"),
    "data_parallel_size": (("-dp",), "only this data-parallel size"),
    "expert_parallel_size": ((), "only this expert-parallel size (tp x dp with vLLM's --enable-expert-parallel)"),
}


def _key_filter_parameters() -> list[inspect.Parameter]:
    """``history``'s key filters: one option per key field (:data:`KEY_FIELDS`, read from
    :class:`TuningKey`), ``--<field>``, optional."""
    parameters = []
    for name, field in TuningKey.model_fields.items():
        more, help_text = _HISTORY_FILTER_HELP.get(name, ((), f"only this {name}"))
        option = typer.Option("--" + name.replace("_", "-"), *more, help=help_text)
        annotation = Annotated[Optional[int if field.annotation is int else str], option]
        parameters.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=None))
    return parameters


@with_options("key_filters", _key_filter_parameters(), lambda **fields: fields)
def history(
    server: ServerOpt,
    key_filters: dict[str, Any],
    status: Annotated[Optional[str], typer.Option("--status", help="succeeded or failed")] = None,
    trigger: Annotated[Optional[str], typer.Option("--trigger", help="upload, cli, http or pod")] = None,
    env: Annotated[Optional[list[str]], typer.Option(
        "--env", help="FIELD=VALUE of the FlashInfer environment, e.g. flashinfer_version=0.7.4 (repeatable)")] = None,
    since: Annotated[Optional[str], typer.Option(
        "--since", help="recorded at or after: ISO 8601 (UTC when no zone is given) or an age such as 24h, 7d")] = None,
    until: Annotated[Optional[str], typer.Option("--until", help="recorded before: as --since")] = None,
    current_only: Annotated[bool, typer.Option("--current-only", help="only runs that are current for their key")] = False,
    limit: Annotated[int, typer.Option("--limit", min=1, max=500, help="runs per page")] = 50,
    cursor: Annotated[Optional[str], typer.Option("--cursor", help="continue after a page (the cursor it printed)")] = None,
    all_pages: Annotated[bool, typer.Option("--all", help="every matching run, page after page")] = False,
    as_csv: Annotated[bool, typer.Option("--csv", help="every matching run as CSV (header first) on stdout")] = False,
) -> None:
    """The tuning history, newest first: id, recorded, status, trigger, key, FlashInfer version, entries, current.

    Filters combine: key fields, --env FIELD=VALUE for any FlashInfer environment field, --status, --trigger, --since/--until, --current-only. One page of --limit runs, then the cursor of the next (--cursor); --all prints every page; --csv streams every matching run as the server's CSV export.

    Exit 0; 2 for a bad option (named); 4 server unreachable; 5 server error; 13 not authorised.
    """
    params: dict[str, object] = {
        **key_filters, "status": status, "trigger": trigger,
        "since": time_option("--since", since), "until": time_option("--until", until), "current_only": current_only,
        "limit": limit, "cursor": cursor,
    }
    for item in env or []:
        field, sep, value = item.partition("=")
        if not sep or field not in ENVIRONMENT_FIELDS:
            fail(ExitCode.USAGE, f"--env {item[:80]!r}: give FIELD=VALUE with FIELD one of {', '.join(ENVIRONMENT_FIELDS)}")
        params[field] = value
    try:
        query = TuningRunQuery(**{name: value for name, value in params.items() if value is not None})
    except ValidationError as exc:
        fail(ExitCode.USAGE, _query_error(exc))
    with client_for(server) as client:
        try:
            if as_csv:
                client.export_runs_csv(query, sys.stdout.buffer.write)
                sys.stdout.buffer.flush()
                return
            pages = [client.list_runs(query)]
            while all_pages and pages[-1].next_cursor:
                pages.append(client.list_runs(query.model_copy(update={"cursor": pages[-1].next_cursor})))
        except TunecacheError as exc:
            client_errors(exc)
    runs = [run for page in pages for run in page.items]
    if not runs:
        typer.echo("no tuning runs match")
        return
    rows = [("ID", "RECORDED (UTC)", "STATUS", "TRIGGER", "KEY", "FLASHINFER", "ENTRIES", "CURRENT")]
    rows += [(str(r.id), _when(r.created_at), f"{r.status} (retired)" if r.retired_at else str(r.status), str(r.trigger),
              _key_text(r.key),
              r.environment.flashinfer_version, "-" if r.entries is None else str(r.entries), "yes" if r.is_current else "")
             for r in runs]
    for line in _aligned(rows):
        typer.echo(line)
    last = pages[-1]
    more = f"; next page: --cursor {last.next_cursor}" if last.next_cursor else ""
    typer.echo(f"{len(runs)} of {last.total} matching run{'' if last.total == 1 else 's'}{more}", err=True)


def fleet(
    server: ServerOpt,
    hours: Annotated[float, typer.Option("--hours", min=0.001, max=FLEET_MAX_HOURS, help="the window of hit rates and wanted tunings")] = 24.0,
    limit: Annotated[int, typer.Option("--limit", min=1, max=FLEET_PAGE_MAX,
                                       help="keys, and wanted tunings, per page")] = FLEET_PAGE_DEFAULT,
    offset: Annotated[int, typer.Option("--offset", min=0, max=MAX_ID, help="rows of each list before the page")] = 0,
    all_pages: Annotated[bool, typer.Option("--all", help="every key and wanted tuning, page after page")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the API's FleetView as JSON")] = False,
) -> None:
    """What the fleet has and wants: keys with their current run (id, age, entries, trigger) and the share of pods' installs that found it over the last --hours, most reports first; then the tunings pods asked for that have none (distinct pods, last asked, how the closest run differs), most pods first.

    One page: --limit rows of each list from --offset (the next page's --offset is printed); --all walks every page (1000 rows a request) and prints them as one.

    Exit 0; 2 for a bad option; 4 server unreachable; 5 server error; 13 not authorised.
    """
    if all_pages and offset:
        fail(ExitCode.USAGE, "--offset and --all cannot be combined: --all lists every page from the first")
    with client_for(server) as client:
        try:
            view = client.fleet_all(hours) if all_pages else client.fleet(
                hours, limit=limit, offset=offset, wanted_limit=limit, wanted_offset=offset)
        except TunecacheError as exc:
            client_errors(exc)
    if as_json:
        typer.echo(view.model_dump_json(indent=2))
        return
    typer.echo(f"fleet over the last {view.hours:g} h (since {_when(view.since)}): "
               f"{_shown(len(view.keys), view.offset, view.total_keys, 'key')}, "
               f"{_shown(len(view.wanted), view.wanted_offset, view.total_wanted, 'wanted tuning')}")
    rows = [("KEY", "RUN", "AGE", "ENTRIES", "TRIGGER", "FLASHINFER", "REPORTS", "HIT RATE", "MISSES", "ERRORS")]
    for k in view.keys:
        rate = "-" if k.hit_rate is None else f"{k.hit_rate * 100:.0f}%"
        counts = (str(k.reports), rate, str(k.missed), str(k.errors))
        if not k.current:
            rows.append((_key_text(k.key), "none", "-", "-", "-", "-", *counts))
        for i, run in enumerate(k.current):
            rows.append((_key_text(k.key) if i == 0 else "", str(run.run_id), _age(run.age_s),
                         "-" if run.entries is None else str(run.entries), str(run.trigger), run.flashinfer_version,
                         *(counts if i == 0 else ("", "", "", ""))))
    if view.keys:
        for line in _aligned(rows):
            typer.echo(line)
    else:
        typer.echo(f"no keys past {view.offset} of {view.total_keys}" if view.total_keys
                   else "no keys: nothing tuned and no reports in the window")
    typer.echo("")
    if view.wanted:
        typer.echo("wanted (pods asked, no usable tuning):")
        rows = [("KEY", "ENVIRONMENT", "SOURCES", "PODS", "BOOTS", "LAST ASKED (UTC)", "CLOSEST", "DIFFERS")]
        for w in view.wanted:
            env_text = (f"flashinfer {w.environment.flashinfer_version}, cuda {w.environment.cuda_version}"
                        if w.environment else w.environment_hash[:12])
            differs = "; ".join(str(d) for d in w.differences) or "-"
            rows.append((_key_text(w.key), env_text, str(w.sources), str(w.pods), str(w.reports), _when(w.last_asked_at),
                         "-" if w.closest_run_id is None else f"run {w.closest_run_id}", differs))
        for line in _aligned(rows):
            typer.echo(line)
    elif view.total_wanted:
        typer.echo(f"wanted: none past {view.wanted_offset} of {view.total_wanted}")
    else:
        typer.echo("wanted: none (every key pods asked for in the window has a tuning)")
    following = view.offset + view.limit
    if not all_pages and following < max(view.total_keys, view.total_wanted):
        more = "" if view.limit == FLEET_PAGE_DEFAULT else f" --limit {view.limit}"
        typer.echo(f"next page: --offset {following}{more}", err=True)


def _shown(listed: int, offset: int, total: int, noun: str) -> str:
    """``3 keys`` when a list is whole, ``keys 101-200 of 1074`` when it is a page of more."""
    if offset == 0 and listed == total:
        return f"{total} {noun}{'' if total == 1 else 's'}"
    return f"{noun}s {offset + 1}-{offset + listed} of {total}" if listed else f"no {noun}s past {offset} of {total}"


