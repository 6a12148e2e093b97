"""``tunecache`` command line (typer): the pod commands, and the whole command.

``tunecache-client`` brings the pod commands (``pull``, ``push``, ``doctor``, ``retune``,
...), built with the command kit (:mod:`tunecache.cli_kit`: the root app, exit codes,
shared options). Other distributions add commands through the ``tunecache.cli``
entry-point group: each entry is a function that takes the typer app and registers its
commands on it (``tunecache-server`` adds ``serve``, ``db``, ``prune`` and ``tune``). This
module never imports them by name: with only the client installed, ``tunecache --help``
lists the pod commands. ``python -m tunecache.cli`` runs the whole command as the
``tunecache`` console script does (:func:`main`).

Exit codes: :class:`tunecache.cli_kit.ExitCode` (also in docs/pods.md).
"""

import datetime as dt
import enum
import hashlib
import inspect
import json
import re
import socket
import sys
import time
from importlib.metadata import entry_points
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from pydantic import ValidationError

from tunecache import cli_jobs, cli_kit, cli_retire, cli_show, cli_status
from tunecache.client.autotune_file import pushed_run
from tunecache.formats.autotune_file import NotAnAutotuneFile, check_loadable, parse_autotune_file
from tunecache.client.environment import EnvironmentUnavailable, detect_environment, environment_from_file, pod_key
from tunecache.client.http import JobConflictError, ServerError, TunecacheClient
from tunecache.client.local_files import FileTooLarge, read_bounded
from tunecache.client.layouts import FlashInferFile, FlashInferV2Store, VllmRankFiles, check_file_name
from tunecache.client.pipeline import WARM_STATE, InstallTarget
from tunecache.client.install import (
    default_file_name,
    fetch_and_install,
)
from tunecache.formats.jit_module import BadJitArtifact
from tunecache.client.warm_state import BadWarmStateArtifact
from tunecache.engines.vllm.paths import vllm_rank_file_name
from tunecache.contract import (
    TOKEN_NAME_PATTERN,
    TUNABLE_STAGES,
    ENVIRONMENT_FIELDS,
    FLEET_PAGE_DEFAULT,
    FLEET_MAX_HOURS,
    FLEET_PAGE_MAX,
    MAX_ID,
    MAX_AUTOTUNE_FILE_BYTES,
    MAX_HF_CONFIG_BYTES,
    ArtifactKind,
    JobStatus,
    ReportSource,
    RunTrigger,
    Scope,
    TokenCreate,
    TuningJobCreate,
    TuningKey,
    TuningRunDiff,
    TuningRunQuery,
)
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
    given_token,
    key_options,
    new_app,
    with_options,
)
from tunecache.cli_client import client_for, client_settings
from tunecache.transfer_progress import QuietOpt, transfer_progress
from tunecache.signing import SigningError, UntrustedRun, generate_signing_key, load_signing_key, load_trusted_keys, sign_run
from tunecache.store import NoCompatibleTuning, TunecacheError

#: The most ``retune --config`` reads of a model config file: its JSON, with the whitespace a
#: written file has, of at most :data:`~tunecache.contract.MAX_HF_CONFIG_BYTES` as a job sends it.
MAX_MODEL_CONFIG_FILE_BYTES = 4 * MAX_HF_CONFIG_BYTES

#: Entry-point group through which other distributions add commands to ``tunecache``.

COMMAND_PLUGINS_GROUP = "tunecache.cli"



app = new_app()

EnvironmentOpt = Annotated[
    Optional[Path],
    typer.Option(help="FlashInfer cache file or JSON of its _metadata fields (default: detect with FlashInfer)"),
]


def options_key(options: KeyOptions, gpu_name: str | None = None) -> TuningKey:
    """The key of a command's key options (:func:`tunecache.client.environment.pod_key`): the
    GPU ``--gpu-name``, else ``gpu_name`` (the environment's ``gpu``); the arch ``--arch``,
    else detected; or exit 2 naming the bad field."""
    try:
        return pod_key(options.gpu_name or gpu_name, options.model, options.max_num_batched_tokens, arch=options.arch,
                       dtype=options.dtype, quantization=options.quantization,
                       tensor_parallel_size=options.tensor_parallel_size,
                       data_parallel_size=options.data_parallel_size,
                       expert_parallel_size=options.expert_parallel_size)
    except EnvironmentUnavailable as exc:
        fail(ExitCode.USAGE, str(exc))
    except ValidationError as exc:
        fail(ExitCode.USAGE, f"invalid key: {first_error(exc)}")


def environment_option(path: Path | None):
    """The environment from ``--environment FILE`` (exit 7 if unusable), else detected with
    FlashInfer (exit 2 if FlashInfer is missing: the user must pass the file)."""
    try:
        return environment_from_file(path) if path else detect_environment()
    except EnvironmentUnavailable as exc:
        fail(ExitCode.BAD_INPUT if path else ExitCode.USAGE, str(exc))


