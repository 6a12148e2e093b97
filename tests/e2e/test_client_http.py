"""The HTTP client against a live `tunecache serve`: streamed uploads, verified downloads."""

from __future__ import annotations

import hashlib

from tests.support.paths import CUDNN_FILE
from tests.support.serve import admin_token
from tunecache.store.http import TunecacheClient

# What this module tests is the client's HTTP: its server runs on SQLite only (tests/conftest.py).
SERVER_DATABASE_INCIDENTAL = True


def test_upload_file_streams_and_skips_what_is_stored(server, tmp_path):
    big = tmp_path / "module.tar.gz"
    big.write_bytes(hashlib.sha256(b"x").digest() * 200_000)  # 6.4 MB: two server chunks
    with TunecacheClient(server, token=admin_token()) as client:
        sha = client.upload_file(big)
        assert sha == hashlib.sha256(big.read_bytes()).hexdigest()
        assert client.download_artifact(sha) == big.read_bytes()
        assert client.upload_file(big) == sha  # HEAD says stored: nothing sent again
        assert client.upload_file(CUDNN_FILE) == client.upload_artifact(CUDNN_FILE.read_bytes()).sha256
