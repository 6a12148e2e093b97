"""What the fork server of :mod:`tests.support.forked` loads before it forks a command: the
modules `tunecache` commands and servers import (the console script's, the service's, and those
they import as they first connect: httpx's transport, uvicorn's loop and protocol, the database
drivers), and SQLAlchemy's mappers configured, which each server's first query would otherwise
do again (about 0.1 s). Nothing here reads the environment, opens a file a command uses or starts
a thread: every command still reads its own settings after the fork."""

import anyio._backends._asyncio  # noqa: F401
import certifi  # noqa: F401
import encodings.idna  # noqa: F401
import httpcore  # noqa: F401
import httptools  # noqa: F401
import psycopg  # noqa: F401
import sqlalchemy.orm
import sqlite3  # noqa: F401
import stringprep  # noqa: F401
import typer._adapters  # noqa: F401
import uvicorn.lifespan.on  # noqa: F401
import uvicorn.loops.uvloop  # noqa: F401
import uvloop  # noqa: F401

import tunecache.cli  # noqa: F401
import tunecache.service.app  # noqa: F401
import tunecache.service.cli  # noqa: F401
import tunecache.service.models  # noqa: F401
import tunecache.store.http.local_token  # noqa: F401

sqlalchemy.orm.configure_mappers()
