"""Client settings (pydantic-settings), the token header, Retry-After, and the CLI's plugin hook."""

from __future__ import annotations

import datetime as dt
import importlib.metadata

import httpx
import pytest
import typer

from tunecache import cli
from tunecache.store.http import InsecureTransport, TunecacheClient, retry_after_seconds
from tunecache.client.settings import ClientSettings, load_client_settings
from tunecache.formats.local_token import Listener, LocalAdminToken, write_record


def test_settings_come_from_tunecache_variables(monkeypatch, tmp_path):
    monkeypatch.setenv("TUNECACHE_URL", "http://tunecache:8321")
    monkeypatch.setenv("TUNECACHE_TOKEN", "s3cret")
    monkeypatch.setenv("TUNECACHE_JIT", "0")
    monkeypatch.setenv("TUNECACHE_PUSH_BACK", "1")
    monkeypatch.setenv("TUNECACHE_ENVIRONMENT_FILE", str(tmp_path / "env.json"))
    monkeypatch.setenv("TUNECACHE_DATABASE_URL", "sqlite:///x.db")  # the server's: ignored here
    settings = load_client_settings(attempts=5)
    assert settings.url == "http://tunecache:8321" and settings.token.get_secret_value() == "s3cret"
    assert settings.jit is False and settings.push_back is True and settings.attempts == 5
    assert settings.environment_file == tmp_path / "env.json"
    assert "s3cret" not in repr(settings)


def test_a_bad_variable_is_named_in_one_line(monkeypatch):
    monkeypatch.setenv("TUNECACHE_READ_TIMEOUT", "-1")
    with pytest.raises(ValueError, match=r"^TUNECACHE_READ_TIMEOUT='-1': Input should be greater than 0$"):
        load_client_settings()


@pytest.mark.parametrize("name, value, message", [
    ("TUNECACHE_READ_TIMEOUT", "inf", "less than or equal to 3600"),
    ("TUNECACHE_CONNECT_TIMEOUT", "1e12", "less than or equal to 3600"),
    ("TUNECACHE_TOKEN", "a\nb", "printable ASCII"),
    ("TUNECACHE_TOKEN", "\u00e9", "printable ASCII"),
])
def test_values_a_client_cannot_use_are_refused_by_name(monkeypatch, name, value, message):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=f"^{name}=") as error:
        load_client_settings()
    assert message in str(error.value) and "\n" not in str(error.value)
    if name == "TUNECACHE_TOKEN":
        assert value not in str(error.value)  # a secret is never echoed


def test_a_server_error_is_one_line_however_long_the_body():
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(500, text="<html>\n<body>\n" + "x" * 100_000 + "\n</body></html>")

    settings = ClientSettings(url="http://tunecache:8321", attempts=1)
    with TunecacheClient.from_settings(settings, transport=httpx.MockTransport(answer)) as client:
        with pytest.raises(Exception) as error:
            client.get_job(1)
    assert "\n" not in str(error.value) and len(str(error.value)) < 400


def test_the_token_is_sent_as_a_bearer_header():
    seen = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        return httpx.Response(404, json={"detail": "no tuning job 7"})

    settings = ClientSettings(url="https://tunecache:8321", token="s3cret", attempts=1)
    with TunecacheClient.from_settings(settings, transport=httpx.MockTransport(answer)) as client, pytest.raises(Exception):
        client.get_job(7)
    assert seen == ["Bearer s3cret"]


def test_a_token_never_travels_in_clear_text_to_another_machine(tmp_path):
    with pytest.raises(InsecureTransport, match="clear text to tunecache"):
        TunecacheClient.from_settings(ClientSettings(url="http://tunecache:8321", token="s3cret"))
    for loopback in ("http://127.0.0.1:8321", "http://localhost:8321", "http://[::1]:8321"):
        TunecacheClient.from_settings(ClientSettings(url=loopback, token="s3cret")).close()
    TunecacheClient.from_settings(ClientSettings(url="http://tunecache:8321", token="s3cret", allow_insecure=True)).close()
    TunecacheClient.from_settings(ClientSettings(url="http://tunecache:8321")).close()  # no token, nothing to leak
    with pytest.raises(ValueError, match="TUNECACHE_CA_BUNDLE"):
        TunecacheClient.from_settings(ClientSettings(url="https://tunecache:8321", ca_bundle=tmp_path / "missing.pem"))


