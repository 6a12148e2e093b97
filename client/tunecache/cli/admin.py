"""The admin's commands of ``tunecache``: ``retune`` and ``job`` (tuning jobs), ``promote``,
``pin``/``unpin`` and ``retire`` (which run is current and kept), ``token`` (bearer tokens)
and ``keys`` (signing keys), registered on the ``tunecache`` app by :func:`register`.
Most need an admin token; ``retune`` a tune token.
"""

import json
import re
import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from pydantic import ValidationError

from tunecache.cli.client import client_for
from tunecache.cli.pod import options_key
from tunecache.cli_kit import (
    EngineArgsOpt,
    ExitCode,
    GemmBackendsOpt,
    KeyOptions,
    OutputUnwritable,
    ServerOpt,
    StagesOpt,
    client_errors,
    csv_option,
    engine_args_option,
    fail,
    first_error,
    key_options,
)
from tunecache.client.http import JobConflictError, ServerError, TunecacheClient
from tunecache.client.local_files import FileTooLarge, read_bounded
from tunecache.contract import (
    MAX_HF_CONFIG_BYTES,
    MAX_ID,
    TOKEN_NAME_PATTERN,
    TUNABLE_STAGES,
    JobStatus,
    Scope,
    TokenCreate,
    TuningJobCreate,
    TuningKey,
)
from tunecache.signing import SigningError, generate_signing_key, load_signing_key, sign_run
from tunecache.store import TunecacheError

#: The most ``retune --config`` reads of a model config file: its JSON, with the whitespace a
#: written file has, of at most :data:`~tunecache.contract.MAX_HF_CONFIG_BYTES` as a job sends it.
MAX_MODEL_CONFIG_FILE_BYTES = 4 * MAX_HF_CONFIG_BYTES