@app.command()
@key_options()
def push(
    file: Annotated[Path, typer.Argument(help="FlashInfer autotune cache file (AutoTuner.save_configs output)")],
    server: ServerOpt,
    key_options: KeyOptions,
    trigger: Annotated[str, typer.Option(help="'upload', or 'pod' for a pod's own tuning (stored unverified)")] = "upload",
    force: Annotated[bool, typer.Option("--force", help="make it current past the service's promotion policy "
                                        "(admin token; audited)")] = False,
    quiet: QuietOpt = False,
) -> None:
    """Upload a FlashInfer autotune cache file; its environment is read from its _metadata.

    The run becomes current unless the service's promotion policy holds it (not signed by a key the service trusts, fewer entries than the current run, a regression against it): then it is stored, not current, and the reason is printed (--force, or promote, passes it).
    """
    try:
        size = file.stat().st_size
        if size > MAX_AUTOTUNE_FILE_BYTES:  # unread: the service refuses its record (422), after the upload
            fail(ExitCode.BAD_INPUT, f"{file} is {size:,} bytes; a FlashInfer autotune file is at most "
                                     f"{MAX_AUTOTUNE_FILE_BYTES:,} bytes (the most the service reads of one); "
                                     "nothing was uploaded")
        data = read_bounded(file, MAX_AUTOTUNE_FILE_BYTES)  # a pipe or a device reports no size to stat
        parsed = check_loadable(data, source=str(file))
    except FileTooLarge:
        fail(ExitCode.BAD_INPUT, f"{file} is over {MAX_AUTOTUNE_FILE_BYTES:,} bytes; a FlashInfer autotune file is "
                                 "at most that (the most the service reads of one); nothing was uploaded")
    except OSError as exc:
        fail(ExitCode.BAD_INPUT, f"cannot read {file}: {exc.strerror}")
    except NotAnAutotuneFile as exc:
        fail(ExitCode.BAD_INPUT, str(exc))
    if parsed.environment.indeterminate_fields():
        fail(ExitCode.BAD_INPUT, f"{file}: FlashInfer could not detect {', '.join(parsed.environment.indeterminate_fields())} "
             "where it was tuned, so no FlashInfer would load it; nothing was uploaded")
    if trigger not in (RunTrigger.UPLOAD, RunTrigger.POD):
        fail(ExitCode.USAGE, "--trigger must be 'upload' or 'pod'")
    key = options_key(key_options, parsed.environment.gpu)
    try:  # the record's own rules (a key no pod could ask for, another GPU's file) before any upload
        record = pushed_run(key, parsed, hashlib.sha256(data).hexdigest(), trigger, socket.gethostname())
    except ValidationError as exc:
        error = exc.errors()[0]
        fail(ExitCode.BAD_INPUT, f"{file}: {str(error['msg']).removeprefix('Value error, ')}; nothing was uploaded")
    with client_for(server) as client:
        try:  # asked once, so that a file over the server's limit is never sent (a server that does not say: tried)
            limit = client.upload_limit()
        except Exception as exc:
            client_errors(exc)
        if limit is not None and len(data) > limit:
            fail(ExitCode.BAD_INPUT, f"{file} is {len(data):,} bytes; the server takes uploads of at most {limit:,} "
                                     "bytes (its TUNECACHE_MAX_UPLOAD_BYTES); nothing was uploaded")
        try:
            with transfer_progress(client, "pushing", quiet):
                client.upload_artifact(data)
            run = client.record_run(record, force=force)
        except Exception as exc:
            client_errors(exc)
    state = "current" if run.is_current else "recorded, not current"
    if run.held:
        typer.echo(f"tunecache: run {run.id} is not current: {run.held}", err=True)
    typer.echo(f"stored run {run.id} ({parsed.entries} entries, {state}) for {key.model} on {key.gpu_name}")


class Layout(str, enum.Enum):
    file = "file"
    vllm = "vllm"
    flashinfer_v2 = "flashinfer-v2"