def test_the_token_comes_from_the_option_the_variable_or_the_file(tmp_path, monkeypatch):
    token_file = tmp_path / "admin.token"
    monkeypatch.delenv("TUNECACHE_TOKEN", raising=False)
    assert ClientSettings(token_file=token_file).resolved_token() is None  # no file: no token
    token_file.write_text("tc_from_file\n")
    assert ClientSettings(token_file=token_file).resolved_token() == "tc_from_file"
    assert ClientSettings(token_file=token_file, token="tc_given").resolved_token() == "tc_given"
    assert ClientSettings(token_file=token_file, token="tc_given").resolved_credential().source == "--token"
    monkeypatch.setenv("TUNECACHE_TOKEN", "tc_from_env")
    assert ClientSettings(token_file=token_file).resolved_credential() == ("tc_from_env", "TUNECACHE_TOKEN")
    monkeypatch.delenv("TUNECACHE_TOKEN")
    assert ClientSettings(token_file=token_file).resolved_credential() == (
        "tc_from_file", f"TUNECACHE_TOKEN_FILE={str(token_file)!r}")
    monkeypatch.setenv("TUNECACHE_DATA_DIR", str(tmp_path))
    # the admin.token of a local tunecache serve goes only to the service that wrote it: never
    # without a server to prove it, nor without the record of where that service listens
    # (tests/e2e/test_local_token.py plays it with real services)
    assert ClientSettings().resolved_token() is None
    credential = ClientSettings().resolved_credential("http://127.0.0.1:8321")
    assert credential.token is None and "name no service" in credential.source
    write_record(token_file, LocalAdminToken(database="sqlite:////srv/tunecache.db", listeners=[
        Listener(scheme="http", host="127.0.0.1", port=8321)]))
    credential = ClientSettings().resolved_credential("http://127.0.0.1:8322")  # another port: not even asked
    assert credential.token is None and "sent only to the service that wrote them (listening at " \
        "http://127.0.0.1:8321)" in credential.source
    # the local service's admin token never goes to another server (a node running the service
    # sent it to any --server, and plain-http reads there were refused, exit 13)
    assert ClientSettings().resolved_token("https://tunecache.example:8321") is None
    assert ClientSettings().resolved_token("http://tunecache:8321") is None
    monkeypatch.setenv("TUNECACHE_TOKEN_FILE", str(token_file))  # a file the pod names is read for any server
    assert ClientSettings().resolved_token("https://tunecache.example:8321") == "tc_from_file"
    assert ClientSettings(token_file=token_file).resolved_token("https://tunecache.example:8321") == "tc_from_file"
    monkeypatch.delenv("TUNECACHE_TOKEN_FILE")
    monkeypatch.setenv("TUNECACHE_TOKEN", "")  # set but empty: refused, never a fall-back to the admin's file
    with pytest.raises(ValueError, match="set but empty: an empty token is refused"):
        ClientSettings()
    monkeypatch.delenv("TUNECACHE_TOKEN")
    token_file.write_text("\n")
    with pytest.raises(ValueError, match="TUNECACHE_TOKEN_FILE=.*the file is empty"):
        ClientSettings(token_file=token_file).resolved_token()
    token_file.write_bytes(b"\xd0\xcf\x11\xe0 binary")
    with pytest.raises(ValueError, match="TUNECACHE_TOKEN_FILE=.*not ASCII text"):
        ClientSettings(token_file=token_file).resolved_token()


def test_a_ca_bundle_without_certificates_is_a_one_line_error(tmp_path):
    not_pem = tmp_path / "ca.pem"
    not_pem.write_text("{}")
    with pytest.raises(ValueError, match="TUNECACHE_CA_BUNDLE=.*no usable PEM certificates"):
        TunecacheClient.from_settings(ClientSettings(url="https://tunecache:8321", ca_bundle=not_pem))


def test_retry_after_as_seconds_or_http_date():
    now = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.timezone.utc)
    assert retry_after_seconds("7") == 7.0
    assert retry_after_seconds("Mon, 30 Nov 2026 12:00:05 GMT", now=now) == 5.0
    assert retry_after_seconds("Mon, 30 Nov 2026 11:00:00 GMT", now=now) == 0.0
    assert retry_after_seconds("soon") is None and retry_after_seconds(None) is None


def test_a_broken_command_plugin_is_skipped_with_a_warning(monkeypatch, capsys):
    broken = importlib.metadata.EntryPoint(name="broken", value="tunecache_no_such_module:register", group=cli.COMMAND_PLUGINS_GROUP)
    added = importlib.metadata.EntryPoint(name="extra", value="tunecache.service.cli:register", group=cli.COMMAND_PLUGINS_GROUP)
    monkeypatch.setattr(cli, "entry_points", lambda group: [broken, added] if group == cli.COMMAND_PLUGINS_GROUP else [])
    target = typer.Typer()
    assert cli.load_command_plugins(target) == ["extra"]
    assert "commands of 'broken' (tunecache_no_such_module:register) not loaded: ModuleNotFoundError" in capsys.readouterr().err
    assert {c.callback.__name__ for c in target.registered_commands} == {"serve", "tune", "prune"}
