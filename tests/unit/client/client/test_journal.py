"""The install journal (tunecache.client.journal): what a live install journals is never undone
by another's recovery; a dead one's is, whichever of its steps were done, and repeatably.
(tests/e2e/test_whole_installs.py kills real installs; these check the rules one by one.)"""

from __future__ import annotations

import json
import os

from tunecache.client.atomic import all_or_nothing, swap_into_place, write_atomically
from tunecache.client.journal import journal_dir, recover_interrupted


def _module(path, content: bytes):
    path.mkdir(parents=True)
    (path / "m.so").write_bytes(content)
    return path


def test_a_live_installs_journal_is_left_alone_by_anothers_recovery(tmp_path):
    target = _module(tmp_path / "module", b"old")
    with all_or_nothing():
        swap_into_place(_module(tmp_path / "staged", b"new"), target)
        assert [p.suffix for p in journal_dir().iterdir()] == [".jsonl"]  # written down as it goes
        assert recover_interrupted() == 0  # locked: its process lives
        assert (target / "m.so").read_bytes() == b"new"
    assert (target / "m.so").read_bytes() == b"new" and list(journal_dir().iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["module", "pod-state"]


def _dead_journal(intents: list[dict], done: bool = False) -> None:
    """A journal file no process holds, as a killed install leaves it."""
    journal_dir().mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(i) for i in intents] + ([json.dumps({"done": True})] if done else [])
    (journal_dir() / "dead.jsonl").write_text("\n".join(lines) + "\n{\"target\": \"cut sho")


def _intent(target, old, new) -> dict:
    found = os.lstat(new)
    return {"target": str(target), "old": str(old) if old else None, "new": str(new), "ino": found.st_ino,
            "dev": found.st_dev}


def test_a_dead_installs_steps_are_undone_whichever_were_done_and_again_after_a_second_kill(tmp_path):
    swapped, written, added = _module(tmp_path / "swapped", b"old"), tmp_path / "file.json", tmp_path / "kernel"
    written.write_bytes(b"old file")
    new_dir, new_file, new_kernel = _module(tmp_path / "staged", b"new"), tmp_path / ".file.tmp", _module(tmp_path / "k", b"k")
    new_file.write_bytes(b"new file")
    kept_dir, kept_file = tmp_path / ".swapped.old-1", tmp_path / ".file.json.old-1"
    intents = [_intent(swapped, kept_dir, new_dir), _intent(written, kept_file, new_file), _intent(added, None, new_kernel)]
    # done: the directory swapped (two renames), the file replaced; the kernel never renamed in
    swapped.rename(kept_dir)
    new_dir.rename(swapped)
    os.link(written, kept_file)
    os.replace(new_file, written)
    _dead_journal(intents)
    assert recover_interrupted() == 1
    assert (swapped / "m.so").read_bytes() == b"old" and written.read_bytes() == b"old file" and not added.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.json", "pod-state", "swapped"]
    _dead_journal(intents)  # a recovery killed midway: the next one undoes what is left, and nothing more
    assert recover_interrupted() == 1
    assert (swapped / "m.so").read_bytes() == b"old" and written.read_bytes() == b"old file"
    assert list(journal_dir().iterdir()) == []


def test_a_dead_install_that_said_done_is_finished(tmp_path):
    written = tmp_path / "file.json"
    written.write_bytes(b"old file")
    with all_or_nothing():
        write_atomically(written, b"new file")
        [journal] = journal_dir().glob("*.jsonl")
        intents = [json.loads(line) for line in journal.read_text().splitlines()]
    kept = tmp_path / ".file.json.old-2"
    kept.write_bytes(b"old file")  # killed after it said done, before it dropped what it replaced
    _dead_journal([{**intents[0], "old": str(kept)}], done=True)
    assert recover_interrupted() == 1
    assert written.read_bytes() == b"new file" and not kept.exists()
