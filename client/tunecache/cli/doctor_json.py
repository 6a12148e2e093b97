"""``tunecache doctor --json``: doctor's checks, said as one JSON document on stdout
(:class:`tunecache.client.doctor_report.DoctorReport`) for a deployment pipeline to gate a
rollout on, with doctor's exit code (pull's decision: docs/pods.md's table).

The steps and their exit codes are the text doctor's (:func:`tunecache.cli.pod.doctor`): the trusted
keys as pull reads them, the environment, the key, the lookup, then each kind's verdict
(:func:`tunecache.client.preflight.preflight`). Every failure on the way ends the document
(``error``, ``exit_code``) instead of a line on stderr, and whatever a package prints while it
is imported goes to stderr, so that stdout is the document alone. One difference: on a machine
without a GPU FlashInfer cannot name it (``gpu: unknown``), and ``--gpu-name`` names the GPU the
pods will have, in the environment as in the key.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import typer

from tunecache import cli_kit
from tunecache.cli_kit import ExitCode, Failed, KeyOptions, client_errors, fail
from tunecache.client.doctor_report import DoctorReport, KindVerdict, image_versions, run_found
from tunecache.contract import INDETERMINATE_VALUES, EnvironmentMetadata, TuningKey


def _with_gpu_name(env: EnvironmentMetadata, gpu_name: str | None) -> EnvironmentMetadata:
    """``env`` with ``gpu`` as ``--gpu-name`` gives it, where FlashInfer could not tell it here."""
    if gpu_name and env.gpu in INDETERMINATE_VALUES:
        return env.model_copy(update={"gpu": gpu_name})
    return env


def _fill(report: DoctorReport, server: str, key_options: KeyOptions, environment: Path | None,
          environment_of: Callable[[Path | None], EnvironmentMetadata],
          key_of: Callable[[KeyOptions, str], TuningKey]) -> ExitCode:
    """Doctor's steps, each one's findings into ``report``; the exit code (a failure raises
    :class:`Failed`, as the text doctor's)."""
    from tunecache.cli.client import client_for, client_settings
    from tunecache.client.preflight import preflight
    from tunecache.signing import SigningError, load_trusted_keys
    from tunecache.store import NoCompatibleTuning

    try:  # as pull reads them
        configured = client_settings().trusted_keys
        trusted = load_trusted_keys(configured) if configured else None
    except SigningError as exc:
        fail(ExitCode.USAGE, str(exc))
    env = report.environment = _with_gpu_name(environment_of(environment), key_options.gpu_name)
    if env.indeterminate_fields():
        fail(ExitCode.USAGE, f"FlashInfer could not detect {', '.join(env.indeterminate_fields())} here"
             + (" (no GPU? --gpu-name names the pods' GPU)" if env.indeterminate_fields() == ["gpu"] else
                "; pass --environment FILE (a FlashInfer cache file written on the pod's GPU)"))
    key = report.key = key_of(key_options, env.gpu)
    with client_for(server) as client:
        try:
            run = client.lookup(key, env)
        except NoCompatibleTuning as exc:
            report.miss, report.error = exc.miss, exc.detail
            return ExitCode.NO_COMPATIBLE_TUNING
        except Exception as exc:
            client_errors(exc)
    report.run = run_found(run)
    found = preflight(run, key, env, trusted)
    report.kinds = [KindVerdict(kind=v.kind, loads=v.loads, why=v.detail) for v in found.verdicts]
    if found.refused is not None:  # pull's own decision, so pull's exit code
        fail(ExitCode.UNTRUSTED_RUN, f"{found.refused}; nothing would be installed")
    return ExitCode.OK


def doctor_json(server: str, key_options: KeyOptions, environment: Path | None,
                environment_of: Callable[[Path | None], EnvironmentMetadata],
                key_of: Callable[[KeyOptions, str], TuningKey]) -> NoReturn:
    """Print the :class:`DoctorReport` of doctor's checks (``environment_of``: the environment
    from ``--environment`` or detected; ``key_of``: the key of the options and the
    environment's GPU; both as the text doctor takes them, exiting by :func:`fail`) and exit
    with its exit code."""
    with contextlib.redirect_stdout(sys.stderr), cli_kit.failures_unsaid():
        report = DoctorReport(exit_code=int(ExitCode.UNEXPECTED), image=image_versions())
        try:
            report.exit_code = int(_fill(report, server, key_options, environment, environment_of, key_of))
        except Failed as exc:
            report.exit_code, report.error = exc.exit_code, exc.message
        except typer.Exit as exc:
            report.exit_code = exc.exit_code
        except Exception as exc:  # as the command's runner says one: one line, exit 1
            report.error = f"{type(exc).__name__}: {exc}"
    typer.echo(report.model_dump_json(indent=2))
    raise typer.Exit(report.exit_code)