@app.command()
@key_options()
def pull(
    server: ServerOpt,
    key_options: KeyOptions,
    dest: Annotated[
        Optional[Path],
        typer.Option("--dest", help="file layout: directory for the cache file; vllm / flashinfer-v2: root (default: where vLLM reads)"),
    ] = None,
    environment: EnvironmentOpt = None,
    layout: Annotated[
        Layout,
        typer.Option(help="file: a FlashInfer cache file; vllm: vLLM's per-rank files for every rank; flashinfer-v2: FlashInfer's v2 store"),
    ] = Layout.file,
    vllm_config_hash: Annotated[
        Optional[str], typer.Option(help="vllm layout: the deployment's <hash> directory, as its vLLM names it (0.33: "
                                         "sha256 of VllmConfig.compute_hash(include_version=False); 0.34: hash_factors of "
                                         "compile_factors(include_version=False); 0.25 reads no per-rank files; docs/pods.md)")
    ] = None,
    pipeline_parallel_size: Annotated[int, typer.Option(min=1, help="vllm layout: pipeline-parallel size (ranks per dp = tp x pp)")] = 1,
    file_name: Annotated[Optional[str], typer.Option(help="file layout: the file's name (default: from the key)")] = None,
    jit: Annotated[bool, typer.Option("--jit", help="also install the tuning's FlashInfer JIT modules into this pod's FlashInfer workspace")] = False,
    jit_workspace: Annotated[
        Optional[Path], typer.Option(help="install the JIT modules into this FlashInfer workspace directory instead "
                                      "(used as given; for a pod without FlashInfer, e.g. an init container)")
    ] = None,
    warm_state: Annotated[bool, typer.Option("--warm-state", help="also install the run's vLLM model-inspection "
                                             "cache, compile cache and Triton cache (a signed run only)")] = False,
    vllm_cache_root: Annotated[Optional[Path], typer.Option(help="--warm-state: vLLM's cache root (default: "
                                                            "VLLM_CACHE_ROOT, else vLLM's default)")] = None,
    triton_cache_dir: Annotated[Optional[Path], typer.Option(help="--warm-state: Triton's cache (default: "
                                                             "TRITON_CACHE_DIR, else Triton's default)")] = None,
    quiet: QuietOpt = False,
) -> None:
    """Fetch the tuning matching this GPU and environment and install it where FlashInfer or vLLM read it.

    Prints the installed path(s). Layout 'file': use with flashinfer.autotune(False, cache=PATH). With --warm-state (an init container before vLLM starts) the compile cache goes under the tuning node's directory names, which the pod's vLLM finds only if its compile factors are the node's (same model path, engine settings, VLLM_* environment and image); the vLLM plugin instead puts it under the names the pod's own config gives.
    """
    if file_name is not None:
        try:
            check_file_name(file_name)
        except ValueError as exc:
            fail(ExitCode.USAGE, str(exc))
    if layout is Layout.file and dest is None:
        fail(ExitCode.USAGE, "--dest DIR is needed for --layout file")
    if layout is Layout.vllm and not vllm_config_hash:
        fail(ExitCode.USAGE, "--layout vllm needs --vllm-config-hash (64 hex digits; the tunecache vLLM plugin computes it itself)")
    if layout is Layout.vllm and not re.fullmatch(r"[0-9a-f]{64}", vllm_config_hash):
        fail(ExitCode.USAGE, f"--vllm-config-hash {vllm_config_hash[:80]!r} is not 64 lowercase hex digits "
                             "(sha256 of vLLM's VllmConfig.compute_hash())")
    env = environment_option(environment)
    if environment is None and env.indeterminate_fields():
        fail(
            ExitCode.USAGE,
            f"FlashInfer could not detect {', '.join(env.indeterminate_fields())} here (no GPU?); "
            "pass --environment FILE",
        )
    key = options_key(key_options, env.gpu)
    tensor_parallel_size, data_parallel_size = key.tensor_parallel_size, key.data_parallel_size
    settings = client_settings()
    try:
        trusted = load_trusted_keys(settings.trusted_keys) if settings.trusted_keys else None
    except SigningError as exc:
        fail(ExitCode.USAGE, str(exc))
    if layout is Layout.file:
        tactics = FlashInferFile(dest, file_name or default_file_name(key))
    elif layout is Layout.vllm:
        # vLLM's world rank: data_parallel_rank * (tp * pp) + local rank
        per_dp = tensor_parallel_size * pipeline_parallel_size
        names = tuple(vllm_rank_file_name(dp, dp * per_dp + rank) for dp in range(data_parallel_size) for rank in range(per_dp))
        tactics = VllmRankFiles(vllm_config_hash, names, dest)  # root: this pod's own (never from the run) when no --dest
    else:
        tactics = FlashInferV2Store(dest)
    jit_modules = (ArtifactKind.FLASHINFER_JIT_MODULE,) if (jit or jit_workspace) else ()
    # the same pipeline as the vLLM plugin's main process: the warm state by kind, DeepGEMM's cache included
    target = InstallTarget.of(jit_modules + (WARM_STATE if warm_state else ()), tactics, {
        ArtifactKind.FLASHINFER_JIT_MODULE: jit_workspace, ArtifactKind.TRITON_CACHE: triton_cache_dir,
        ArtifactKind.VLLM_COMPILE_CACHE: vllm_cache_root, ArtifactKind.VLLM_MODELINFOS: vllm_cache_root})
    with client_for(server, settings) as client:
        try:  # reported to the server when done, in the background (TUNECACHE_REPORT=0: not)
            with transfer_progress(client, "pulling", quiet):
                installed = fetch_and_install(client, key, env, target, trusted, ReportSource.CLI)
        except NoCompatibleTuning as exc:
            fail(ExitCode.NO_COMPATIBLE_TUNING, exc.explain())
        except UntrustedRun as exc:
            fail(ExitCode.UNTRUSTED_RUN, f"{exc}; nothing was installed")
        except (BadJitArtifact, BadWarmStateArtifact) as exc:
            fail(ExitCode.ARTIFACT_CORRUPT, f"{exc}; the tuning was not installed")
        except ImportError as exc:
            fail(ExitCode.USAGE, f"--layout {layout.value} needs FlashInfer installed here ({exc})")
        except ValueError as exc:
            fail(ExitCode.USAGE, str(exc))
        except OSError as exc:
            fail(ExitCode.INSTALL_FAILED, f"cannot write the install: {exc}")
        except Exception as exc:
            client_errors(exc)
    run_id, modules, skipped = installed.run_id, installed.jit_modules, installed.jit_skipped
    if installed.signed_by:
        typer.echo(f"run {run_id} is signed by trusted key {installed.signed_by}", err=True)
    if jit_modules and not modules and not skipped:
        typer.echo(f"tunecache: run {run_id} has no FlashInfer JIT modules (the tactics are installed)", err=True)
    if modules:
        typer.echo(f"installed {len(modules)} FlashInfer JIT modules into {installed.jit_workspace}", err=True)
    if skipped:
        typer.echo(f"tunecache: {skipped} (the tactics are installed)", err=True)
    if warm_state:
        done = ", ".join(installed.warm_state) or "none (the run has no warm state, or it is not signed)"
        typer.echo(f"tunecache: warm state installed: {done}", err=True)
        if installed.compile_cache_skipped:
            typer.echo(f"tunecache: {installed.compile_cache_skipped}", err=True)
    for path in installed.paths:
        typer.echo(str(path))


