"""The `tunecache` command's usage errors, one line each with exit 2 (``ExitCode.USAGE``),
and `tunecache --version`, in process through :func:`tunecache.cli.run` (the installed console
script, with the server's commands: tests/e2e/test_cli.py)."""

from __future__ import annotations

import importlib.metadata

import pytest

from tunecache import cli, cli_kit
from tunecache.cli_kit import ExitCode


def _run(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exited:
        cli.run(list(args))
    out, err = capsys.readouterr()
    return exited.value.code, out, err


@pytest.mark.parametrize("args, line", [
    (["pull", "--model", "m", "--max-num-batched-tokens", "8192"],
     "tunecache: error: missing option '--server' (env var: 'TUNECACHE_URL') (see tunecache pull --help)"),
    (["pull", "--server", "http://127.0.0.1:9", "--no-such-option"],
     "tunecache: error: no such option: --no-such-option (see tunecache pull --help)"),
    (["no-such-command"], "tunecache: error: no such command 'no-such-command' (see tunecache --help)"),
    (["token", "no-such-command"], "tunecache: error: no such command 'no-such-command' (see tunecache token --help)"),
    (["push", "x.json", "--server", "http://127.0.0.1:9", "--model", "m", "--max-num-batched-tokens", "many"],
     "tunecache: error: invalid value for '--max-num-batched-tokens': Input should be a valid integer, unable to "
     "parse string as an integer (see tunecache push --help)"),
    # a run id past the database's integer reached the server, whose 422 came back as a raw list, exit 5
    (["pin", "99999999999999999999", "--server", "http://127.0.0.1:9"],
     "tunecache: error: invalid value for 'run_id': Input should be less than or equal to 2147483647 "
     "(see tunecache pin --help)"),
], ids=["missing-option", "unknown-option", "unknown-command", "unknown-subcommand", "bad-value", "run-id-too-large"])
def test_a_usage_error_is_one_line_and_exit_2(capsys, args, line):
    code, out, err = _run(capsys, *args)
    assert code == ExitCode.USAGE == 2
    assert err.splitlines() == [line] and out == ""


def test_no_command_still_shows_the_help(capsys):
    code, out, err = _run(capsys)
    assert code == ExitCode.USAGE and "Commands" in out and err == ""


def test_version_without_the_server_names_the_client_only(capsys, monkeypatch):
    monkeypatch.setattr(cli_kit, "VERSIONED_DISTRIBUTIONS", ("tunecache-client", "tunecache-server-not-installed"))
    code, out, err = _run(capsys, "--version")
    assert code == 0 and out.splitlines() == [f"tunecache-client {importlib.metadata.version('tunecache-client')}"]


@pytest.mark.parametrize("given, said", [
    ('{"model": 1}', "tunecache: error: invalid --engine-args: engine_args.model is not an allowed engine argument: "
                     "the tuning key's or the vLLM warmup's own"),
    ('{"trust_remote_code": true}', "tunecache: error: invalid --engine-args: engine_args.trust_remote_code is not an "
                                    "allowed engine argument: imports or runs code"),
    ('{"worker_cls": "evil.Worker"}', "tunecache: error: invalid --engine-args: engine_args.worker_cls is not an allowed"),
    ('{"compilation_config": {"mode": 3, "inductor_passes": {"p": "evil.fn"}}}',
     "tunecache: error: invalid --engine-args: engine_args.compilation_config.inductor_passes is not an allowed engine "
     "argument: imports a module by name"),
    ('{"max_model_len": -1}', "tunecache: error: invalid --engine-args: engine_args.max_model_len is -1: must be from 1 to "),
    ('{"gpu_memory_utilization": 5}', "tunecache: error: invalid --engine-args: engine_args.gpu_memory_utilization is 5: "
                                      "must be over 0 and at most 1"),
    ('[8192]', "tunecache: error: --engine-args must be a JSON object of vllm.LLM arguments"),
    ('{oops', "tunecache: error: --engine-args is not JSON: "),
])
def test_engine_args_are_refused_in_one_line(given, said, capsys):
    import typer

    from tunecache.cli_kit import engine_args_option

    with pytest.raises(typer.Exit) as exited:
        engine_args_option(given)
    assert exited.value.exit_code == 2
    err = capsys.readouterr().err
    assert err.startswith(said) and err.count("\n") == 1, err
    assert engine_args_option('{"max_model_len": 8192, "compilation_config": {"cudagraph_mode": "FULL"}}') == {
        "max_model_len": 8192, "compilation_config": {"cudagraph_mode": "FULL"}}


def test_each_commands_help_is_paragraphs_of_one_line():
    """typer rewraps a docstring's paragraphs to the terminal but keeps the line breaks of all
    but the first, so a paragraph wrapped in the source broke mid-sentence in ``--help`` at any
    width (pin, prune, push, ...): each paragraph of a command's docstring is one line, lists
    and indented blocks aside."""
    import inspect

    import typer

    server_commands = typer.Typer()  # not the pod's app, which the other tests use as installed
    cli.load_command_plugins(server_commands)
    wrapped = []

    def walk(command, path: str) -> None:
        for name, sub in (getattr(command, "commands", None) or {}).items():
            walk(sub, f"{path} {name}")
        doc = inspect.getdoc(command.callback) if getattr(command, "callback", None) else None
        for paragraph in (doc or "").split("\n\n"):
            lines = paragraph.split("\n")
            if len(lines) > 1 and not any(line.startswith((" ", "-", "*", "|")) for line in lines):
                wrapped.append(f"{path}: {lines[0][:60]}")

    walk(typer.main.get_command(cli.app), "tunecache")
    walk(typer.main.get_command(server_commands), "tunecache")
    assert not wrapped, wrapped


@pytest.mark.parametrize("args, said", [
    (["push", "/dev/zero", "--server", "http://127.0.0.1:9", "--model", "m", "--max-num-batched-tokens", "8192"],
     "/dev/zero is over 4,194,304 bytes"),
    (["retune", "--server", "http://127.0.0.1:9", "--model", "m", "--max-num-batched-tokens", "8192",
      "--gpu-name", "NVIDIA H200", "--config", "/dev/zero"], "model config /dev/zero is over"),
    (["doctor", "--server", "http://127.0.0.1:9", "--model", "m", "--max-num-batched-tokens", "8192",
      "--environment", "/dev/zero"], "environment file /dev/zero is over 4,194,304 bytes"),
], ids=["push", "retune-config", "doctor-environment"])
def test_a_file_that_never_ends_is_read_bounded_and_refused_in_one_line(capsys, args, said):
    """A path naming a device or a pipe reports no size to ``stat``: ``push /dev/zero`` once read
    until the machine ran out of memory. Each file a command reads is read at most to its limit."""
    code, out, err = _run(capsys, *args)
    assert code == ExitCode.BAD_INPUT == 7, err
    assert said in err and len(err.splitlines()) == 1
