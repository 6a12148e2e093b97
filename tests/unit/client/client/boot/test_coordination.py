"""The workers of one boot agree on what is installed, also when one gives up waiting for the
first (tunecache.client.boot.coordination: the commit window and the giving up, vllm#57423): the first
worker puts the run in place and records it only while no worker of its boot gave up, and a
worker that gives up follows a record that made it in first."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.support.paths import CUDNN_FILE
from tunecache.client.boot import coordination
from tunecache.client.install import InstallResult
from tunecache.contract import ReportOutcome


def a_pod(root: Path, rank: int) -> coordination.Pod:
    return coordination.Pod(root=root, config_hash="cd" * 32, rank=rank, instance="boot-1", file_names=("r0.json", "r1.json"),
                    rank_file=root / ("cd" * 32) / f"r{rank}.json")


SETTINGS = SimpleNamespace(report=False, install_deadline=1.0)


def test_a_worker_that_gave_up_first_keeps_the_first_from_installing(tmp_path):
    follower = a_pod(tmp_path, 1)
    given_up = coordination._give_up(follower, SETTINGS, time.monotonic() - 12, 1.0)
    assert given_up.outcome is ReportOutcome.ERROR and follower.abandoned.exists()
    with pytest.raises(coordination.Abandoned, match="nothing was installed, so that every rank boots without the run alike"):
        with coordination._commit_window(a_pod(tmp_path, 0)):
            pytest.fail("the first worker must not put anything in place")
    other_boot = coordination.Pod(**{**vars(a_pod(tmp_path, 0)), "instance": "boot-2"})
    with coordination._commit_window(other_boot):  # another boot's marker is its own
        pass


def test_a_worker_that_gives_up_after_the_first_recorded_follows_the_record(tmp_path):
    first, follower = a_pod(tmp_path, 0), a_pod(tmp_path, 1)
    data = CUDNN_FILE.read_bytes()
    with coordination._commit_window(first):
        for name in first.file_names:
            (first.root / first.config_hash).mkdir(parents=True, exist_ok=True)
            (first.root / first.config_hash / name).write_bytes(data)
        coordination._write_record(first, coordination.PodRecord(
            instance=first.instance, rank=0, host="h", pid=1,
            result=InstallResult(outcome=ReportOutcome.INSTALLED, run_id=7, entries=1, sha256=hashlib.sha256(data).hexdigest(),
                                 paths=(first.root / first.config_hash,))))
    followed = coordination._give_up(follower, SETTINGS, time.monotonic() - 12, 1.0)
    assert followed.outcome is ReportOutcome.INSTALLED and not follower.abandoned.exists()


def test_an_install_that_fails_midway_takes_back_what_it_put_in_place_and_the_old_entries_return(tmp_path):
    from tunecache.client.atomic import all_or_nothing, note_added, swap_into_place, write_atomically

    replaced, written, added = tmp_path / "module", tmp_path / "file.json", tmp_path / "kernel.a"
    replaced.mkdir()
    (replaced / "old.so").write_bytes(b"old")
    written.write_bytes(b"old file")
    with pytest.raises(OSError, match="volume full"), all_or_nothing():
        staged = tmp_path / "staged"
        staged.mkdir()
        (staged / "new.so").write_bytes(b"new")
        swap_into_place(staged, replaced)
        write_atomically(written, b"new file")
        kernel = tmp_path / "staged-kernel"
        kernel.mkdir()
        note_added(added, kernel)
        kernel.rename(added)
        raise OSError("volume full")
    assert sorted(p.name for p in replaced.iterdir()) == ["old.so"] and written.read_bytes() == b"old file"
    assert not added.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["file.json", "module", "pod-state"]
    with all_or_nothing():  # one that ends well drops what it replaced
        staged = tmp_path / "staged"
        staged.mkdir()
        (staged / "new.so").write_bytes(b"new")
        swap_into_place(staged, replaced)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.json", "module", "pod-state"]
    assert sorted(p.name for p in replaced.iterdir()) == ["new.so"]
    assert list((tmp_path / "pod-state" / "install-journal").iterdir()) == []  # each journal went with its install
