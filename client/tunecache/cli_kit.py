"""The kit the ``tunecache`` command is built with (typer), shared by every distribution's
commands: the root app and how it runs, exit codes, the options of a key and the other
shared option types, and the exit codes of the stores' errors.

It imports none of the pod code (``tunecache.client``; an import-linter contract in
``pyproject.toml`` says so), so the server's commands (:mod:`tunecache.service.cli`) are
built with it without loading the pod's installs. The pod commands are
:mod:`tunecache.cli`, which also loads the commands of other distributions through the
``tunecache.cli`` entry-point group. A command with ``--server URL`` opens the HTTP store
(:mod:`tunecache.store.http`, which both distributions import) with :func:`server_store`.

Exit codes (also in docs/pods.md):

====  =====================================================================
0     success (``pull``: tuning installed)
1     unexpected error
2     usage error (bad or missing option)
3     no compatible tuning on the server (``pull``); the closest ones are printed
4     server unreachable (connection refused, DNS, timeout), or ``pull``: the install
      deadline (``TUNECACHE_INSTALL_DEADLINE``) passed; nothing was installed
5     the server answered with an error (4xx/5xx other than a lookup miss)
6     downloaded artifact corrupt (sha256 mismatch); nothing was installed
7     bad input file (not a FlashInfer autotune file, unreadable environment file,
      bad model config; ``push``: a file over the size limit, nothing uploaded)
8     tuning failed (``tune``): the tuner process reported an error, died, or timed out
9     database not usable (schema out of date: run ``tunecache db upgrade``; unreachable;
      bad URL)
10    ``retune --wait``: the job did not finish within ``--wait-timeout`` (it goes on)
11    ``serve`` could not start listening (address in use, bad host)
12    a local write failed: ``pull``'s install could not be written (disk full,
      permissions; nothing was left half-written), or any command's stdout (``> /dev/full``;
      ``token create`` then revokes the token it could not deliver)
13    not authorised: no token, or one that is unknown, revoked, or of too small a scope
      (HTTP 401/403); or a token would travel in clear text to another machine
14    ``pull`` and ``doctor``: the run is not signed by a trusted key (``TUNECACHE_TRUSTED_KEYS``) or its
      bytes do not match its signed manifest; nothing was installed
15    ``retune``: a job for the key is already queued or running with other options (its
      id and each difference are printed); ``job cancel``: the job already succeeded or
      failed; ``promote``: the run cannot be current (failed, a pod's, or not signed by a
      key the service trusts)
16    ``retune --wait``: the job was cancelled (``tunecache job cancel``) before it finished
17    ``retune --require-worker``: no live GPU worker for the key's GPU; nothing was queued
18    ``diff --fail-on-regression``: a changed entry is slower beyond its recorded margin
====  =====================================================================
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import enum
import functools
import importlib.metadata
import inspect
import json
import sys
from collections.abc import Callable
from typing import Annotated, Any, Literal, NoReturn, Optional

import typer
from pydantic import ValidationError

from tunecache import cli_config
from tunecache.cli_output import OutputUnwritable, ReaderMayLeave
from tunecache.contract import DEFAULT_ENGINE, DeploymentKey, expert_parallel_size
from tunecache.store import ArtifactCorrupt, InstallDeadlineExceeded, ServerError, ServerUnreachable, TunecacheError, TuningStore


class ExitCode(enum.IntEnum):
    OK = 0
    UNEXPECTED = 1
    USAGE = 2
    NO_COMPATIBLE_TUNING = 3
    SERVER_UNREACHABLE = 4
    SERVER_ERROR = 5
    ARTIFACT_CORRUPT = 6
    BAD_INPUT = 7
    TUNING_FAILED = 8
    DATABASE = 9
    WAIT_TIMEOUT = 10
    SERVE_FAILED = 11
    INSTALL_FAILED = 12
    NOT_AUTHORISED = 13
    UNTRUSTED_RUN = 14
    JOB_CONFLICT = 15
    JOB_CANCELLED = 16
    NO_WORKER = 17
    REGRESSION = 18


class Failed(typer.Exit):
    """What :func:`fail` raises: the exit with ``code``, and the line it said (``message``)."""

    def __init__(self, code: ExitCode, message: str) -> None:
        super().__init__(int(code))
        self.message = message


#: While true (:func:`failures_unsaid`), :func:`fail` says nothing: the command reports each
#: :class:`Failed` itself (``doctor --json``: in its document, on stdout).
_failures_unsaid: contextvars.ContextVar[bool] = contextvars.ContextVar("failures_unsaid", default=False)


@contextlib.contextmanager
def failures_unsaid():
    """Within: :func:`fail` raises its :class:`Failed` without printing the line."""
    token = _failures_unsaid.set(True)
    try:
        yield
    finally:
        _failures_unsaid.reset(token)


def fail(code: ExitCode, message: str) -> NoReturn:
    """Print ``tunecache: error: <message>`` to stderr and exit with ``code`` (:class:`Failed`)."""
    if not _failures_unsaid.get():
        typer.echo(f"tunecache: error: {message}", err=True)
    raise Failed(code, message)


ServerOpt = Annotated[str, typer.Option("--server", envvar="TUNECACHE_URL", **cli_config.SERVER_DEFAULT, help=(
    "tunecache server URL (default: the config file's server, else the tunecache serve on this machine)"))]
ModelOpt = Annotated[str, typer.Option("--model", help="model name as given to vLLM (--model)")]
MnbtOpt = Annotated[int, typer.Option("--max-num-batched-tokens", min=1, help="vLLM's max_num_batched_tokens")]
DtypeOpt = Annotated[str, typer.Option("--dtype", help="vLLM's --dtype ('auto': as the checkpoint says)")]
QuantOpt = Annotated[str, typer.Option("--quantization", help="vLLM's --quantization ('auto': as the checkpoint says)")]
TpOpt = Annotated[int, typer.Option("--tensor-parallel-size", "-tp", min=1, help="tensor-parallel size")]
DpOpt = Annotated[int, typer.Option("--data-parallel-size", "-dp", min=1, help="vLLM's data-parallel size (it shards MoE layers)")]
EpOpt = Annotated[bool, typer.Option("--enable-expert-parallel", help="vLLM's --enable-expert-parallel (experts split over tp x dp ranks)")]
EngineOpt = Annotated[str, typer.Option("--engine", help="the inference engine the key is for (vllm)")]
GpuNameOpt = Annotated[Optional[str], typer.Option("--gpu-name", help="GPU name (default: the environment's 'gpu')")]
RequiredGpuNameOpt = Annotated[str, typer.Option("--gpu-name", help="GPU to tune for, e.g. 'NVIDIA H200'")]
ArchOpt = Annotated[Optional[str], typer.Option("--arch", help="GPU arch such as sm90 (default: detected)")]
GemmBackendsOpt = Annotated[
    Optional[str], typer.Option("--gemm-backends", help="comma-separated FlashInfer GEMM backends (default: per arch)")
]
StagesOpt = Annotated[
    Optional[str], typer.Option("--stages", help="comma-separated tuner stages: gemm,moe,attention (default: all that apply)")
]


EngineArgsOpt = Annotated[
    Optional[str], typer.Option("--engine-args", help="the engine variant to tune: vllm.LLM arguments as a JSON object, "
                                                      "e.g. '{\"max_model_len\": 8192}' (with --warmup vllm)")
]


def engine_args_option(value: str | None) -> dict[str, Any] | None:
    """``--engine-args``'s JSON object (``None`` when not given); a usage error (exit 2, one
    line) when it is not one of identifiers, as :data:`tunecache.contract.EngineArgs` takes it."""
    if value is None:
        return None
    try:
        args = json.loads(value)
    except ValueError as exc:
        fail(ExitCode.USAGE, f"--engine-args is not JSON: {exc}")
    if not isinstance(args, dict):
        fail(ExitCode.USAGE, "--engine-args must be a JSON object of vllm.LLM arguments, e.g. '{\"max_model_len\": 8192}'")
    from pydantic import TypeAdapter

    from tunecache.contract import EngineArgs

    try:
        return TypeAdapter(EngineArgs).validate_python(args)
    except ValidationError as exc:
        fail(ExitCode.USAGE, f"invalid --engine-args: {first_error(exc)}")


def csv_option(value: str | None) -> list[str] | None:
    """``"a, b"`` -> ``["a", "b"]``; ``None`` for an empty or missing option."""
    return [part.strip() for part in value.split(",") if part.strip()] if value else None


def first_error(exc: ValidationError) -> str:
    """``"field.part: message"`` of a validation error's first problem, for a one-line exit."""
    error = exc.errors()[0]  # pydantic prefixes a validator's own words with "Value error, "
    where = ".".join(str(part) for part in error["loc"])
    return f"{where + ': ' if where else ''}{str(error['msg']).removeprefix('Value error, ')}"


