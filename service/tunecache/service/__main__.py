"""``python -m tunecache.service``: the whole ``tunecache`` command (pod and server
commands) from the source roots alone, without the distributions' entry points installed
(GPU machines that run the project from ``PYTHONPATH``)."""

from tunecache import cli
from tunecache.service.cli import register

if __name__ == "__main__":
    register(cli.app)
    cli.run()
