"""tunecache.service.local_token and ``GET /v1/token-proof``: the admin token a service leaves
for client commands on its machine, one file per database with the record of where it listens,
and the proof that a service holds a token, given without the token travelling."""

from __future__ import annotations

import hashlib
import secrets

from sqlalchemy import create_engine

from tests.support.builders import make_token
from tunecache.contract.tokens import token_proof
from tunecache.formats.local_token import ADMIN_TOKEN, Listener, read_record, read_token
from tunecache.service import db
from tunecache.service.local_token import database_identity, leave_admin_token


def _sqlite(path) -> str:
    engine = create_engine(f"sqlite:///{path}")
    db.upgrade(engine)
    engine.dispose()
    return f"sqlite:///{path}"


def test_two_databases_keep_their_own_token_files(tmp_path):
    data = tmp_path / "data"
    first_url, second_url = _sqlite(tmp_path / "first.db"), _sqlite(tmp_path / "second.db")
    here = Listener(scheme="http", host="127.0.0.1", port=8321)
    there = Listener(scheme="http", host="0.0.0.0", port=8322)
    first, second = db.create_db_engine(first_url), db.create_db_engine(second_url)
    try:
        left = leave_admin_token(first, data, first_url, here)
        assert left.created and left.path == data / ADMIN_TOKEN
        other = leave_admin_token(second, data, second_url, there)
        assert other.created and other.path != left.path and other.path.name.startswith("admin-")
        assert read_token(left.path) != read_token(other.path)
        assert read_record(left.path).database == database_identity(first_url)
        assert read_record(left.path).listeners == [here] and read_record(other.path).listeners == [there]
        # a restart of the first on another port: the same file, not a new token, both addresses listed
        moved = Listener(scheme="https", host="127.0.0.1", port=9000)
        again = leave_admin_token(first, data, first_url, moved)
        assert again.path == left.path and not again.created
        assert read_record(left.path).listeners == [here, moved]
        # an older file without a record is adopted by the database whose live token it holds
        token = read_token(other.path)
        other.path.with_name(other.path.name + ".json").unlink()
        adopted = leave_admin_token(second, data, second_url, there)
        assert adopted.path == other.path and read_token(other.path) == token
        assert read_record(other.path).database == database_identity(second_url)
    finally:
        first.dispose()
        second.dispose()


def test_a_database_whose_tokens_were_made_elsewhere_leaves_no_file(engine, tmp_path):
    make_token(engine, "ops", "admin")
    assert leave_admin_token(engine, tmp_path / "data", str(engine.url), Listener(scheme="http", host="127.0.0.1",
                                                                                   port=8321)) is None
    assert not (tmp_path / "data" / ADMIN_TOKEN).exists()


def test_the_proof_of_a_token_is_bound_to_its_secret_and_the_address(app_client, engine):
    token = make_token(engine, "node", "tune")
    token_id, secret = token.split("_", 2)[1:]
    challenge = secrets.token_hex(32)
    answer = app_client.get("/v1/token-proof", params={"token_id": token_id, "challenge": challenge},
                            headers={"Authorization": ""})  # open to anyone
    assert answer.status_code == 200
    key = hashlib.sha256(secret.encode()).hexdigest()
    assert answer.json()["proof"] == token_proof(key, challenge, "127.0.0.1", 8321)  # the app's host and port
    assert answer.json()["proof"] != token_proof(key, challenge, "127.0.0.1", 8322)
    assert token not in answer.text and secret not in answer.text
    unknown = app_client.get("/v1/token-proof", params={"token_id": "0" * 16, "challenge": challenge})
    assert unknown.status_code == 200 and len(unknown.json()["proof"]) == 64  # says nothing about which ids exist
    app_client.delete("/v1/tokens/node")
    revoked = app_client.get("/v1/token-proof", params={"token_id": token_id, "challenge": challenge}).json()
    assert revoked["proof"] != answer.json()["proof"]
    for bad in ({"token_id": "x" * 16, "challenge": challenge}, {"token_id": token_id, "challenge": "ab"}, {}):
        refused = app_client.get("/v1/token-proof", params=bad)
        assert refused.status_code == 422 and refused.json()["detail"]