@dataclasses.dataclass(frozen=True)
class KeyOptions:
    """The key options of a command as given (:func:`key_options` adds them): vLLM's
    deployment options, and the GPU where the command takes it from the user."""

    model: str
    max_num_batched_tokens: int
    dtype: str = "auto"
    quantization: str = "auto"
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    enable_expert_parallel: bool = False
    gpu_name: str | None = None
    arch: str | None = None
    engine: str = DEFAULT_ENGINE

    @property
    def expert_parallel_size(self) -> int:
        """The key's ``expert_parallel_size`` (:func:`tunecache.contract.expert_parallel_size`)."""
        return expert_parallel_size(self.tensor_parallel_size, self.data_parallel_size, self.enable_expert_parallel)

    def deployment(self) -> DeploymentKey:
        """The key's fields but the GPU (what ``tune`` tunes before it knows its GPU; a pod
        command adds its GPU with :func:`tunecache.cli.options_key`).

        Raises:
            pydantic.ValidationError: a field is out of range (the error names it).
        """
        fields = dataclasses.asdict(self) | {"expert_parallel_size": self.expert_parallel_size}
        return DeploymentKey(**{name: fields[name] for name in DeploymentKey.model_fields})


#: Where a command's key takes its GPU from (:func:`key_options`).
GpuSource = Literal["environment", "required", "detected"]


