"""``python -m tunecache.cli``: the whole ``tunecache`` command, as the console script runs it
(:func:`tunecache.cli.main`: the pod commands and every installed plugin's)."""

from tunecache.cli import main

main()