job_app = typer.Typer(help="Tuning jobs of a tunecache service (retune queues them).", no_args_is_help=True)
token_app = typer.Typer(help="Bearer tokens of a tunecache service (needs an admin token).", no_args_is_help=True)
keys_app = typer.Typer(help="Ed25519 signing keys of tuner nodes (their public keys go to pods).", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    """Add ``retune``, ``job``, ``promote``, ``pin``, ``unpin``, ``token``, ``keys`` and ``retire`` to ``app``,
    in the order ``tunecache --help`` lists them."""
    app.command()(retune)
    app.add_typer(job_app, name="job")
    for command in (promote, pin, unpin):
        app.command()(command)
    app.add_typer(token_app, name="token")
    app.add_typer(keys_app, name="keys")
    app.command()(retire)


@key_options(gpu="required")
def retune(
    server: ServerOpt,
    key_options: KeyOptions,
    config: Annotated[
        Optional[Path], typer.Option(help="the model's HF config.json (or its directory), sent with the job; "
                                      "this or --node-config is needed")
    ] = None,
    node_config: Annotated[bool, typer.Option(
        "--node-config", help="send no config: the GPU node has the model's config.json in its "
                              "TUNECACHE_MODEL_CONFIG_DIR (<dir>/<org>/<name>/config.json)")] = False,
    gemm_backends: GemmBackendsOpt = None,
    stages: StagesOpt = None,
    warmup: Annotated[str, typer.Option(help="'stages' (tunecache's own warmup stages) or 'vllm' (vLLM's own boot on the "
                                             "GPU node: the whole warm state)")] = "stages",
    engine_args: EngineArgsOpt = None,
    vllm_version: Annotated[Optional[str], typer.Option(
        "--vllm-version", help="only a job worker whose image has this vLLM takes the job: an upgrade tuned before "
                               "the first pod of the new image boots")] = None,
    wait: Annotated[bool, typer.Option("--wait", help="follow the job to its end with a progress bar")] = False,
    wait_timeout: Annotated[float, typer.Option(min=0, help="seconds to wait with --wait")] = 7200.0,
    poll: Annotated[float, typer.Option(min=0.05, help="seconds between polls with --wait")] = 2.0,
    require_worker: Annotated[bool, typer.Option(
        "--require-worker", help="queue nothing and exit 17 when no live GPU worker for the key's GPU has been "
                                 "seen (default: say so in one line and queue the job anyway)")] = False,
) -> None:
    """Ask the service to (re-)tune a key on a GPU node; one job per key however many ask.

    The GPU node needs the model's config.json: --config sends it with the job, --node-config says the node has it in its TUNECACHE_MODEL_CONFIG_DIR as <dir>/<org>/<name>/config.json (one of the two is required: exit 2).

    --warmup vllm boots vLLM on the GPU node and stores its whole warm state; --engine-args '{"max_model_len": 8192}' tunes that engine variant of the key (pods booted with those arguments get its compile cache); --vllm-version 0.26.0 leaves the job to a job worker whose image has that vLLM (an upgrade tuned before its first pod boots).

    A job already queued or running for the key is joined when it has the same options (config, --stages, --gemm-backends, --warmup, --engine-args); with other options nothing is queued and the command names that job and what differs (exit 15): wait for it, or cancel it with `tunecache job cancel ID`.

    When no live GPU worker for the key's GPU and arch has been seen, one line says so and the job stays queued; with --require-worker the command exits 17 instead and queues nothing.

    --wait exits 0 when the job succeeded, 8 when it failed, 16 when it was cancelled, 10 when --wait-timeout passed (the job goes on).
    """
    key = options_key(key_options)
    hf_config = None
    if config is not None:
        path = config / "config.json" if config.is_dir() else config
        try:
            hf_config = json.loads(read_bounded(path, MAX_MODEL_CONFIG_FILE_BYTES))
        except FileTooLarge:
            fail(ExitCode.BAD_INPUT, f"model config {path} is over {MAX_MODEL_CONFIG_FILE_BYTES:,} bytes; a job's model "
                                     f"config is at most {MAX_HF_CONFIG_BYTES:,} bytes as JSON")
        except (OSError, ValueError) as exc:
            fail(ExitCode.BAD_INPUT, f"cannot read model config {path}: {exc}")
        if not isinstance(hf_config, dict):
            fail(ExitCode.BAD_INPUT, f"model config {path} is not a JSON object")
    if stages is not None and not csv_option(stages):
        fail(ExitCode.USAGE, f"--stages is empty (choose from {', '.join(TUNABLE_STAGES)}, or leave it out for all)")
    unknown = sorted(set(csv_option(stages) or []) - set(TUNABLE_STAGES))
    if unknown:
        fail(ExitCode.USAGE, f"unknown stages {', '.join(unknown)} (choose from {', '.join(TUNABLE_STAGES)})")
    if config is not None and node_config:
        fail(ExitCode.USAGE, "--config sends the model's config.json and --node-config says the node has it: give one")
    if config is None and not node_config:
        fail(ExitCode.USAGE, f"the GPU node needs the config.json of {key.model[:200]!r}: give --config FILE|DIR to send it "
                             f"with the job, or --node-config if the node has it in its TUNECACHE_MODEL_CONFIG_DIR "
                             f"(<dir>/{key.model[:200]}/config.json)")
    if warmup not in ("stages", "vllm"):
        fail(ExitCode.USAGE, "--warmup must be 'stages' or 'vllm'")
    variant_args = engine_args_option(engine_args)
    if variant_args and warmup != "vllm":
        fail(ExitCode.USAGE, "--engine-args names an engine variant, which only --warmup vllm tunes")
    try:
        request = TuningJobCreate(key=key, hf_config=hf_config, gemm_backends=csv_option(gemm_backends),
                                  stages=csv_option(stages), warmup=warmup, engine_args=variant_args,
                                  vllm_version=vllm_version)
    except ValidationError as exc:
        fail(ExitCode.USAGE, f"invalid job: {first_error(exc)}")
    gpu = f"{key.gpu_name} ({key.arch})"
    with client_for(server) as client:
        try:
            workers = None
            if require_worker:
                workers = client.workers(key.gpu_name, key.arch)
                if not workers.live_for(key.gpu_name, key.arch):
                    fail(ExitCode.NO_WORKER, f"no GPU worker for {gpu} has been seen in the last "
                                             f"{workers.live_window_s:g} s; nothing was queued")
            try:
                job = client.create_job(request)
            except JobConflictError as exc:
                c = exc.conflict
                fail(ExitCode.JOB_CONFLICT, f"job {c.job_id} is already {c.job_status} for this key with other options "
                                            f"({'; '.join(str(d) for d in c.differences)}); wait for it, or cancel it "
                                            f"(tunecache job cancel {c.job_id}) and ask again")
            typer.echo(f"job {job.id}: {job.status} ({key.model}, {key.gpu_name}, max_num_batched_tokens {key.max_num_batched_tokens})")
            if job.status is JobStatus.QUEUED:
                _say_when_no_worker_will_take(client, workers, key, node_config, vllm_version)
            if not wait:
                return
            deadline = time.monotonic() + wait_timeout
            from tunecache.progress import ProgressDisplay

            with ProgressDisplay() as progress:
                while job.status.active:
                    if time.monotonic() > deadline:
                        fail(ExitCode.WAIT_TIMEOUT, f"job {job.id} still {job.status} after {wait_timeout:g} s")
                    time.sleep(poll)
                    job = client.get_job(job.id)
                    progress.update_from_job(job)
            run = client.get_run(job.run_id) if job.status is JobStatus.SUCCEEDED and job.run_id else None
        except Exception as exc:
            client_errors(exc)
    if job.status is JobStatus.FAILED:
        fail(ExitCode.TUNING_FAILED, f"job {job.id} failed: {job.error}")
    if job.status is JobStatus.CANCELLED:
        by = f" by {job.cancelled_by}" if job.cancelled_by else ""
        fail(ExitCode.JOB_CANCELLED, f"job {job.id} was cancelled{by} before it finished; the previous tuning stays current")
    if run is None or run.is_current:
        became = "is current"
    elif run.held:
        became = f"is held back from being current: {run.held}"
    elif run.variant and run.summary.get("engine_args"):
        became = f"is current for its engine variant {run.variant}"
    else:
        became = "is not current"
    typer.echo(f"job {job.id}: succeeded in {job.duration_s or 0:.1f} s; run {job.run_id} {became}")


def _say_when_no_worker_will_take(client: TunecacheClient, workers, key: TuningKey, node_config: bool,
                                  vllm_version: str | None = None) -> None:
    """One line on stderr when no live GPU worker for the key's GPU has been seen (the job
    stays queued), or, for a job without a config, when none of them has a model config
    directory. Says nothing when the server cannot tell (an older server without
    ``GET /v1/workers``)."""
    gpu = f"{key.gpu_name} ({key.arch})"
    if workers is None:
        try:
            workers = client.workers(key.gpu_name, key.arch)
        except TunecacheError:
            return
    live = workers.live_for(key.gpu_name, key.arch)
    if not live:
        typer.echo(f"tunecache: no GPU worker for {gpu} has been seen in the last {workers.live_window_s:g} s; "
                   f"the job stays queued", err=True)
    elif vllm_version and not any(w.vllm_version == vllm_version for w in live):
        typer.echo(f"tunecache: no live GPU worker for {gpu} runs vLLM {vllm_version} (they run "
                   f"{', '.join(sorted({w.vllm_version or 'no vLLM' for w in live}))}); the job stays queued until one "
                   "of that image comes", err=True)
    elif node_config and not any(w.model_config_dir for w in live):
        typer.echo(f"tunecache: warning: no live GPU worker for {gpu} has a model config directory "
                   f"(TUNECACHE_MODEL_CONFIG_DIR): the job fails unless one with the config.json of {key.model[:200]!r} takes it",
                   err=True)




@job_app.command("cancel")
def job_cancel(
    server: ServerOpt,
    job_id: Annotated[int, typer.Argument(min=1, max=MAX_ID, help="the job's id (retune prints it)")],
) -> None:
    """Cancel a tuning job (needs an admin token).

    A queued job is cancelled at once; a running one is stopped by its worker within seconds (the tuner's process is terminated), with no run recorded, so the previous tuning stays current. Cancelling a cancelled job changes nothing. Exit 15 when the job already succeeded or failed, 5 when there is no such job.
    """
    with client_for(server) as client:
        try:
            job = client.cancel_job(job_id)
        except ServerError as exc:
            if exc.status_code == 409:
                fail(ExitCode.JOB_CONFLICT, str(exc.detail))
            client_errors(exc)
        except TunecacheError as exc:
            client_errors(exc)
    if job.status is JobStatus.RUNNING:
        typer.echo(f"job {job.id}: running on {job.worker}; cancellation requested, its worker stops the tuner within seconds")
    else:
        typer.echo(f"job {job.id}: {job.status}")


def promote(
    server: ServerOpt,
    run_id: Annotated[int, typer.Argument(min=1, max=MAX_ID, help="the run to make current (history lists them)")],
    signing_key: Annotated[Optional[Path], typer.Option(
        help="sign the run anew with this Ed25519 key (a key the pods trust): pods that installed a newer run "
             "take it, which they otherwise refuse as a replayed older one")] = None,
) -> None:
    """Make a run the current tuning of its key and environment (needs an admin token).

    Rolls a key back to an earlier run, or takes a run the promotion policy held. The run must have succeeded, be a tuner's or an admin's, and, when the service has trusted keys, be signed by one of them; pods install it at their next lookup. Pods never move back to a run signed before one they installed: for a roll back, sign it anew with --signing-key. Exit 15 when it cannot be current (the reason is printed), 5 when there is no such run.
    """
    private = None
    if signing_key is not None:
        try:
            private = load_signing_key(signing_key)
        except SigningError as exc:
            fail(ExitCode.USAGE, str(exc))
    with client_for(server) as client:
        try:
            signature = None
            if private is not None:
                run = client.get_run(run_id)
                signature = sign_run(private, run.key, run.environment, run.artifacts, run.summary)
            run = client.promote_run(run_id, signature)
        except ServerError as exc:
            if exc.status_code == 409:
                fail(ExitCode.JOB_CONFLICT, str(exc.detail))
            client_errors(exc)
        except TunecacheError as exc:
            client_errors(exc)
    typer.echo(f"run {run.id} is current for {run.key.model} on {run.key.gpu_name} "
               f"(max_num_batched_tokens {run.key.max_num_batched_tokens})"
               + (f", signed anew by {run.signature.key_id}" if signature is not None and run.signature else ""))


def pin(
    server: ServerOpt,
    run_id: Annotated[int, typer.Argument(min=1, max=MAX_ID, help="the run to keep (history lists them)")],
) -> None:
    """Pin a run: retention never deletes it (needs an admin token).

    Retention (TUNECACHE_RUN_RETENTION) keeps a pinned run however many runs of its key come after it: a known-good run to roll back to.

    Pinning a pinned run changes nothing. Exit 5 when there is no such run (or retention already deleted it).
    """
    _set_pin(server, run_id, pinned=True)


def unpin(
    server: ServerOpt,
    run_id: Annotated[int, typer.Argument(min=1, max=MAX_ID, help="the pinned run (history lists them)")],
) -> None:
    """Unpin a run: retention keeps or deletes it as any other run from its next pass (needs an admin token).

    Unpinning a run that is not pinned changes nothing. Exit 5 when there is no such run.
    """
    _set_pin(server, run_id, pinned=False)


def _set_pin(server: str, run_id: int, pinned: bool) -> None:
    """Pin or unpin a run and say what retention now does with it."""
    with client_for(server) as client:
        try:
            run = client.pin_run(run_id) if pinned else client.unpin_run(run_id)
        except TunecacheError as exc:
            client_errors(exc)
    said = "pinned: retention never deletes it" if pinned else "unpinned: retention keeps or deletes it as any other run"
    typer.echo(f"run {run.id} of {run.key.model} on {run.key.gpu_name} is {said}")




@token_app.command("create")
def token_create(
    server: ServerOpt,
    name: Annotated[str, typer.Option("--name", help="unique name, e.g. gpu-node-1 or pod-fleet")],
    scope: Annotated[Scope, typer.Option("--scope", help="read, push (pods' push-back), tune (GPU nodes), admin")],
) -> None:
    """Create a token and print it (the service keeps only its hash: this is the one time it is shown)."""
    try:
        TokenCreate(name=name, scope=scope)
    except ValidationError as exc:
        fail(ExitCode.USAGE, f"invalid token: {first_error(exc)}")
    with client_for(server) as client:
        try:
            created = client.create_token(name, scope)
        except TunecacheError as exc:
            client_errors(exc)
        try:
            typer.echo(created.token)
        except OutputUnwritable as exc:  # its only copy is lost: a live token nobody holds
            _revoke_undelivered(client, created.name, exc)
    typer.echo(f"token {created.name!r} ({created.scope}) created; store it now, it is not shown again", err=True)


def _revoke_undelivered(client: TunecacheClient, name: str, exc: OutputUnwritable) -> None:
    """Revoke token ``name``, which ``token create`` could not print, and exit 12 saying so."""
    try:
        client.revoke_token(name)
    except TunecacheError as error:
        fail(ExitCode.INSTALL_FAILED, f"{exc}; token {name!r} was lost and could not be revoked ({error}): "
                                      f"revoke it (tunecache token revoke {name})")
    fail(ExitCode.INSTALL_FAILED, f"{exc}; token {name!r} was revoked (its only copy was lost): create another")


@token_app.command("list")
def token_list(server: ServerOpt) -> None:
    """List tokens: name, scope, created, last used, revoked (never secrets)."""
    with client_for(server) as client:
        try:
            listed = client.list_tokens()
        except TunecacheError as exc:
            client_errors(exc)
    for t in listed:
        used = t.last_used_at.isoformat(timespec="minutes") if t.last_used_at else "never"
        state = f"revoked {t.revoked_at.isoformat(timespec='seconds')}" if t.revoked_at else "live"
        typer.echo(f"{t.name}\t{t.scope}\tcreated {t.created_at.isoformat(timespec='seconds')}\tlast used {used}\t{state}")


@token_app.command("revoke")
def token_revoke(server: ServerOpt, name: Annotated[str, typer.Argument(help="the token's name")]) -> None:
    """Revoke a token: writes with it fail at once, reads within the service's token cache time."""
    if not re.fullmatch(TOKEN_NAME_PATTERN, name):
        fail(ExitCode.USAGE, f"token name {name[:80]!r}: letters, digits and _ . @ - only, at most 64, not starting with a symbol")
    with client_for(server) as client:
        try:
            revoked = client.revoke_token(name)
        except TunecacheError as exc:
            client_errors(exc)
    typer.echo(f"token {revoked.name!r} revoked")




@keys_app.command("generate")
def keys_generate(
    out: Annotated[Path, typer.Option("--out", help="directory for signing.key (0600) and signing.pub")],
) -> None:
    """Make a tuner node's signing key.

    Give the node TUNECACHE_SIGNING_KEY=<out>/signing.key and the pods the line of signing.pub in TUNECACHE_TRUSTED_KEYS. Never overwrites a key (exit 7).
    """
    try:
        generated = generate_signing_key(out)
    except (SigningError, OSError) as exc:
        fail(ExitCode.BAD_INPUT, str(exc))
    typer.echo(generated.public_path.read_text().strip())
    typer.echo(f"key {generated.key_id}: private key in {generated.private_path} (keep it on the tuner node), "
               f"public key in {generated.public_path}", err=True)


def retire(
    server: ServerOpt,
    run_id: Annotated[int, typer.Argument(min=1, max=MAX_ID, help="the run to take out of use (history lists them)")],
) -> None:
    """Retire a run: never current or served again, kept for the history (needs an admin token; audited).

    Where it was current, the newest usable run of its key and environment recorded before it takes its place (succeeded, not a pod's, not held, not retired), else none does and pods miss until a run is recorded or promoted; the line says which. A retired run cannot be promoted. Retiring a retired run changes nothing. Exit 5 when there is no such run, 13 without an admin token.
    """
    with client_for(server) as client:
        try:
            retired = client.retire_run(run_id)
        except TunecacheError as exc:
            client_errors(exc)
    run, current = retired.run, retired.current_run_id
    instead = (f"run {current} is current in its place" if current is not None
               else "no run is current for its key now")
    typer.echo(f"run {run.id} of {run.key.model} on {run.key.gpu_name} is retired: never served again; {instead}")
