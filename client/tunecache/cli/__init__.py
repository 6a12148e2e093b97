"""``tunecache`` command line (typer): the pod commands, and the whole command.

``tunecache-client`` brings the commands by audience, one module each, all built with the
command kit (:mod:`tunecache.cli_kit`: the root app, exit codes, shared options):

- :mod:`tunecache.cli.pod`: what a pod runs (``push``, ``pull``, ``doctor``);
- :mod:`tunecache.cli.fleet`: what an operator reads of the fleet (``diff``, ``history``, ``fleet``);
- :mod:`tunecache.cli.admin`: what an admin changes (``retune``, ``job``, ``promote``, ``pin``,
  ``unpin``, ``token``, ``keys``, ``retire``).

This module assembles them into :data:`app`. Other distributions add commands through the
``tunecache.cli`` entry-point group: each entry is a function that takes the typer app and
registers its commands on it (``tunecache-server`` adds ``serve``, ``db``, ``prune`` and
``tune``). This package never imports them by name: with only the client installed,
``tunecache --help`` lists the pod commands. ``python -m tunecache.cli`` runs the whole
command as the ``tunecache`` console script does (:func:`main`).

Exit codes: :class:`tunecache.cli_kit.ExitCode` (also in docs/pods.md).
"""

from importlib.metadata import entry_points

import typer

from tunecache import cli_kit
from tunecache.cli import admin, fleet, pod
from tunecache.cli.client import client_for  # the tunecache.server_store entry point's name

__all__ = ["COMMAND_PLUGINS_GROUP", "app", "client_for", "load_command_plugins", "main", "run"]

#: Entry-point group through which other distributions add commands to ``tunecache``.
COMMAND_PLUGINS_GROUP = "tunecache.cli"

app = cli_kit.new_app()
for audience in (pod, fleet, admin):  # the order of `tunecache --help`
    audience.register(app)


def load_command_plugins(target: typer.Typer = app) -> list[str]:
    """Let every installed ``tunecache.cli`` entry point register its commands on ``target``.

    A plugin that fails to load is skipped with a warning naming it (the pod commands
    keep working). Returns the names of the plugins loaded.
    """
    loaded = []
    for entry in entry_points(group=COMMAND_PLUGINS_GROUP):
        try:
            entry.load()(target)
        except Exception as exc:  # a broken server install must not take the pod commands down
            typer.echo(f"tunecache: warning: commands of {entry.name!r} ({entry.value}) not loaded: "
                       f"{type(exc).__name__}: {exc}", err=True)
            continue
        loaded.append(entry.name)
    return loaded


def main() -> None:
    """Console-script entry point: the pod commands plus every installed plugin's."""
    load_command_plugins()
    run()


def run(args: list[str] | None = None) -> None:
    """Run the commands registered on :data:`app` so far (:func:`tunecache.cli_kit.run`)."""
    cli_kit.run(app, args)
