"""tunecache.service.tokens: the first admin token written to the data dir."""

from __future__ import annotations

import os
import stat

import pytest

from tunecache.service import db, tokens


@pytest.mark.parametrize("planted", ["symlink", "open file"])
def test_the_first_admin_token_is_never_written_through_a_name_another_user_planted(engine, tmp_path, planted):
    """Issue 21: in a data dir another user can write, that user may plant the temporary name
    the token is staged under (a link to a file of theirs, or a file of theirs they keep
    open). The token is staged under a name created exclusively, not following links, mode
    0600, and renamed into place: nothing the other user holds ever sees it."""
    data = tmp_path / "data"
    data.mkdir()
    data.chmod(0o777)
    theirs = tmp_path / "theirs"
    theirs.write_text("")
    theirs.chmod(0o666)
    guessed = data / f".admin.token.{os.getpid()}.tmp"  # the name it used to be staged under
    if planted == "symlink":
        guessed.symlink_to(theirs)
        watching = os.open(theirs, os.O_RDONLY)
    else:
        guessed.write_text("")
        guessed.chmod(0o666)
        watching = os.open(guessed, os.O_RDONLY)
    try:
        with db.session_factory(engine).begin() as session:
            assert tokens.bootstrap_admin_token(session, data / "admin.token")
        seen = os.read(watching, 4096)
    finally:
        os.close(watching)
    written = data / "admin.token"
    secret = written.read_text().strip()
    assert secret.startswith("tc_") and seen == b"" and theirs.read_text() == ""
    mode = os.lstat(written)
    assert stat.S_ISREG(mode.st_mode) and stat.S_IMODE(mode.st_mode) == 0o600
    others = [p for p in data.iterdir() if p != written and p != guessed]
    assert others == []  # no staged copy left behind


def test_a_planted_link_at_the_token_path_is_replaced_not_followed(engine, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    theirs = tmp_path / "theirs"
    theirs.write_text("")
    (data / "admin.token").symlink_to(theirs)
    with db.session_factory(engine).begin() as session:
        assert tokens.bootstrap_admin_token(session, data / "admin.token")
    assert theirs.read_text() == "" and not (data / "admin.token").is_symlink()
    assert stat.S_IMODE(os.lstat(data / "admin.token").st_mode) == 0o600