@app.command()
@key_options()
def doctor(
    server: ServerOpt,
    key_options: KeyOptions,
    environment: EnvironmentOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON document (docs/pods.md), errors too")] = False,
) -> None:
    """Show this machine's FlashInfer environment, its key, and the server's matching or closest runs.

    What the server has for the key: the matching run, or the closest ones and each field that differs; for a matching run, what each kind of its artifacts will do on this pod (loads, will not load and why, or depends on the engine's arguments), compared with this pod's own paths, versions and package prefix.

    Exit codes are pull's: 0 when the server has a matching tuning this pod takes, 3 when not, 14 when this pod refuses it (TUNECACHE_TRUSTED_KEYS), 4/5 for server trouble.

    --json: stdout is one JSON document (schema_version, key, environment, image versions, run, kinds with loads and why, exit_code), for a deployment pipeline; without a GPU, --gpu-name names the pods' GPU.
    """
    if as_json:
        from tunecache.cli_doctor import doctor_json

        doctor_json(server, key_options, environment, environment_option, options_key)
    env = environment_option(environment)
    try:  # as pull reads them, before anything is said (a bad value: one line, exit 2)
        configured = client_settings().trusted_keys
        trusted = load_trusted_keys(configured) if configured else None
    except SigningError as exc:
        fail(ExitCode.USAGE, str(exc))
    undetectable = bool(env.indeterminate_fields()) and environment is None
    # the key's values too, before anything is said (where the GPU is known)
    key = None if undetectable else options_key(key_options, env.gpu)
    typer.echo("environment (FlashInfer _metadata" + (f", from {environment})" if environment else ", detected)"))
    for field, value in env.model_dump().items():
        typer.echo(f"  {field}: {value}")
    typer.echo(f"  environment hash: {env.environment_hash()}")
    if env.indeterminate_fields():
        typer.echo(f"  undetected: {', '.join(env.indeterminate_fields())} (no tuning can match these)")
        if undetectable:
            fail(ExitCode.USAGE, f"FlashInfer could not detect {', '.join(env.indeterminate_fields())} here (no GPU?); "
                                 "pass --environment FILE (a FlashInfer cache file written on the pod's GPU)")
    assert key is not None
    typer.echo("key")
    for field, value in key.model_dump().items():
        typer.echo(f"  {field}: {value}")
    with client_for(server) as client:
        try:
            run = client.lookup(key, env)
        except NoCompatibleTuning as exc:
            typer.echo(f"server {server}: no matching tuning")
            typer.echo(exc.explain())
            raise typer.Exit(int(ExitCode.NO_COMPATIBLE_TUNING)) from None
        except Exception as exc:
            client_errors(exc)
    kinds = sorted({a.kind for a in run.artifacts})
    typer.echo(
        f"server {server}: run {run.id} matches ({run.entries} entries, "
        f"{f'finished {run.finished_at}' if run.finished_at else f'recorded {run.created_at}'}, "
        f"artifacts: {', '.join(kinds)})"
    )
    from tunecache.client.preflight import preflight

    typer.echo(f"what run {run.id} will do on this pod, kind by kind (its paths and values)")
    found = preflight(run, key, env, trusted)
    for verdict in found.verdicts:
        typer.echo(f"  {verdict}")
    if found.refused is not None:  # pull's own decision, so pull's exit code
        fail(ExitCode.UNTRUSTED_RUN, f"{found.refused}; nothing would be installed")


