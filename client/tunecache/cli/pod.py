"""The pod's own commands of ``tunecache``: ``push``, ``pull`` and ``doctor`` (what a pod, its
init container or its operator runs against the pod's GPU and environment), registered on
the ``tunecache`` app by :func:`register`.

Also the two readings of a pod that the other command modules share: the key of a command's
key options (:func:`options_key`) and the environment of ``--environment`` (:func:`environment_option`).
"""

import enum
import hashlib
import re
import socket
from pathlib import Path
from typing import Annotated, Optional

import typer
from pydantic import ValidationError

from tunecache.cli.client import client_for, client_settings
from tunecache.cli_kit import ExitCode, KeyOptions, ServerOpt, client_errors, fail, first_error, key_options
from tunecache.client.autotune_file import pushed_run
from tunecache.client.environment import EnvironmentUnavailable, detect_environment, environment_from_file, pod_key
from tunecache.client.install import default_file_name, fetch_and_install
from tunecache.client.layouts import FlashInferFile, FlashInferV2Store, VllmRankFiles, check_file_name
from tunecache.client.local_files import FileTooLarge, read_bounded
from tunecache.client.pipeline import WARM_STATE, InstallTarget
from tunecache.client.warm_state import BadWarmStateArtifact
from tunecache.contract import MAX_AUTOTUNE_FILE_BYTES, ArtifactKind, ReportSource, RunTrigger, TuningKey
from tunecache.engines.vllm.paths import vllm_rank_file_name
from tunecache.formats.autotune_file import NotAnAutotuneFile, check_loadable
from tunecache.formats.jit_module import BadJitArtifact
from tunecache.signing import SigningError, UntrustedRun, load_trusted_keys
from tunecache.store import NoCompatibleTuning


def register(app: typer.Typer) -> None:
    """Add ``push``, ``pull`` and ``doctor`` to ``app``."""
    for command in (push, pull, doctor):
        app.command()(command)


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


@key_options()
def push(
    file: Annotated[Path, typer.Argument(help="FlashInfer autotune cache file (AutoTuner.save_configs output)")],
    server: ServerOpt,
    key_options: KeyOptions,
    trigger: Annotated[str, typer.Option(help="'upload', or 'pod' for a pod's own tuning (stored unverified)")] = "upload",
    force: Annotated[bool, typer.Option("--force", help="make it current past the service's promotion policy "
                                        "(admin token; audited)")] = False,
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
        from tunecache.cli.doctor_json import doctor_json

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