def _key_parameters(gpu: GpuSource) -> list[inspect.Parameter]:
    """The key's options, one typer parameter per :class:`KeyOptions` field, in the key's order."""
    def option(name: str, annotation, default=inspect.Parameter.empty) -> inspect.Parameter:
        return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default)

    gpu_options = {
        "environment": [option("gpu_name", GpuNameOpt, None), option("arch", ArchOpt, None)],
        "required": [option("gpu_name", RequiredGpuNameOpt), option("arch", ArchOpt, None)],
        "detected": [],
    }[gpu]
    return [
        option("model", ModelOpt),
        option("max_num_batched_tokens", MnbtOpt),
        *gpu_options,
        option("dtype", DtypeOpt, "auto"),
        option("quantization", QuantOpt, "auto"),
        option("tensor_parallel_size", TpOpt, 1),
        option("data_parallel_size", DpOpt, 1),
        option("enable_expert_parallel", EpOpt, False),
        option("engine", EngineOpt, DEFAULT_ENGINE),
    ]


def with_options(name: str, parameters: list[inspect.Parameter], build: Callable[..., Any]):
    """A decorator for a typer command: the command's parameter ``name`` becomes the options
    ``parameters`` (in its place, in ``--help`` too), and the command is handed
    ``build(**their values)`` as ``name``. How options shared by several commands are
    declared once (typer reads a command's options from its ``__signature__``)."""
    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(command, eval_str=True)
        own = list(signature.parameters.values())
        at = [p.name for p in own].index(name)
        added = {p.name for p in parameters}

        @functools.wraps(command)
        def with_built(*args: Any, **kwargs: Any) -> Any:
            kwargs[name] = build(**{option: kwargs.pop(option) for option in added if option in kwargs})
            return command(*args, **kwargs)

        # keyword-only from the first added option on, so that a required option may follow one with a default
        rest = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own[at + 1:]]
        with_built.__signature__ = signature.replace(parameters=[*own[:at], *parameters, *rest])
        with_built.__annotations__ = {p.name: p.annotation for p in with_built.__signature__.parameters.values()}
        del with_built.__wrapped__  # typer must read the new signature, not the command's
        return with_built

    return decorate


def key_options(gpu: GpuSource = "environment"):
    """A typer command's key options, declared once for every command that takes a key: the
    command's ``key_options: KeyOptions`` parameter becomes ``--model``,
    ``--max-num-batched-tokens``, ``--gpu-name`` and ``--arch`` (``gpu``: ``environment``,
    both optional, the GPU by default the environment's; ``required``: ``--gpu-name``
    required; ``detected``: neither, the command detects its GPU), ``--dtype``,
    ``--quantization``, ``--tensor-parallel-size``/``-tp``, ``--data-parallel-size``/``-dp``
    and ``--enable-expert-parallel``; the command gets them as one :class:`KeyOptions`."""
    return with_options("key_options", _key_parameters(gpu), KeyOptions)


