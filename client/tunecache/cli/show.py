"""``tunecache show RUN`` (what a stored run holds) and ``tunecache completion SHELL`` (the
shell completion script); registered on the ``tunecache`` app by :func:`register`."""

from __future__ import annotations

import datetime as dt
import enum
from typing import Annotated

import typer

from tunecache.cli.client import client_for
from tunecache.cli_kit import ServerOpt, client_errors
from tunecache.cli.text import aligned, key_text, printable, when
from tunecache.contract import MAX_ID, TuningRunRead
from tunecache.store import TunecacheError


def _size(size: int) -> str:
    """``812 B``, ``4.2 KiB``, ``23.1 MiB``, ``1.5 GiB``."""
    value, unit = float(size), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            break
        value /= 1024
    return f"{size} B" if unit == "B" else f"{value:.1f} {unit}"


def _signature_line(run: TuningRunRead) -> str:
    s = run.signature
    if s is None:
        return "unsigned: pods that trust keys install its tactics only if they trust none (TUNECACHE_TRUSTED_KEYS)"
    signed = (f", signed {when(dt.datetime.fromtimestamp(s.signed_at, dt.timezone.utc))}" if s.signed_at else "")
    expires = (f", expires {when(dt.datetime.fromtimestamp(s.expires_at, dt.timezone.utc))}" if s.expires_at else "")
    checked = {True: "the service checked it against its trusted keys", False: "the service found it bad",
               None: "the service has no trusted keys to check it against"}[run.signature_verified]
    return f"key {s.key_id} (manifest {s.manifest}{signed}{expires}); {checked}"


def _where_current(run: TuningRunRead) -> str:
    if run.retired_at:
        return f"no: retired {when(run.retired_at)}, never served again"
    if run.is_current:
        variant = f", engine variant {run.variant}" if run.variant else ""
        return (f"yes, for its key on environment {run.environment_hash[:12]} (flashinfer "
                f"{run.environment.flashinfer_version}, cuda {run.environment.cuda_version}{variant})")
    return "no" + (f": {run.held}" if run.held else "")


def run_lines(run: TuningRunRead) -> list[str]:
    """``show``'s text of ``run``: one line per fact, then its artifacts as a table."""
    lines = [
        f"run {run.id}: {run.status}, {run.trigger}" + (" (verified)" if run.verified else " (unverified)"),
        f"key: {key_text(run.key)}",
        f"environment: {', '.join(f'{k} {v}' for k, v in run.environment.model_dump().items())}",
        f"recorded: {when(run.created_at)} by {run.recorded_by or 'a node on the database'}"
        + (f" (tuned on {run.node})" if run.node else ""),
        f"tuned: {when(run.started_at)} to {when(run.finished_at)}"
        + (f" ({run.duration_s:.1f} s)" if run.duration_s is not None else ""),
        f"entries: {'-' if run.entries is None else run.entries}",
        f"current: {_where_current(run)}",
        f"pinned: {'yes: retention never deletes it' if run.pinned else 'no'}",
        f"signature: {_signature_line(run)}",
    ]
    if run.verification is not None:
        lines.append(f"verification boot: {run.verification.model_dump_json(exclude_none=True)[:400]}")
    if run.error:
        lines.append(f"error: {run.error}")
    total = sum(a.size_bytes for a in run.artifacts)
    lines.append(f"artifacts: {len(run.artifacts)}, {_size(total)} in all")
    if run.artifacts:
        rows = [("KIND", "NAME", "SIZE", "SHA256")]
        rows += [(a.kind, a.name, _size(a.size_bytes), a.sha256[:16]) for a in run.artifacts]
        lines += ["  " + line for line in aligned(rows)]
    return [printable(line) for line in lines]


def show(
    server: ServerOpt,
    run_id: Annotated[int, typer.Argument(min=1, max=MAX_ID, help="the run (history lists them)")],
    as_json: Annotated[bool, typer.Option("--json", help="print the API's TuningRunRead as JSON")] = False,
) -> None:
    """What a stored run holds: key, environment, who recorded it and where it was tuned, entries, whether and where it is current (or why not), pinned or not, its signature, and its artifacts (kind, name, size, sha256).

    Names of tokens and hosts are shown to an admin token only. Exit 0; 5 when there is no such run; 4 server unreachable; 13 not authorised.
    """
    with client_for(server) as client:
        try:
            run = client.get_run(run_id)
        except TunecacheError as exc:
            client_errors(exc)
    if as_json:
        typer.echo(run.model_dump_json(indent=2))
        return
    for line in run_lines(run):
        typer.echo(line)


class Shell(str, enum.Enum):
    bash = "bash"
    zsh = "zsh"
    fish = "fish"


def completion(shell: Annotated[Shell, typer.Argument(help="bash, zsh or fish")]) -> None:
    """Print the shell completion script of tunecache for SHELL.

    bash: tunecache completion bash > ~/.local/share/bash-completion/completions/tunecache; zsh: tunecache completion zsh > "${fpath[1]}/_tunecache"; fish: tunecache completion fish > ~/.config/fish/completions/tunecache.fish. Then open a new shell. Completes commands, options and choices.
    """
    from typer.completion import get_completion_script

    typer.echo(get_completion_script(prog_name="tunecache", complete_var="_TUNECACHE_COMPLETE", shell=shell.value))


def register(app: typer.Typer) -> None:
    """Add ``show`` and ``completion`` to ``app``, and let the command answer its completion
    script's questions (typer's bash, zsh and fish completers, which the root app, made
    without typer's ``--install-completion``, does not register itself)."""
    from typer.completion import completion_init

    completion_init()
    app.command()(show)
    app.command()(completion)
