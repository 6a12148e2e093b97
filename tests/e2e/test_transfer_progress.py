"""Progress of ``pull``'s and ``push``'s artifact transfers (:mod:`tunecache.transfer_progress`)
against a live `tunecache serve`: the HTTP client tells every byte it receives or sends, the bar
appears on a terminal once the work has taken a second, and never on a pipe or with --quiet."""

from __future__ import annotations

import hashlib
import io

import httpx
from rich.console import Console

from tests.support.cli import MODEL
from tests.support.paths import CUDNN_FILE
from tests.support.serve import admin_headers, push_run
from tunecache import cli
from tunecache.store.http import TunecacheClient
from tunecache.transfer_progress import TransferProgress, transfer_progress


def terminal() -> Console:
    return Console(file=io.StringIO(), force_terminal=True, width=120)


def test_a_download_and_an_upload_are_told_byte_by_byte_on_a_terminal(server):
    run = push_run(server)
    artifact = run["artifacts"][0]
    console = terminal()
    with TunecacheClient(server) as client, TransferProgress("pulling", console=console, show_after_s=0) as progress:
        client.on_transfer = progress
        data = client.download_artifact(artifact["sha256"])
    assert progress.done == len(data) == artifact["size_bytes"] and progress.transfers == 1
    shown = console.file.getvalue()
    assert "pulling (1 artifact)" in shown and f"{len(data) / 1000:.1f} kB" in shown
    upload = b"{}" + bytes(300 * 1024)  # more than one part of the upload
    console = terminal()
    token = admin_headers()["Authorization"].split()[1]
    with TunecacheClient(server, token=token) as client, \
            TransferProgress("pushing", console=console, show_after_s=0) as progress:
        client.on_transfer = progress
        client.upload_artifact(upload)
    assert progress.done == len(upload) and "pushing" in console.file.getvalue()
    sha = hashlib.sha256(upload).hexdigest()
    assert httpx.get(f"{server}/v1/artifacts/{sha}").content == upload  # the parts arrived whole


def test_no_bar_before_a_second_on_a_pipe_or_when_quiet(server):
    run = push_run(server)
    sha = run["artifacts"][0]["sha256"]
    for options in ({"console": terminal(), "show_after_s": 60}, {"console": terminal(), "quiet": True, "show_after_s": 0},
                    {"console": Console(file=io.StringIO()), "show_after_s": 0}):
        with TunecacheClient(server) as client, TransferProgress("pulling", **options) as progress:
            client.on_transfer = progress
            client.download_artifact(sha)
        assert progress.done == run["artifacts"][0]["size_bytes"] and not progress.shown
        assert options["console"].file.getvalue() == ""


def test_transfer_progress_unhooks_itself(server):
    with TunecacheClient(server) as client:
        with transfer_progress(client, "pulling", quiet=True) as progress:
            assert client.on_transfer is progress
        assert client.on_transfer is None


def test_pull_and_push_on_a_pipe_print_what_they_did_before(server, capsys, tmp_path):
    def run(*args):
        try:
            cli.run(list(args))
        except SystemExit as exited:
            return exited.code, *capsys.readouterr()

    code, out, err = run("push", str(CUDNN_FILE), "--server", server, "--model", MODEL, "--max-num-batched-tokens", "8192")
    assert code == 0 and out.startswith("stored run 1 ") and err == ""
    code, out, err = run("pull", "--server", server, "--model", MODEL, "--max-num-batched-tokens", "8192", "--dest",
                         str(tmp_path), "--environment", str(CUDNN_FILE), "--quiet")
    assert code == 0 and out.strip().endswith(".json") and "pulling" not in err


def test_a_file_upload_and_a_streamed_download_are_told_too(server, tmp_path):
    """``upload_file`` (push of a big file, ``tunecache import``) and ``download_artifact_to`` (the
    install's streamed download) tell their bytes as the in-memory ones do."""
    path = tmp_path / "artifact.bin"
    path.write_bytes(b"{}" + bytes(700 * 1024))  # several parts
    token = admin_headers()["Authorization"].split()[1]
    seen = []
    with TunecacheClient(server, token=token) as client:
        client.on_transfer = lambda done, total: seen.append((done, total))
        sha = client.upload_file(path, again=True)
        assert seen[0] == (0, path.stat().st_size) and seen[-1] == (path.stat().st_size,) * 2
        assert len(seen) > 3 and [done for done, _ in seen] == sorted(done for done, _ in seen)
        seen.clear()
        with (tmp_path / "back.bin").open("wb+") as out:
            assert client.download_artifact_to(sha, out) == path.stat().st_size
        assert seen[-1][0] == path.stat().st_size
    assert (tmp_path / "back.bin").read_bytes() == path.read_bytes()