def client_errors(exc: Exception) -> NoReturn:
    """Exit with the code of a client error (4 unreachable or the install deadline passed,
    6 corrupt, 5 other server trouble); re-raise anything else."""
    if isinstance(exc, InstallDeadlineExceeded):  # raised before anything is written
        fail(ExitCode.SERVER_UNREACHABLE, f"{exc}; nothing was installed")
    if isinstance(exc, ServerUnreachable):
        fail(ExitCode.SERVER_UNREACHABLE, str(exc))
    if isinstance(exc, ArtifactCorrupt):
        fail(ExitCode.ARTIFACT_CORRUPT, f"{exc}; nothing was installed")
    if isinstance(exc, ServerError) and exc.status_code in (401, 403):
        fail(ExitCode.NOT_AUTHORISED, str(exc))
    if isinstance(exc, TunecacheError):  # ServerError, or an answer that makes no sense
        fail(ExitCode.SERVER_ERROR, str(exc))
    raise exc


#: ``tunecache --token T``: overrides TUNECACHE_TOKEN and the token file for every command
#: (:func:`given_token`).
_token_option: str | None = None


def given_token() -> str | None:
    """The ``--token`` given before the command (``None`` when not given)."""
    return _token_option


#: The distributions whose versions ``tunecache --version`` prints, those installed.
VERSIONED_DISTRIBUTIONS = ("tunecache-client", "tunecache-server")


def installed_versions() -> list[tuple[str, str]]:
    """``(distribution, version)`` of each of :data:`VERSIONED_DISTRIBUTIONS` installed here
    (``importlib.metadata``); the server's is left out on a pod that has only the client."""
    found = []
    for name in VERSIONED_DISTRIBUTIONS:
        try:
            found.append((name, importlib.metadata.version(name)))
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def _print_version(value: bool) -> None:
    if value:
        versions = installed_versions()
        for name, version in versions or [("tunecache-client", "unknown (not installed; run from the source roots)")]:
            typer.echo(f"{name} {version}")
        raise typer.Exit(0)


def _global_options(
    token: Annotated[Optional[str], typer.Option(
        "--token", help="bearer token (default: TUNECACHE_TOKEN, else TUNECACHE_TOKEN_FILE, else, for the "
                        "tunecache serve on this machine that wrote it, its admin.token)")] = None,
    _version: Annotated[bool, typer.Option(
        "--version", is_eager=True, callback=_print_version,
        help="print the versions of tunecache-client and, where installed, tunecache-server, and exit")] = False,
) -> None:
    """Persistent autotune cache for LLM inference fleets: tune once per GPU node, install on every pod."""
    global _token_option
    _token_option = token


