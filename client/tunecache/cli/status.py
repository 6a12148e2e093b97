"""``tunecache status`` (one line per check of this machine's way to the service) and
``tunecache env`` (this machine's FlashInfer environment, as pods report it and as the
``vllm-flashinfer-environment`` ConfigMap of the Kubernetes example wants it); registered on
the ``tunecache`` app by :func:`register`.

``status``'s checks, in order, each one line ``CHECK: what was found``, and the exit code of
the first that failed (0 when none did):

====================  ======================================================  ====
check                 fails when                                              exit
====================  ======================================================  ====
``config``            the config file cannot be used                          2
``server``            no server given anywhere                                2
``reachable``         the server does not answer ``GET /v1/health``           4
``health``            it answers ``degraded`` (its problems are printed)      5
``server version``    it does not answer ``GET /v1/whoami`` (too old)         5
``token``             a token is sent that the service does not know          13
``trusted keys``      ``TUNECACHE_TRUSTED_KEYS`` (or the file's) is unusable  2
``environment``       ``--environment FILE`` cannot be read                   7
====================  ======================================================  ====

A machine without FlashInfer or a GPU (an operator's laptop) is no failure: the line says
what could not be detected.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from tunecache import cli_config
from tunecache.cli_kit import ExitCode, ServerOpt, fail, installed_versions
from tunecache.contract import EnvironmentMetadata

#: A Kubernetes object name (RFC 1123 subdomain), for ``env --configmap NAME``.
_K8S_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
#: The ConfigMap key the example pod mounts (deploy/kubernetes/examples/vllm-pod.yaml).
CONFIGMAP_KEY = "environment.json"

EnvironmentFileOpt = Annotated[Optional[Path], typer.Option(
    "--environment", help="FlashInfer cache file or JSON of its _metadata fields (default: detect with FlashInfer)")]


def _environment(path: Path | None, gpu_name: str | None) -> EnvironmentMetadata:
    """The environment from ``path`` (exit 7 if unusable), else detected with FlashInfer
    (exit 2 if FlashInfer is missing); ``gpu`` from ``gpu_name`` where FlashInfer could not tell it."""
    from tunecache.client.environment import EnvironmentUnavailable, detect_environment, environment_from_file
    from tunecache.contract import INDETERMINATE_VALUES

    try:
        env = environment_from_file(path) if path else detect_environment()
    except EnvironmentUnavailable as exc:
        fail(ExitCode.BAD_INPUT if path else ExitCode.USAGE, str(exc))
    if gpu_name and env.gpu in INDETERMINATE_VALUES:
        env = env.model_copy(update={"gpu": gpu_name})
    return env


def configmap_yaml(name: str, env: EnvironmentMetadata) -> str:
    """A ConfigMap ``name`` holding ``env`` as ``environment.json`` (the example pod's form)."""
    body = json.dumps(env.model_dump(mode="json"), indent=2)
    indented = "\n".join("    " + line for line in body.splitlines())
    return (f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n"
            f"data:\n  {CONFIGMAP_KEY}: |\n{indented}\n")


def env(
    as_json: Annotated[bool, typer.Option("--json", help="print the environment as one JSON object (what "
                                          "--environment FILE and the pods' environment.json read)")] = False,
    configmap: Annotated[Optional[str], typer.Option(
        "--configmap", help="print a Kubernetes ConfigMap of this name holding it as environment.json")] = None,
    environment: EnvironmentFileOpt = None,
    gpu_name: Annotated[Optional[str], typer.Option(
        "--gpu-name", help="the GPU's name where FlashInfer cannot tell it here (no GPU)")] = None,
) -> None:
    """This machine's FlashInfer environment, as pods report it: FlashInfer, CUDA, cuBLAS, cuDNN and CUTLASS DSL versions and the GPU (FlashInfer's own _metadata, from flashinfer.autotuner).

    --json prints the JSON object the example pod's vllm-flashinfer-environment ConfigMap holds (docs/kubernetes.md); --configmap NAME prints that ConfigMap whole (kubectl apply -f -). Run it in the pods' image on their GPU, or give --environment FILE (a FlashInfer cache file written there).

    Exit 0; 2 when FlashInfer is missing or cannot detect a field (no GPU: --gpu-name names the pods' GPU) or a bad --configmap name; 7 when --environment FILE cannot be read.
    """
    if as_json and configmap:
        fail(ExitCode.USAGE, "--json and --configmap print two forms of one thing: give one")
    if configmap is not None and not _K8S_NAME.fullmatch(configmap):
        fail(ExitCode.USAGE, f"--configmap {configmap[:80]!r} is not a Kubernetes name (lowercase letters, digits, "
                             "'-' and '.', at most 253)")
    found = _environment(environment, gpu_name)
    if found.indeterminate_fields():
        fail(ExitCode.USAGE, f"FlashInfer could not detect {', '.join(found.indeterminate_fields())} here"
             + (" (no GPU? --gpu-name names the pods' GPU)" if found.indeterminate_fields() == ["gpu"] else
                "; pass --environment FILE (a FlashInfer cache file written on the pods' GPU)"))
    if as_json:
        typer.echo(json.dumps(found.model_dump(mode="json"), indent=2))
    elif configmap:
        typer.echo(configmap_yaml(configmap, found), nl=False)
    else:
        for field, value in found.model_dump().items():
            typer.echo(f"{field}: {value}")
        typer.echo(f"environment hash: {found.environment_hash()}")


class _Checks:
    """``status``'s lines and the exit code of the first check that failed."""

    def __init__(self) -> None:
        self.code = ExitCode.OK

    def say(self, check: str, text: str, failed: ExitCode | None = None) -> None:
        typer.echo(f"{check}: {text}")
        if failed is not None and self.code is ExitCode.OK:
            self.code = failed


def _config_line(checks: _Checks) -> cli_config.ConfigFile | None:
    try:
        config = cli_config.read_config()
    except cli_config.ConfigError as exc:
        checks.say("config", f"FAILED: {exc}", ExitCode.USAGE)
        return None
    checks.say("config", f"{config.path} ({', '.join(config.values) or 'no settings'})" if config.exists
               else f"none ({config.path} does not exist)")
    return config


def _source(variable: str, key: str, config: cli_config.ConfigFile | None) -> str | None:
    """Where a setting came from: its variable, else the config file's key; ``None``: neither."""
    if os.environ.get(variable):
        return variable
    if config is not None and key in config.values:
        return f"{key} in {config.path}"
    return None


def _server_checks(checks: _Checks, server: str, timeout: float, config) -> None:
    """reachable, health, server version and token."""
    from tunecache.cli.client import client_settings, client_for
    from tunecache.store import ServerError, ServerUnreachable, TunecacheError

    settings = client_settings().model_copy(update={
        "connect_timeout": timeout, "read_timeout": timeout, "total_timeout": timeout, "attempts": 1})
    with client_for(server, settings) as client:
        started = time.monotonic()
        try:
            health = client.health()
        except ServerUnreachable as exc:
            checks.say("reachable", f"FAILED: {exc}", ExitCode.SERVER_UNREACHABLE)
            return
        except TunecacheError as exc:
            checks.say("reachable", f"FAILED: {exc}", ExitCode.SERVER_ERROR)
            return
        checks.say("reachable", f"yes, GET /v1/health answered in {(time.monotonic() - started) * 1000:.0f} ms")
        if health.status == "ok":
            checks.say("health", "ok" + (f" (database {health.database}, schema {health.schema_revision})"
                                         if health.database else ""))
        else:
            checks.say("health", f"FAILED: degraded: {'; '.join(health.problems or []) or 'its problems are shown to a token'}",
                       ExitCode.SERVER_ERROR)
        ours = dict(installed_versions()).get("tunecache-client", "unknown")
        try:
            me = client.whoami()
        except (ServerError, TunecacheError) as exc:
            checks.say("server version", f"FAILED: GET /v1/whoami: {exc} (a server older than this client, "
                                         f"tunecache-client {ours}?)", ExitCode.SERVER_ERROR)
            return
        checks.say("server version", f"tunecache-server {me.server_version} (this client: tunecache-client {ours})")
        source = client.token_source
        if source.startswith("TUNECACHE_TOKEN_FILE=") and not os.environ.get("TUNECACHE_TOKEN_FILE") and config:
            source = f"token_file in {config.path}"
        if client.has_token and me.anonymous:
            checks.say("token", f"FAILED: {source}: the service does not know this token (unknown or revoked)",
                       ExitCode.NOT_AUTHORISED)
        elif me.anonymous:
            checks.say("token", f"none ({source}): reads only, where the service leaves them open")
        else:
            checks.say("token", f"{me.name!r}, scope {me.scope} (from {source})")


def _trusted_keys_line(checks: _Checks, config) -> None:
    from tunecache.cli.client import client_settings
    from tunecache.signing import SigningError, load_trusted_keys

    value = client_settings().trusted_keys
    source = _source("TUNECACHE_TRUSTED_KEYS", "trusted_keys", config)
    if not value:
        checks.say("trusted keys", "none: pods with these settings install unsigned runs' tactics, and no JIT module, "
                                   "DeepGEMM cache or warm state (TUNECACHE_TRUSTED_KEYS)")
        return
    try:
        keys = load_trusted_keys(value)
    except SigningError as exc:
        checks.say("trusted keys", f"FAILED: {exc}", ExitCode.USAGE)
        return
    checks.say("trusted keys", f"{len(keys)} ({', '.join(sorted(keys))}) from {source}")


def _environment_line(checks: _Checks, path: Path | None) -> None:
    from tunecache.client.environment import EnvironmentUnavailable, detect_environment, environment_from_file

    try:
        found = environment_from_file(path) if path else detect_environment()
    except EnvironmentUnavailable as exc:
        if path:
            checks.say("environment", f"FAILED: {exc}", ExitCode.BAD_INPUT)
        else:
            checks.say("environment", f"not detected here: {exc}")
        return
    undetected = found.indeterminate_fields()
    checks.say("environment", f"flashinfer {found.flashinfer_version}, cuda {found.cuda_version}, gpu {found.gpu} "
                              f"({'from ' + str(path) if path else 'detected'}; tunecache env prints it whole)"
               + (f"; undetected: {', '.join(undetected)}" if undetected else ""))


def status(
    server: ServerOpt,
    environment: EnvironmentFileOpt = None,
    timeout: Annotated[float, typer.Option("--timeout", min=0.1, max=600, help="seconds each request to the "
                                           "server may take (one attempt)")] = 5.0,
) -> None:
    """Check this machine's way to the service, one line per check: the config file, the server and where it came from, reachability and health, the server's version, the token sent and its scope, the trusted keys, this machine's FlashInfer environment.

    Exit 0 when every check passed, else the code of the first that failed: 2 the config file or the trusted keys are unusable; 4 the server does not answer; 5 it answers degraded, or too old to say its version; 13 the token sent is unknown to it (revoked?); 7 --environment FILE cannot be read. No FlashInfer or GPU here is said, not failed.
    """
    checks = _Checks()
    config = _config_line(checks)
    origin = cli_config.server_origin()
    checks.say("server", f"{server} (from {origin.source if origin else '--server'})")
    _server_checks(checks, server, timeout, config)
    _trusted_keys_line(checks, config)
    _environment_line(checks, environment)
    raise typer.Exit(int(checks.code))


def register(app: typer.Typer) -> None:
    """Add ``status`` and ``env`` to ``app``."""
    app.command()(status)
    app.command()(env)
