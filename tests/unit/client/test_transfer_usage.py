"""``tunecache export`` / ``tunecache import`` usage errors, in process through
:func:`tunecache.cli.run`: one line and exit 2, before any server or registry is asked; and
without the client's ``oci`` extra, one line saying how to install it."""

from __future__ import annotations

import sys

import pytest

from tunecache import cli
from tunecache.cli_kit import ExitCode


def _run(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exited:
        cli.run(list(args))
    out, err = capsys.readouterr()
    return exited.value.code, out, err


SERVER = ["--server", "http://127.0.0.1:9"]


@pytest.mark.parametrize("args, line", [
    (["export", *SERVER, "--all"],
     "tunecache: error: name one place for the bundle: --layout DIR or --registry REGISTRY/REPOSITORY[:TAG]"),
    (["export", *SERVER, "--all", "--layout", "x", "--registry", "r.example/x:1"],
     "tunecache: error: name one place for the bundle: --layout DIR or --registry REGISTRY/REPOSITORY[:TAG]"),
    (["export", *SERVER, "--layout", "x"], "tunecache: error: choose runs: --run ID, --model MODEL or --all"),
    (["import", *SERVER], "tunecache: error: name one place for the bundle: --layout DIR or --registry "
                          "REGISTRY/REPOSITORY[:TAG]"),
], ids=["export-nowhere", "export-two-places", "export-no-runs", "import-nowhere"])
def test_a_transfer_usage_error_is_one_line_and_exit_2(capsys, args, line):
    code, out, err = _run(capsys, *args)
    assert code == ExitCode.USAGE
    assert err.splitlines() == [line] and out == ""


def test_export_into_a_directory_that_holds_files_is_refused_untouched(capsys, tmp_path):
    (tmp_path / "mine.txt").write_text("keep")
    code, _, err = _run(capsys, "export", *SERVER, "--all", "--layout", str(tmp_path))
    assert code == ExitCode.BAD_INPUT
    assert err.splitlines() == [f"tunecache: error: {tmp_path} exists and is not an empty directory: a bundle is "
                                "written into a new one"]
    assert [p.name for p in tmp_path.iterdir()] == ["mine.txt"]


def test_without_the_oci_extra_the_commands_say_how_to_install_it(capsys, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "oras", None)  # as on a pod that installed tunecache-client alone
    import tunecache.client

    for name in ("oci_bundle", "oci_registry", "bundle_transfer"):  # imported afresh, as in a new process
        monkeypatch.delitem(sys.modules, f"tunecache.client.{name}", raising=False)
        monkeypatch.delattr(tunecache.client, name, raising=False)
    code, out, err = _run(capsys, "import", *SERVER, "--layout", str(tmp_path))
    assert code == ExitCode.USAGE and out == ""
    assert err.splitlines() == ["tunecache: error: export and import need oras-py (oras is not installed): "
                                "pip install 'tunecache-client[oci]'"]
