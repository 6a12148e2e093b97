"""What an operator carries between services (``tunecache export`` and ``tunecache import``):
signed runs carried to a service that has no route to the one they were tuned by, as an OCI
image layout or through an OCI registry (:mod:`tunecache.client.bundle_transfer`); registered
on the ``tunecache`` app by :func:`register`. Both need the client's ``oci`` extra (``pip install 'tunecache-client[oci]'``:
oras-py), imported only when one of them runs."""

from __future__ import annotations

import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Iterator, Optional

import typer

from tunecache.cli.client import client_for
from tunecache.cli_kit import ExitCode, ServerOpt, client_errors, fail
from tunecache.contract import MAX_ID
from tunecache.store import TunecacheError
from tunecache.transfer_progress import QuietOpt, transfer_progress

LayoutOpt = Annotated[Optional[Path], typer.Option("--layout", help="an OCI image layout directory")]
RegistryOpt = Annotated[Optional[str], typer.Option(
    "--registry", help="an OCI registry reference, REGISTRY/REPOSITORY[:TAG] (credentials: those docker login or "
                       "oras login stored)")]
PlainHttpOpt = Annotated[bool, typer.Option("--plain-http", help="the registry speaks HTTP, not HTTPS")]
TagOpt = Annotated[str, typer.Option("--tag", help="the bundle's name inside the layout (index.json's ref.name)")]


def _oci():
    """The bundle modules, or exit 2 saying how to install them."""
    try:
        from tunecache.client import bundle_transfer, oci_bundle, oci_registry
    except ImportError as exc:
        fail(ExitCode.USAGE, f"export and import need oras-py ({(exc.name or 'oras').split('.')[0]} is not installed): "
                             "pip install 'tunecache-client[oci]'")
    return bundle_transfer, oci_bundle, oci_registry


def _one_place(layout: Path | None, registry: str | None) -> None:
    if (layout is None) == (registry is None):
        fail(ExitCode.USAGE, "name one place for the bundle: --layout DIR or --registry REGISTRY/REPOSITORY[:TAG]")