def _tactic_text(tactic) -> str:
    """A tactic as compact JSON (``[0,[[12,0]]]``); ``-`` for none."""
    return "-" if tactic is None else json.dumps(tactic, separators=(",", ":"))


def _diff_table(diff: TuningRunDiff) -> list[str]:
    """The changed entries of a run diff as aligned text rows under a header: status, op,
    runner, bucket (with the extras where two rows would read the same), tactic a -> b,
    each run's recorded time (ms), the slowdown, each run's margin, and REGRESSION or why not."""
    def pct(value: float | None, signed: bool = False) -> str:
        return "-" if value is None else f"{value * 100:{'+' if signed else ''}.2f}%"

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.6g}"

    seen: dict[tuple[str, str, str], int] = {}
    for e in diff.entries:
        seen[(e.op, e.runner, e.bucket)] = seen.get((e.op, e.runner, e.bucket), 0) + 1
    rows = [("STATUS", "OP", "RUNNER", "BUCKET", "TACTIC A -> B", "A ms", "B ms", "CHANGE", "MARGIN A / B", "")]
    for e in diff.entries:
        bucket = e.bucket + (f" [{e.extras}]" if seen[(e.op, e.runner, e.bucket)] > 1 and e.extras else "")
        margins = "-" if e.margin_a is None and e.margin_b is None else f"{pct(e.margin_a)} / {pct(e.margin_b)}"
        mark = f"REGRESSION ({e.note})" if e.regression else (e.note or "")
        rows.append((str(e.status), e.op, e.runner, bucket, f"{_tactic_text(e.tactic_a)} -> {_tactic_text(e.tactic_b)}",
                     ms(e.time_ms_a), ms(e.time_ms_b), pct(e.slowdown, signed=True), margins, mark))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]


@app.command()
def diff(
    run_a: Annotated[int, typer.Argument(min=1, max=MAX_ID, help="run id a (e.g. the current tuning)")],
    run_b: Annotated[int, typer.Argument(min=1, max=MAX_ID, help="run id b, compared with a (e.g. a re-tune)")],
    server: ServerOpt,
    as_json: Annotated[bool, typer.Option("--json", help="print the diff as JSON (the API's TuningRunDiff)")] = False,
    fail_on_regression: Annotated[bool, typer.Option(
        "--fail-on-regression", help="exit 18 when a changed entry is slower beyond its recorded margin")] = False,
) -> None:
    """Which ops and buckets changed tactic between two stored runs' FlashInfer files.

    One row per entry added, removed, or with another tactic in run B: op, runner, bucketed shapes, tactic A -> B, FlashInfer's recorded times (ms) where the files have them, the change, both margins, and REGRESSION when B's time is slower than A's beyond the larger recorded margin (near-tied tactics flipping between tunings are not). Then one summary line. Exit 0, or 18 with --fail-on-regression when there is a regression; 5 for an unknown run or a run without a FlashInfer file (the server's reason in one line).
    """
    with client_for(server) as client:
        try:
            result = client.diff_runs(run_a, run_b)
        except ServerError as exc:
            if exc.status_code in (404, 422) and isinstance(exc.detail, str):
                fail(ExitCode.SERVER_ERROR, exc.detail)
            client_errors(exc)
        except TunecacheError as exc:
            client_errors(exc)
    s = result.summary
    if as_json:
        typer.echo(result.model_dump_json(indent=2))
    else:
        key = result.key_a
        typer.echo(f"run {run_a} -> run {run_b}: {key.model} on {key.gpu_name}, "
                   f"max_num_batched_tokens {key.max_num_batched_tokens}")
        for d in result.differences:
            typer.echo(f"  differs: {d.field}: {d.stored} -> {d.yours}")
        for line in _diff_table(result) if result.entries else ["no entry changed tactic"]:
            typer.echo(line)
        untimed = [run for run, timed in ((run_a, s.timed_a), (run_b, s.timed_b)) if timed == 0]
        typer.echo(
            f"{s.entries_a} entries in run {run_a}, {s.entries_b} in run {run_b}: {s.added} added, {s.removed} removed, "
            f"{s.changed} changed tactic, {s.unchanged} unchanged; "
            f"{s.regressions} regression{'' if s.regressions == 1 else 's'}"
            + "".join(f"; run {run} has no recorded times" for run in untimed))
    if fail_on_regression and s.regressions:
        fail(ExitCode.REGRESSION, f"{s.regressions} regression{'' if s.regressions == 1 else 's'} (--fail-on-regression): "
                                  f"run {run_b} is slower than run {run_a} beyond the recorded margin in "
                                  f"{s.regressions} entr{'y' if s.regressions == 1 else 'ies'}")


#: Control characters (C0, DEL, C1: what a terminal acts on, ESC and CSI among them) as
#: ``\xNN``: text in the tables of ``history`` and ``fleet`` comes from the service, and
#: some of it from anonymous pod reports.
_CONTROL_ESCAPES = {code: f"\\x{code:02x}" for code in (*range(0x20), *range(0x7F, 0xA0))}


