"""``tunecache tune``: on a GPU node, the warmup and autotune stages for a model in a child
process, the run stored on a server (``--server``) or in a database (``--database``), and
with ``--warmup vllm`` its verification boot."""

from __future__ import annotations

import socket
import tempfile
from pathlib import Path
from typing import Annotated, Optional

import typer

from tunecache.cli_kit import (
    EngineArgsOpt,
    ExitCode,
    GemmBackendsOpt,
    KeyOptions,
    StagesOpt,
    csv_option,
    engine_args_option,
    fail,
    first_error,
    key_options,
    server_store,
)
from tunecache.contract import RunTrigger
from tunecache.service.cli.database import ready_engine, store_errors


@key_options(gpu="detected")
def tune(
    key_options: KeyOptions,
    config: Annotated[
        Optional[str],
        typer.Option(help="HF config: a directory with config.json, a JSON file, or a model type (default: --model)"),
    ] = None,
    server: Annotated[Optional[str], typer.Option("--server", help="store the run on this tunecache server")] = None,
    database: Annotated[
        Optional[str],
        typer.Option("--database", envvar="TUNECACHE_DATABASE_URL", help="store the run in this database directly"),
    ] = None,
    gemm_backends: GemmBackendsOpt = None,
    stages: StagesOpt = None,
    warmup: Annotated[str, typer.Option(help="'stages' (tunecache's own warmup stages) or 'vllm' (a boot of the node's vLLM, whose whole warm state is stored: the releases of docs/pods.md's table)")] = "stages",
    runner: Annotated[Optional[str], typer.Option(hidden=True, help="deprecated name of --warmup ('native': 'stages')")] = None,
    timeout: Annotated[float, typer.Option(min=1, help="seconds before the tuner process is killed")] = 3600.0,
    signing_key: Annotated[
        Optional[Path], typer.Option(envvar="TUNECACHE_SIGNING_KEY", help="sign the run with this Ed25519 key (tunecache keys generate)")
    ] = None,
    work_dir: Annotated[Optional[Path], typer.Option(help="keep the tuner's files here (default: a temporary directory)")] = None,
    verify: Annotated[bool, typer.Option(help="with --warmup vllm and --server: boot the stored run in a new vLLM "
                                              "process as a pod would and store what it still compiled")] = True,
    engine_args: EngineArgsOpt = None,
) -> None:
    """On a GPU node: run the warmup and autotune stages for a model and store the run.

    The stages run in a child process; the run is stored (on a server with --server, in a database with --database). A failure after the tuner found its GPU is stored as a failed run with the reason; before that (no CUDA device, no torch) nothing is stored, since without the GPU there is no key to file it under. Either way it exits 8 and says which. With --signing-key the run is signed: pods install its JIT modules only then. With --warmup vllm, --engine-args '{"max_model_len": 8192}' tunes that engine variant of the key.
    """
    from pydantic import ValidationError

    from tunecache.progress import ProgressDisplay
    from tunecache.service.tuner.model_config import ModelConfigError, load_hf_config
    from tunecache.service.tuner.process import TunerFailed, run_tuner
    from tunecache.service.tuner.stages import TuneSpec
    from tunecache.signing import SigningError, load_signing_key

    if runner is not None:  # the deprecated --runner native|vllm
        if runner not in ("native", "vllm"):
            fail(ExitCode.USAGE, "--runner must be 'native' or 'vllm'")
        warmup = "stages" if runner == "native" else runner
    if warmup not in ("stages", "vllm", "native"):  # 'native': the deprecated name of 'stages'
        fail(ExitCode.USAGE, "--warmup must be 'stages' or 'vllm'")
    warmup = "stages" if warmup == "native" else warmup
    if server is None and database is None:
        fail(ExitCode.USAGE, "give --server URL or --database URL (or set TUNECACHE_DATABASE_URL)")
    variant_args = engine_args_option(engine_args)
    if variant_args and warmup != "vllm":
        fail(ExitCode.USAGE, "--engine-args names an engine variant, which only --warmup vllm tunes")
    try:
        signer = load_signing_key(signing_key) if signing_key is not None else None
    except SigningError as exc:
        fail(ExitCode.BAD_INPUT, str(exc))
    try:
        hf_config = load_hf_config(config or key_options.model)
    except ModelConfigError as exc:
        fail(ExitCode.BAD_INPUT, str(exc))
    try:
        spec = TuneSpec(
            deployment=key_options.deployment(),
            hf_config=hf_config,
            gemm_backends=csv_option(gemm_backends),
            stages=csv_option(stages),
            warmup=warmup,
            engine_args=variant_args or {},
        )
    except ValidationError as exc:
        fail(ExitCode.USAGE, f"invalid option {first_error(exc)}")
    # --server wins over TUNECACHE_DATABASE_URL; nothing below asks which store it is.
    store = server_store(server) if server is not None else _sql_store(database)
    node = socket.gethostname()
    try:
        with tempfile.TemporaryDirectory(prefix="tunecache-tune-") as tmp:
            try:
                with ProgressDisplay() as progress:
                    result = run_tuner(spec, work_dir or Path(tmp), timeout, on_event=progress.update)
            except TunerFailed as failure:
                record = failure.run_record(spec, RunTrigger.CLI, node)
                if record is not None:
                    kept = f"recorded as failed run {store.record_run(record).id}"
                else:
                    kept = "no run recorded: the tuner failed before it found its GPU, so there is no key to file it under"
                # the tuner's log tail only where it ran (a node without a GPU: its one line says all)
                tail = f"\n{failure.log_tail}" if failure.started is not None and failure.log_tail else ""
                fail(ExitCode.TUNING_FAILED, f"{failure.message} ({kept}){tail}".rstrip())
            run = result.record(store, spec, RunTrigger.CLI, node, signer)
            typer.echo(
                f"stored run {run.id}: {result.summary['entries']} entries in {result.summary['tuning_seconds']:.1f} s "
                f"for {key_options.model} on {result.gpu_name} ({result.arch})"
            )
            if spec.warmup == "vllm" and verify:
                _verify(store, run.id, spec, server, (work_dir or Path(tmp)) / "verification", timeout, signer)
    except typer.Exit:
        raise
    except Exception as exc:
        store_errors(exc)
    finally:
        store.close()


def _verify(store, run_id: int, spec, server: str | None, scratch: Path, timeout: float, signer) -> None:
    """The run's verification boot (:mod:`tunecache.service.tuner.verification`), stored
    with the run and said in one line; with ``--database`` there is no server for the boot
    to fetch from, and that is said instead."""
    from tunecache.service.tuner.verification import shown, verify_run
    from tunecache.signing import format_public_key

    if server is None:
        typer.echo("not verified: a verification boot fetches the run from a server (--server)")
        return
    trusted = format_public_key(signer.public_key()) if signer is not None else None
    verification = verify_run(spec, server, scratch, timeout, trusted_keys=trusted)
    store.record_verification(run_id, verification)
    typer.echo(shown(verification))


def _sql_store(url: str):
    from tunecache.service import db
    from tunecache.service.store import SqlTuningStore

    from tunecache.service.assembly import server_trusted_keys
    from tunecache.service.settings import Settings

    return SqlTuningStore(db.session_factory(ready_engine(url)), owns_engine=True,
                          trusted_keys=server_trusted_keys(Settings()))
