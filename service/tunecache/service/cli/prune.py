"""``tunecache prune``: one retention pass now (:func:`tunecache.service.retention.run_pass`),
or what it would delete (``--dry-run``)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from tunecache.cli_kit import ExitCode, fail
from tunecache.service.cli.database import DatabaseOpt, ready_engine, store_errors


def prune(
    database: DatabaseOpt = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="say what would be deleted, delete nothing")] = False,
    keep: Annotated[
        Optional[str], typer.Option(help="runs kept per key and environment, or 'off' (default: TUNECACHE_RUN_RETENTION, 10)")
    ] = None,
) -> None:
    """Run one retention pass now.

    It deletes runs past the retention (never the current, a pinned or a job's run, nor one recorded within TUNECACHE_RETENTION_GRACE_SECONDS), the blobs no run refers to any more, and this node's mirrored files of deleted blobs and past TUNECACHE_MIRROR_MAX_BYTES. The service does the same by itself every TUNECACHE_RETENTION_INTERVAL_SECONDS; this is for an operator who wants it now, or to see first what it would delete (--dry-run).
    """
    from pydantic import ValidationError

    from tunecache.service import db
    from tunecache.service.artifact_files import ArtifactFiles
    from tunecache.service.assembly import retention_policy
    from tunecache.service.retention import run_pass
    from tunecache.service.settings import Settings, variable_name

    overrides = {"database_url": database} if database else {}
    if keep is not None:
        overrides["run_retention"] = keep
    try:
        settings = Settings(**overrides)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = str(error["loc"][0]) if error["loc"] else ""
        message = error["msg"].removeprefix("Value error, ")
        where = "--keep" if field == "run_retention" and keep is not None else f"{field} ({variable_name(field)})"
        fail(ExitCode.USAGE, f"invalid {where}: {message}")
    engine = ready_engine(settings.resolved_database_url())
    mirror = settings.artifact_cache_dir
    try:
        report = run_pass(db.session_factory(engine), ArtifactFiles(mirror) if mirror.is_dir() else None,
                          retention_policy(settings), dry_run=dry_run)
    except Exception as exc:
        store_errors(exc)
    finally:
        engine.dispose()
    typer.echo(f"{'would delete' if dry_run else 'deleted'} {report.line()}")
    for line in report.details():  # the runs' ids; a dry run's kept blobs and why
        typer.echo(line)
