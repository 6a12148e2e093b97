"""The server's commands of ``tunecache``, one module each: ``serve`` (:mod:`.serve`), ``db
upgrade``, ``db move-artifacts`` and ``db admin-token`` (:mod:`.db`), ``prune`` (:mod:`.prune`)
and ``tune`` (:mod:`.tune`); what they share of the database in :mod:`.database`.

Built with the client's command kit (:mod:`tunecache.cli_kit`: exit codes, the key
options, the root app), which holds none of the pod code. Registered on the client's typer
app through the ``tunecache.cli`` entry-point group (``tunecache.cli.load_command_plugins``
calls :func:`register`), so installing ``tunecache-server`` adds them to the same
``tunecache`` command; ``python -m tunecache.service`` runs them alone. These modules import
only typer and the kit at load time; the service's own dependencies (uvicorn, SQLAlchemy,
the tuner) are imported by the command that needs them, so the pod commands start as fast
with the server installed as without it. ``tune --server`` records through the HTTP store
the kit opens for a server (:func:`tunecache.cli_kit.server_store`: :mod:`tunecache.store.http`).
"""

from __future__ import annotations

import typer

from tunecache.service.cli.db import db_admin_token, db_move_artifacts, db_upgrade
from tunecache.service.cli.prune import prune
from tunecache.service.cli.serve import serve
from tunecache.service.cli.tune import tune


def register(app: typer.Typer) -> None:
    """Add ``serve``, ``db upgrade``, ``prune`` and ``tune`` to the ``tunecache`` app (entry point of
    the ``tunecache.cli`` group)."""
    db_app = typer.Typer(help="Database schema commands.", no_args_is_help=True)
    db_app.command("upgrade")(db_upgrade)
    db_app.command("move-artifacts")(db_move_artifacts)
    db_app.command("admin-token")(db_admin_token)
    app.add_typer(db_app, name="db")
    app.command()(serve)
    app.command()(prune)
    app.command()(tune)