@contextmanager
def _scratch(prefix: str) -> Iterator[Path]:
    """A directory for a layout on its way to or from a registry, removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path / "layout"
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _bundle_errors(exc: Exception, oci_bundle, oci_registry) -> None:
    """Exit 7 for a bundle that is not one or goes past a bound, 13 for a registry that refuses
    the credentials; else as the client's errors (a registry's error answer: 5)."""
    if isinstance(exc, oci_bundle.BadBundle):
        fail(ExitCode.BAD_INPUT, str(exc))
    if isinstance(exc, oci_registry.RegistryRefused):
        fail(ExitCode.NOT_AUTHORISED, str(exc))
    if isinstance(exc, OSError):
        fail(ExitCode.BAD_INPUT, f"{exc.filename or 'the bundle'}: {exc.strerror}")
    client_errors(exc)


def export(
    server: ServerOpt,
    layout: LayoutOpt = None,
    registry: RegistryOpt = None,
    run: Annotated[Optional[list[int]], typer.Option("--run", min=1, max=MAX_ID, help="a run to carry (repeat it)")] = None,
    model: Annotated[Optional[list[str]], typer.Option("--model", help="carry the current runs of this model's keys "
                                                                        "(repeat it)")] = None,
    every_key: Annotated[bool, typer.Option("--all", help="carry the current run of every key")] = False,
    gpu_name: Annotated[Optional[str], typer.Option("--gpu-name", help="only keys of this GPU")] = None,
    max_num_batched_tokens: Annotated[Optional[int], typer.Option(
        "--max-num-batched-tokens", min=1, help="only keys of this max_num_batched_tokens")] = None,
    plain_http: PlainHttpOpt = False,
    tag: TagOpt = "latest",
    quiet: QuietOpt = False,
) -> None:
    """Write signed runs, their artifacts and signatures to an OCI image layout or an OCI registry, for a service with no route to this one (tunecache import there).

    Carries the runs named with --run and the current run of each key of --model (or --all), narrowed by --gpu-name and --max-num-batched-tokens. Every run must be signed: the importing service records only runs signed by a key it trusts. --layout DIR must be new or empty. Exit 3 when nothing matches, 14 for an unsigned run, 7 for a layout that cannot be written; nothing is left behind on a failure.
    """
    _one_place(layout, registry)
    if not (run or model or every_key):
        fail(ExitCode.USAGE, "choose runs: --run ID, --model MODEL or --all")
    if layout is not None and layout.exists() and (not layout.is_dir() or any(layout.iterdir())):
        fail(ExitCode.BAD_INPUT, f"{layout} exists and is not an empty directory: a bundle is written into a new one")
    bundle_transfer, oci_bundle, oci_registry = _oci()
    filters = {name: value for name, value in (("gpu_name", gpu_name), ("max_num_batched_tokens", max_num_batched_tokens))
               if value is not None}
    with client_for(server) as client:
        try:
            runs = bundle_transfer.chosen_runs(client, run or [], model or [], filters, every_key)
        except bundle_transfer.UnsignedRun as exc:
            fail(ExitCode.UNTRUSTED_RUN, f"{exc}; nothing was exported")
        except Exception as exc:
            _bundle_errors(exc, oci_bundle, oci_registry)
        if not runs:
            fail(ExitCode.NO_COMPATIBLE_TUNING, "no current run matches: nothing was exported")

        def said(chosen, written: int) -> None:
            typer.echo(f"run {chosen.id} of {chosen.key.model} on {chosen.key.gpu_name} "
                       f"(max_num_batched_tokens {chosen.key.max_num_batched_tokens}): {len(chosen.artifacts)} "
                       f"artifacts, {written:,} bytes, signed by {chosen.signature.key_id}")

        with _scratch("tunecache-export-") as scratch:
            root = layout if layout is not None else scratch
            fresh = not root.exists()
            try:
                with transfer_progress(client, "exporting", quiet):
                    digest, written = bundle_transfer.write_bundle(client, runs, root, tag, said)
                if registry is not None:
                    oci_registry.push_layout(root, registry, plain_http, tag)
            except Exception as exc:
                if layout is not None:
                    _remove_written(layout, fresh)
                _bundle_errors(exc, oci_bundle, oci_registry)
    where = f"layout {layout} (tag {tag})" if layout is not None else f"registry {registry}"
    typer.echo(f"exported {len(runs)} run{'s' if len(runs) != 1 else ''} ({written:,} bytes of artifacts) to {where}: "
               f"bundle {digest}")


def _remove_written(root: Path, fresh: bool) -> None:
    """What an export that failed wrote into ``root`` (the directory too when it made it)."""
    if fresh:
        shutil.rmtree(root, ignore_errors=True)
        return
    for name in ("blobs", "index.json", "oci-layout"):
        path = root / name
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() and not path.is_symlink() else path.unlink(missing_ok=True)


def import_(
    server: ServerOpt,
    layout: LayoutOpt = None,
    registry: RegistryOpt = None,
    plain_http: PlainHttpOpt = False,
    tag: Annotated[Optional[str], typer.Option("--tag", help="the bundle's name inside the layout (default: its only "
                                                             "one)")] = None,
    quiet: QuietOpt = False,
) -> None:
    """Record the runs of a bundle (tunecache export) in this service, each only where its signature checks against this service's trusted keys (TUNECACHE_TRUSTED_KEYS on the server); needs a tune or admin token.

    Each run keeps its signature, so pods that trust the key that signed it install it as a run tuned here; artifacts the service already holds are not sent again, and a run already current here with the same signature is left as it is. The bundle is checked before anything is sent: a file that is a link, not of its size or digest, or past a bound refuses the whole bundle (exit 7). A run this service does not trust is refused and nothing of it is stored (exit 14, after the others are imported).
    """
    _one_place(layout, registry)
    bundle_transfer, oci_bundle, oci_registry = _oci()
    with _scratch("tunecache-import-") as scratch:
        try:
            if registry is not None:
                oci_registry.pull_layout(registry, scratch, plain_http)
            entries = oci_bundle.read_layout(scratch if registry is not None else layout,
                                             None if registry is not None else tag)
        except Exception as exc:
            _bundle_errors(exc, oci_bundle, oci_registry)
        refused = []
        with client_for(server) as client, transfer_progress(client, "importing", quiet):
            for entry in entries:
                source = f"run {entry.record.source_run_id} of {entry.record.run.key.model}"
                try:
                    imported = bundle_transfer.import_run(client, entry)
                except bundle_transfer.ImportRefused as exc:
                    typer.echo(f"tunecache: {source} refused: {exc}", err=True)
                    refused.append(entry)
                    continue
                except TunecacheError as exc:
                    client_errors(exc)
                run = imported.run
                state = ("already current here, left as it is" if imported.already
                         else "current" if run.is_current else f"recorded, not current: {run.held}")
                sent = "" if imported.already else f"; {imported.uploaded:,} bytes uploaded"
                typer.echo(f"{source} -> run {run.id} ({state}{sent}; signed by "
                           f"{run.signature.key_id if run.signature else '-'})")
    if refused:
        fail(ExitCode.UNTRUSTED_RUN, f"{len(refused)} of {len(entries)} runs refused: this service does not trust "
                                     "the keys that signed them (TUNECACHE_TRUSTED_KEYS on the server)")
    typer.echo(f"imported {len(entries)} run{'s' if len(entries) != 1 else ''}")


def register(app: typer.Typer) -> None:
    """Add ``export`` and ``import`` to ``app``."""
    app.command("export")(export)
    app.command("import")(import_)
