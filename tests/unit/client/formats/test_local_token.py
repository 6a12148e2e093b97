"""tunecache.formats.local_token: which server URLs a local service's address reaches, and the
token files of a data dir."""

from __future__ import annotations

import pytest

from tunecache.formats.local_token import (
    ADMIN_TOKEN,
    MAX_LISTENERS,
    Listener,
    per_database_file,
    reaches,
    read_record,
    token_files,
    with_listener,
    write_record,
)


@pytest.mark.parametrize(("host", "url", "expected"), [
    ("127.0.0.1", ("http", "127.0.0.1", 8321), True),
    ("127.0.0.1", ("http", "127.0.0.1", 8322), False),  # another port
    ("127.0.0.1", ("https", "127.0.0.1", 8321), False),  # another scheme
    ("127.0.0.1", ("http", "127.0.0.2", 8321), False),  # another address: another process may listen there
    ("127.0.0.1", ("http", "localhost", 8321), False),  # a name may resolve to an address another process holds
    ("127.0.0.1", ("http", "::1", 8321), False),
    ("localhost", ("http", "localhost", 8321), True),
    ("0.0.0.0", ("http", "127.0.0.5", 8321), True),  # every IPv4 address, loopback ones among them
    ("0.0.0.0", ("http", "::1", 8321), False),
    ("0.0.0.0", ("http", "localhost", 8321), False),
    ("::", ("http", "::1", 8321), True),
    ("::1", ("http", "[::1]", 8321), True),
])
def test_an_address_reaches_only_what_it_listens_on(host, url, expected):
    assert reaches(Listener(scheme="http", host=host, port=8321), *url) is expected


def test_the_default_port_of_a_scheme():
    assert reaches(Listener(scheme="http", host="127.0.0.1", port=80), "http", "127.0.0.1", None)
    assert not reaches(Listener(scheme="https", host="127.0.0.1", port=80), "https", "127.0.0.1", None)


def test_token_files_and_their_records(tmp_path):
    assert token_files(tmp_path) == []
    second = per_database_file(tmp_path, "postgresql+psycopg://tc:***@db/tunecache")
    second.write_text("tc_x\n")
    (tmp_path / ADMIN_TOKEN).write_text("tc_y\n")
    assert token_files(tmp_path) == [tmp_path / ADMIN_TOKEN, second]  # the documented file first
    assert read_record(second) is None
    record = None
    for port in range(8000, 8000 + MAX_LISTENERS + 2):
        record = with_listener(record, "db", Listener(scheme="http", host="127.0.0.1", port=port))
    record = with_listener(record, "db", Listener(scheme="http", host="127.0.0.1", port=8005))  # again: moved last
    assert MAX_LISTENERS == 8 and [listener.port for listener in record.listeners] == [
        8002, 8003, 8004, 8006, 8007, 8008, 8009, 8005]  # the newest 8
    write_record(second, record)
    assert read_record(second) == record
    (tmp_path / f"{second.name}.json").write_text("{not json")
    assert read_record(second) is None  # not a record: the token names no service
