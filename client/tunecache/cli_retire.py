"""``tunecache retire RUN``: take a run out of use (admin), registered on the ``tunecache`` app
by :func:`register`."""

from __future__ import annotations

from typing import Annotated

import typer

from tunecache.cli_client import client_for
from tunecache.cli_kit import ServerOpt, client_errors
from tunecache.contract import MAX_ID
from tunecache.store import TunecacheError


def retire(
    server: ServerOpt,
    run_id: Annotated[int, typer.Argument(min=1, max=MAX_ID, help="the run to take out of use (history lists them)")],
) -> None:
    """Retire a run: never current or served again, kept for the history (needs an admin token; audited).

    Where it was current, the newest usable run of its key and environment recorded before it takes its place (succeeded, not a pod's, not held, not retired), else none does and pods miss until a run is recorded or promoted; the line says which. A retired run cannot be promoted. Retiring a retired run changes nothing. Exit 5 when there is no such run, 13 without an admin token.
    """
    with client_for(server) as client:
        try:
            retired = client.retire_run(run_id)
        except TunecacheError as exc:
            client_errors(exc)
    run, current = retired.run, retired.current_run_id
    instead = (f"run {current} is current in its place" if current is not None
               else "no run is current for its key now")
    typer.echo(f"run {run.id} of {run.key.model} on {run.key.gpu_name} is retired: never served again; {instead}")


def register(app: typer.Typer) -> None:
    """Add ``retire`` to ``app``."""
    app.command()(retire)