def _printable(text: str) -> str:
    """``text`` with its control characters escaped (:data:`_CONTROL_ESCAPES`), so that
    printing it cannot move the cursor, retitle the terminal or hide what follows."""
    return text.translate(_CONTROL_ESCAPES)


def _aligned(rows: list[tuple[str, ...]]) -> list[str]:
    """Rows of cells as text lines, each column as wide as its widest cell; control
    characters in a cell are escaped (:func:`_printable`)."""
    rows = [tuple(_printable(cell) for cell in row) for row in rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]


def _key_text(key: TuningKey) -> str:
    """A key in one cell: model, GPU, max_num_batched_tokens, tp, and what else is not the default."""
    extra = [f"{name}={getattr(key, name)}" for name, default in (("dtype", "auto"), ("quantization", "auto"),
                                                                  ("data_parallel_size", 1), ("expert_parallel_size", 1))
             if getattr(key, name) != default]
    return " ".join([key.model, f"{key.gpu_name} ({key.arch})", f"mnbt={key.max_num_batched_tokens}",
                     f"tp={key.tensor_parallel_size}", *extra])


def _age(seconds: float) -> str:
    """``45s``, ``12m``, ``5h 3m``, ``2d 4h``."""
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m"
    if seconds < 86400:
        return f"{seconds // 3600}h {seconds % 3600 // 60}m"
    return f"{seconds // 86400}d {seconds % 86400 // 3600}h"


def _when(value: dt.datetime | None) -> str:
    return "-" if value is None else value.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def time_option(option: str, value: str | None) -> dt.datetime | None:
    """``--since``/``--until``: an ISO 8601 time (UTC when it names no zone) or an age back
    from now (``90m``, ``24h``, ``7d``, ``30s``); exit 2 naming the option otherwise."""
    if value is None:
        return None
    age = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd])\s*", value)
    if age:
        unit = {"s": 1, "m": 60, "h": 3600, "d": 86400}[age.group(2)]
        try:
            return dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=float(age.group(1)) * unit)
        except (OverflowError, ValueError):
            fail(ExitCode.USAGE, f"{option} {value[:80]!r} reaches back before the year 1")
    try:
        when = dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00").replace("z", "+00:00"))
        when = when if when.tzinfo is not None else when.replace(tzinfo=dt.timezone.utc)
        return when.astimezone(dt.timezone.utc)
    except ValueError:
        fail(ExitCode.USAGE, f"{option} {value[:80]!r} is not an ISO 8601 time (2026-12-01T08:00:00Z) "
                             "or an age (90m, 24h, 7d)")
    except OverflowError:
        fail(ExitCode.USAGE, f"{option} {value[:80]!r} is outside the years 1-9999 once in UTC")


def _query_error(exc: ValidationError) -> str:
    """The first problem of a history query, naming the option it came from."""
    error = exc.errors()[0]
    where = [str(part) for part in error["loc"]]
    message = error["msg"].removeprefix("Value error, ")
    return f"--{where[0].replace('_', '-')}: {message}" if where else message


#: ``history``'s filter options that say more than ``only this <field>``: (more names, help).
_HISTORY_FILTER_HELP: dict[str, tuple[tuple[str, ...], str]] = {
    "model": ((), "only runs of this model"),
    "gpu_name": ((), "only runs for this GPU, e.g. 'NVIDIA H200'"),
    "arch": ((), "only runs for this arch, e.g. sm90"),
    "tensor_parallel_size": (("-tp",), "only this tensor-parallel size"),
    "data_parallel_size": (("-dp",), "only this data-parallel size"),
    "expert_parallel_size": ((), "only this expert-parallel size (tp x dp with vLLM's --enable-expert-parallel)"),
}


def _key_filter_parameters() -> list[inspect.Parameter]:
    """``history``'s key filters: one option per key field (:data:`KEY_FIELDS`, read from
    :class:`TuningKey`), ``--<field>``, optional."""
    parameters = []
    for name, field in TuningKey.model_fields.items():
        more, help_text = _HISTORY_FILTER_HELP.get(name, ((), f"only this {name}"))
        option = typer.Option("--" + name.replace("_", "-"), *more, help=help_text)
        annotation = Annotated[Optional[int if field.annotation is int else str], option]
        parameters.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=None))
    return parameters


