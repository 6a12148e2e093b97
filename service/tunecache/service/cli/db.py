"""``tunecache db``: the database's schema (``upgrade``), an admin token made in it directly
(``admin-token``) and the artifacts' bytes moved between it and the object store
(``move-artifacts``)."""

from __future__ import annotations

from typing import Annotated

import typer

from tunecache.cli_kit import ExitCode, fail
from tunecache.service.cli.database import DatabaseOpt, open_engine, ready_engine, store_errors


def db_upgrade(database: DatabaseOpt = None) -> None:
    """Apply the schema migrations (Alembic) to the database."""
    from tunecache.service import db
    from tunecache.service.settings import Settings

    url = database or Settings().resolved_database_url()
    engine = open_engine(url)
    try:
        db.upgrade(engine)
        revision = db.check_schema(engine)
    except Exception as exc:
        fail(ExitCode.DATABASE, f"cannot upgrade {engine.url.render_as_string(hide_password=True)}: {str(exc).splitlines()[0]}")
    typer.echo(f"database at revision {revision}")


def db_admin_token(
    name: Annotated[str, typer.Option("--name", help="the new token's name (names are never reused)")] = "admin-recovered",
    database: DatabaseOpt = None,
) -> None:
    """Create an admin token directly in the database and print it (the token, on stdout).

    For a service whose admin tokens are lost (the first start's admin.token was on a pod's emptyDir, or on a tuner pod), or to make the first one where the operator chooses: whoever can reach the database (TUNECACHE_DATABASE_URL) can already do anything, so this asks for no token. Store it in a Secret; revoke the lost ones with it (tunecache token revoke).

    Exit 2 when the name is taken, 9 when the database fails."""
    from tunecache.contract import Scope
    from tunecache.service import db, tokens
    from tunecache.service.settings import Settings

    url = database or Settings().resolved_database_url()
    engine = ready_engine(url)
    try:
        with db.session_factory(engine).begin() as session:
            created = tokens.create_token(session, name, Scope.ADMIN, created_by="tunecache db admin-token")
    except tokens.TokenNameTaken as exc:
        fail(ExitCode.USAGE, f"{exc}: give another --name")
    except Exception as exc:
        store_errors(exc)
    finally:
        engine.dispose()
    typer.echo(created.token)


def db_move_artifacts(
    to: Annotated[str, typer.Option("--to", help="s3://bucket/prefix (the object store) or database")],
    database: DatabaseOpt = None,
) -> None:
    """Move the stored artifacts' bytes into the object store, or back into the database.

    Each blob is copied, verified against its sha256, its new location recorded, and only then deleted from where it was: a move stopped anywhere (even killed) loses nothing, and running it again finishes it. The service may keep running meanwhile: it reads each blob where its row says it is. Moving into the object store needs --to to be the service's TUNECACHE_ARTIFACT_STORE (set it once the move is done, or before: new uploads then go there); moving back needs TUNECACHE_ARTIFACT_STORE to name the store to empty. The object store is reached with the AWS_* variables, as the service reaches it.
    """
    import os

    from sqlalchemy import select

    from tunecache.service import artifact_store, db
    from tunecache.service.models import ArtifactBlob
    from tunecache.service.settings import Settings

    configured = os.environ.get("TUNECACHE_ARTIFACT_STORE") or None
    try:
        configured = Settings(artifact_store=configured).artifact_store
        if to == "database":
            if configured is None:
                fail(ExitCode.USAGE, "--to database moves the bytes out of the object store that "
                                     "TUNECACHE_ARTIFACT_STORE names: set it")
            object_store = artifact_store.S3Store(configured)
            stores = artifact_store.ArtifactStores(artifact_store.DatabaseStore(), object_store)
        else:
            object_store = artifact_store.S3Store(to)
            if configured is not None and configured.rstrip("/") != to.rstrip("/"):
                fail(ExitCode.USAGE, f"--to {to} is not the service's object store (TUNECACHE_ARTIFACT_STORE={configured}): "
                                     "blobs are moved into the store the service reads")
            stores = artifact_store.ArtifactStores(object_store)
    except ValueError as exc:
        fail(ExitCode.USAGE, str(exc).splitlines()[0])
    target = stores.at("database" if to == "database" else object_store.location)
    url = database or Settings().resolved_database_url()
    engine = ready_engine(url)
    sessions = db.session_factory(engine)
    sessions.configure(info={"artifact_stores": stores})
    moved = size_moved = 0
    try:
        with sessions.begin() as session:
            todo = session.execute(select(ArtifactBlob.sha256, ArtifactBlob.size_bytes)
                                   .where(ArtifactBlob.location != target.location).order_by(ArtifactBlob.sha256)).all()
        typer.echo(f"moving {len(todo)} artifacts ({sum(size for _, size in todo):,} bytes) to {target.describe()}")
        for sha, size in todo:
            with sessions.begin() as session:
                source = artifact_store.move_blob(session, stores, sha, target)
            if source is None:
                continue
            if source != artifact_store.blobs.LOCATION:  # after the commit: the row names the target
                stores.at(source).delete(None, sha)
            moved += 1
            size_moved += size
            typer.echo(f"moved {sha} ({size:,} bytes) from {source}")
        with sessions.begin() as session:
            leftovers = artifact_store.delete_leftovers(session, stores)
    except (artifact_store.ArtifactStoreUnavailable, artifact_store.blobs.DigestMismatch) as exc:
        fail(ExitCode.SERVER_ERROR, f"{exc} ({moved} artifacts moved; run it again to go on)")
    except Exception as exc:
        store_errors(exc)
    finally:
        engine.dispose()
    typer.echo(f"moved {moved} artifacts ({size_moved:,} bytes) to {to}"
               + (f"; deleted {leftovers} copies an earlier move left behind" if leftovers else ""))
