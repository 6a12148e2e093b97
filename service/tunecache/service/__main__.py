"""``python -m tunecache.service``: the server's commands (``serve``, ``db``, ``prune``,
``tune``) on their own, built with the command kit (:mod:`tunecache.cli_kit`), from the
source roots alone (``tune --server`` records through the HTTP store, :mod:`tunecache.store.http`,
which the kit opens). The whole ``tunecache``
command, pod commands included, is ``python -m tunecache.cli``, which finds these through
their entry point."""

from tunecache import cli_kit
from tunecache.service.cli import register

if __name__ == "__main__":
    app = cli_kit.new_app()
    register(app)
    cli_kit.run(app)