@app.command()
@with_options("key_filters", _key_filter_parameters(), lambda **fields: fields)
def history(
    server: ServerOpt,
    key_filters: dict[str, Any],
    status: Annotated[Optional[str], typer.Option("--status", help="succeeded or failed")] = None,
    trigger: Annotated[Optional[str], typer.Option("--trigger", help="upload, cli, http or pod")] = None,
    env: Annotated[Optional[list[str]], typer.Option(
        "--env", help="FIELD=VALUE of the FlashInfer environment, e.g. flashinfer_version=0.7.4 (repeatable)")] = None,
    since: Annotated[Optional[str], typer.Option(
        "--since", help="recorded at or after: ISO 8601 (UTC when no zone is given) or an age such as 24h, 7d")] = None,
    until: Annotated[Optional[str], typer.Option("--until", help="recorded before: as --since")] = None,
    current_only: Annotated[bool, typer.Option("--current-only", help="only runs that are current for their key")] = False,
    limit: Annotated[int, typer.Option("--limit", min=1, max=500, help="runs per page")] = 50,
    cursor: Annotated[Optional[str], typer.Option("--cursor", help="continue after a page (the cursor it printed)")] = None,
    all_pages: Annotated[bool, typer.Option("--all", help="every matching run, page after page")] = False,
    as_csv: Annotated[bool, typer.Option("--csv", help="every matching run as CSV (header first) on stdout")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="the page (with --all: every page) as the API's "
                                          "TuningRunPage JSON")] = False,
) -> None:
    """The tuning history, newest first: id, recorded, status, trigger, key, FlashInfer version, entries, current.

    Filters combine: key fields, --env FIELD=VALUE for any FlashInfer environment field, --status, --trigger, --since/--until, --current-only. One page of --limit runs, then the cursor of the next (--cursor); --all prints every page; --csv streams every matching run as the server's CSV export; --json prints the page (or every page) as JSON.

    Exit 0; 2 for a bad option (named); 4 server unreachable; 5 server error; 13 not authorised.
    """
    if as_csv and as_json:
        fail(ExitCode.USAGE, "--csv and --json are two forms of one list: give one")
    params: dict[str, object] = {
        **key_filters, "status": status, "trigger": trigger,
        "since": time_option("--since", since), "until": time_option("--until", until), "current_only": current_only,
        "limit": limit, "cursor": cursor,
    }
    for item in env or []:
        field, sep, value = item.partition("=")
        if not sep or field not in ENVIRONMENT_FIELDS:
            fail(ExitCode.USAGE, f"--env {item[:80]!r}: give FIELD=VALUE with FIELD one of {', '.join(ENVIRONMENT_FIELDS)}")
        params[field] = value
    try:
        query = TuningRunQuery(**{name: value for name, value in params.items() if value is not None})
    except ValidationError as exc:
        fail(ExitCode.USAGE, _query_error(exc))
    with client_for(server) as client:
        try:
            if as_csv:
                client.export_runs_csv(query, sys.stdout.buffer.write)
                sys.stdout.buffer.flush()
                return
            pages = [client.list_runs(query)]
            while all_pages and pages[-1].next_cursor:
                pages.append(client.list_runs(query.model_copy(update={"cursor": pages[-1].next_cursor})))
        except TunecacheError as exc:
            client_errors(exc)
    runs = [run for page in pages for run in page.items]
    if as_json:
        typer.echo(pages[-1].model_copy(update={"items": runs}).model_dump_json(indent=2))
        return
    if not runs:
        typer.echo("no tuning runs match")
        return
    rows = [("ID", "RECORDED (UTC)", "STATUS", "TRIGGER", "KEY", "FLASHINFER", "ENTRIES", "CURRENT")]
    rows += [(str(r.id), _when(r.created_at), f"{r.status} (retired)" if r.retired_at else str(r.status), str(r.trigger),
              _key_text(r.key),
              r.environment.flashinfer_version, "-" if r.entries is None else str(r.entries), "yes" if r.is_current else "")
             for r in runs]
    for line in _aligned(rows):
        typer.echo(line)
    last = pages[-1]
    more = f"; next page: --cursor {last.next_cursor}" if last.next_cursor else ""
    typer.echo(f"{len(runs)} of {last.total} matching run{'' if last.total == 1 else 's'}{more}", err=True)