def new_app() -> typer.Typer:
    """The root ``tunecache`` app, with no commands yet: ``-h`` as well as ``--help`` on every
    command, the global options ``--token`` and ``--version``, help when no command is
    given, and no shell completion or rich tracebacks (:func:`run` prints errors as one line)."""
    app = typer.Typer(
        name="tunecache",
        help="Persistent autotune cache for LLM inference fleets: tune once per GPU node, install on every pod.",
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        add_completion=False,
        # -h as well as --help, on every command (sub-apps and commands inherit the context settings)
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    app.callback()(_global_options)
    return app


def connection_settings(settings_class: type | None = None):
    """The environment's settings of the HTTP store (``settings_class``, default
    :class:`~tunecache.store.http.settings.ConnectionSettings`) with ``--token`` and what the
    config file gives where no variable does (:mod:`tunecache.cli_config`); exit 2 naming a bad
    one or a config file that cannot be used, 13 for an empty token."""
    from tunecache.store.http.settings import EMPTY_TOKEN, ConnectionSettings, load_settings

    settings_class = settings_class or ConnectionSettings
    try:
        overrides = {name: value for name, value in cli_config.setting_overrides().items()
                     if name in settings_class.model_fields}
    except cli_config.ConfigError as exc:
        fail(ExitCode.USAGE, str(exc))
    try:
        return load_settings(settings_class, token=given_token(), **overrides)
    except ValueError as exc:
        empty = f"{'--token' if given_token() == '' else 'TUNECACHE_TOKEN'} {EMPTY_TOKEN}"
        fail(*((ExitCode.NOT_AUTHORISED, empty) if EMPTY_TOKEN in str(exc) else (ExitCode.USAGE, str(exc))))


def server_store(server: str, settings=None) -> TuningStore:
    """The HTTP store (:class:`tunecache.store.http.TunecacheClient`) of the server at ``server`` with
    ``settings`` (default: :func:`connection_settings`); exit 2 for a bad setting, 13 for a token in clear text."""
    from tunecache.store.http import InsecureTransport, TunecacheClient

    try:
        return TunecacheClient.from_settings(settings or connection_settings(), server)
    except ValueError as exc:
        fail(ExitCode.NOT_AUTHORISED if isinstance(exc, InsecureTransport) else ExitCode.USAGE, str(exc))


#: The exceptions of the click that typer runs on: click itself, or (typer 0.29 on) the copy
#: typer carries as ``typer._click``; found through ``typer.BadParameter``, one of them.
_click_errors = sys.modules[typer.BadParameter.__module__]
#: click 8.2 on: ``no_args_is_help`` prints the help and raises this (exit 2); older: exit 0.
_NoArgsIsHelp = getattr(_click_errors, "NoArgsIsHelpError", ())
#: click's Abort (Ctrl-C at a prompt, an EOF); typer 0.29's copy has none, and an ``except``
#: naming a missing attribute raised AttributeError over whatever was being handled.
_Abort = getattr(_click_errors, "Abort", ())


def usage_error_line(exc: Exception, app: typer.Typer) -> str:
    """One line for a usage error that click or typer found (a missing or unknown option, an
    unknown command, a value of the wrong type): ``tunecache: error: <message> (see
    tunecache <cmd> --help)``, in place of their boxed panel."""
    message = " ".join(exc.format_message().split()).rstrip(".")
    if message[:1].isupper() and message[1:2].islower():  # "Missing option" -> "missing option", as fail() writes
        message = message[0].lower() + message[1:]
    ctx = getattr(exc, "ctx", None)
    command = ctx.command_path if ctx is not None else app.info.name or "tunecache"
    return f"tunecache: error: {message} (see {command} --help)"


def _output_lost(exc: OutputUnwritable) -> NoReturn:
    """One line and exit 12 for a stdout that cannot be written (what is left of it dropped)."""
    if isinstance(sys.stdout, ReaderMayLeave):
        sys.stdout.discard()
    typer.echo(f"tunecache: error: {exc}", err=True)
    sys.exit(int(ExitCode.INSTALL_FAILED))


def run(app: typer.Typer, args: list[str] | None = None) -> NoReturn:
    """Run ``app`` (:func:`new_app`) with the commands registered on it: usage errors as one line on stderr and
    exit 2 (:data:`ExitCode.USAGE`), exit 130 on Ctrl-C; a reader that closes stdout early does not
    change the exit code (:class:`ReaderMayLeave`); a stdout that cannot be written is one line
    and exit 12 (:class:`OutputUnwritable`)."""
    command = typer.main.get_command(app)
    if not isinstance(sys.stdout, ReaderMayLeave) and sys.stdout is not None:
        sys.stdout = ReaderMayLeave(sys.stdout)
    try:
        # standalone_mode=False: click's errors reach here instead of typer's rich panel
        code = command.main(args, prog_name=app.info.name or "tunecache", standalone_mode=False)
    except KeyboardInterrupt:
        sys.exit(130)
    except _NoArgsIsHelp:
        sys.exit(int(ExitCode.USAGE))  # the help was printed already (no_args_is_help), as before
    except _click_errors.UsageError as exc:
        typer.echo(usage_error_line(exc, app), err=True)
        sys.exit(int(ExitCode.USAGE))
    except _click_errors.ClickException as exc:  # e.g. a file option that cannot be opened
        typer.echo(usage_error_line(exc, app), err=True)
        sys.exit(exc.exit_code)
    except _Abort:
        typer.echo("tunecache: error: aborted", err=True)
        sys.exit(int(ExitCode.UNEXPECTED))
    except OutputUnwritable as exc:
        _output_lost(exc)
    try:  # what is still buffered, before the exit code is decided
        sys.stdout.flush()
    except OutputUnwritable as exc:
        _output_lost(exc)
    # an Exit (typer.Exit, fail()) comes back as its code; a command that returns, as None
    sys.exit(code if isinstance(code, int) and not isinstance(code, bool) else 0)