@app.command()
def fleet(
    server: ServerOpt,
    hours: Annotated[float, typer.Option("--hours", min=0.001, max=FLEET_MAX_HOURS, help="the window of hit rates and wanted tunings")] = 24.0,
    limit: Annotated[int, typer.Option("--limit", min=1, max=FLEET_PAGE_MAX,
                                       help="keys, and wanted tunings, per page")] = FLEET_PAGE_DEFAULT,
    offset: Annotated[int, typer.Option("--offset", min=0, max=MAX_ID, help="rows of each list before the page")] = 0,
    all_pages: Annotated[bool, typer.Option("--all", help="every key and wanted tuning, page after page")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the API's FleetView as JSON")] = False,
) -> None:
    """What the fleet has and wants: keys with their current run (id, age, entries, trigger) and the share of pods' installs that found it over the last --hours, most reports first; then the tunings pods asked for that have none (distinct pods, last asked, how the closest run differs), most pods first.

    One page: --limit rows of each list from --offset (the next page's --offset is printed); --all walks every page (1000 rows a request) and prints them as one.

    Exit 0; 2 for a bad option; 4 server unreachable; 5 server error; 13 not authorised.
    """
    if all_pages and offset:
        fail(ExitCode.USAGE, "--offset and --all cannot be combined: --all lists every page from the first")
    with client_for(server) as client:
        try:
            view = client.fleet_all(hours) if all_pages else client.fleet(
                hours, limit=limit, offset=offset, wanted_limit=limit, wanted_offset=offset)
        except TunecacheError as exc:
            client_errors(exc)
    if as_json:
        typer.echo(view.model_dump_json(indent=2))
        return
    typer.echo(f"fleet over the last {view.hours:g} h (since {_when(view.since)}): "
               f"{_shown(len(view.keys), view.offset, view.total_keys, 'key')}, "
               f"{_shown(len(view.wanted), view.wanted_offset, view.total_wanted, 'wanted tuning')}")
    rows = [("KEY", "RUN", "AGE", "ENTRIES", "TRIGGER", "FLASHINFER", "REPORTS", "HIT RATE", "MISSES", "ERRORS")]
    for k in view.keys:
        rate = "-" if k.hit_rate is None else f"{k.hit_rate * 100:.0f}%"
        counts = (str(k.reports), rate, str(k.missed), str(k.errors))
        if not k.current:
            rows.append((_key_text(k.key), "none", "-", "-", "-", "-", *counts))
        for i, run in enumerate(k.current):
            rows.append((_key_text(k.key) if i == 0 else "", str(run.run_id), _age(run.age_s),
                         "-" if run.entries is None else str(run.entries), str(run.trigger), run.flashinfer_version,
                         *(counts if i == 0 else ("", "", "", ""))))
    if view.keys:
        for line in _aligned(rows):
            typer.echo(line)
    else:
        typer.echo(f"no keys past {view.offset} of {view.total_keys}" if view.total_keys
                   else "no keys: nothing tuned and no reports in the window")
    typer.echo("")
    if view.wanted:
        typer.echo("wanted (pods asked, no usable tuning):")
        rows = [("KEY", "ENVIRONMENT", "SOURCES", "PODS", "BOOTS", "LAST ASKED (UTC)", "CLOSEST", "DIFFERS")]
        for w in view.wanted:
            env_text = (f"flashinfer {w.environment.flashinfer_version}, cuda {w.environment.cuda_version}"
                        if w.environment else w.environment_hash[:12])
            differs = "; ".join(str(d) for d in w.differences) or "-"
            rows.append((_key_text(w.key), env_text, str(w.sources), str(w.pods), str(w.reports), _when(w.last_asked_at),
                         "-" if w.closest_run_id is None else f"run {w.closest_run_id}", differs))
        for line in _aligned(rows):
            typer.echo(line)
    elif view.total_wanted:
        typer.echo(f"wanted: none past {view.wanted_offset} of {view.total_wanted}")
    else:
        typer.echo("wanted: none (every key pods asked for in the window has a tuning)")
    following = view.offset + view.limit
    if not all_pages and following < max(view.total_keys, view.total_wanted):
        more = "" if view.limit == FLEET_PAGE_DEFAULT else f" --limit {view.limit}"
        typer.echo(f"next page: --offset {following}{more}", err=True)


def _shown(listed: int, offset: int, total: int, noun: str) -> str:
    """``3 keys`` when a list is whole, ``keys 101-200 of 1074`` when it is a page of more."""
    if offset == 0 and listed == total:
        return f"{total} {noun}{'' if total == 1 else 's'}"
    return f"{noun}s {offset + 1}-{offset + listed} of {total}" if listed else f"no {noun}s past {offset} of {total}"


@app.command()
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


job_app = typer.Typer(help="Tuning jobs of a tunecache service (retune queues them).", no_args_is_help=True)
app.add_typer(job_app, name="job")


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


@app.command()
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


@app.command()
def pin(
    server: ServerOpt,
    run_id: Annotated[int, typer.Argument(min=1, max=MAX_ID, help="the run to keep (history lists them)")],
) -> None:
    """Pin a run: retention never deletes it (needs an admin token).

    Retention (TUNECACHE_RUN_RETENTION) keeps a pinned run however many runs of its key come after it: a known-good run to roll back to.

    Pinning a pinned run changes nothing. Exit 5 when there is no such run (or retention already deleted it).
    """
    _set_pin(server, run_id, pinned=True)


@app.command()
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


token_app = typer.Typer(help="Bearer tokens of a tunecache service (needs an admin token).", no_args_is_help=True)
app.add_typer(token_app, name="token")


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


keys_app = typer.Typer(help="Ed25519 signing keys of tuner nodes (their public keys go to pods).", no_args_is_help=True)
app.add_typer(keys_app, name="keys")


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


cli_retire.register(app)
cli_status.register(app)
cli_jobs.register(app, job_app)
cli_show.register(app)


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


if __name__ == "__main__":  # python -m tunecache.cli
    # Run this module under its own name, which entry points and plugins import, rather than
    # as __main__ (a second copy of it, with an app of its own).
    from tunecache.cli import main as installed_main

    installed_main()
