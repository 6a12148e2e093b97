"""Pod-side settings, read from ``TUNECACHE_*`` environment variables (pydantic-settings).

One :class:`ClientSettings` serves the CLI, the Python API and the vLLM plugin alike. Each
field's ``description`` is its documentation, and so is each entry's of :data:`POD_VARIABLES`
(variables the pod code reads where it uses them) and :data:`POD_HANDOFF_VARIABLES` (what an
engine's main process hands to its workers): the pod guide's tables are made from them
(``scripts/settings_docs.py``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, SettingsConfigDict

from tunecache.formats.tarball import DEFAULT_MAX_UNPACK_BYTES, DEFAULT_MAX_UNPACK_FILES


#: Pod variables read from the environment where they are used, not through
#: :class:`ClientSettings`: each declared as a field is, its default and its ``description``.
POD_VARIABLES: dict[str, FieldInfo] = {
    "TUNECACHE_STATE_DIR": Field(default=None, json_schema_extra={
        "shown_default": "`$XDG_CACHE_HOME/tunecache` or `~/.cache/tunecache`", "accepted": "path"}, description=(
        "where the pod remembers the newest signing time it installed per key and environment "
        "(`installed-signatures.json`; give pods a persistent directory there for the memory to outlive them): a "
        "run signed before it is refused as a replayed older run "
        "([trust.md](trust.md#publishing-what-becomes-current), `tunecache.client.installed`); and the journal of each "
        "install (`install-journal/`), by which the next install finishes or undoes one killed midway "
        "(`tunecache.client.journal`)")),
    "TUNECACHE_MAX_ANSWER_BYTES": Field(default=16 << 20, gt=0, description=(
        "the most bytes a JSON answer (a lookup, a run, a page of runs) may take, as decoded; past it nothing of it is "
        "used. Not a positive whole number: the default")),
    "TUNECACHE_MAX_UNPACK_BYTES": Field(default=DEFAULT_MAX_UNPACK_BYTES, gt=0, description=(
        "the most bytes an artifact may have, and a tarball may unpack to, checked at each entry's header before "
        "anything is written (`tunecache.formats.tarball`). Not a positive whole number: the default")),
    "TUNECACHE_MAX_UNPACK_FILES": Field(default=DEFAULT_MAX_UNPACK_FILES, gt=0, description=(
        "the most entries a tarball (or a FlashInfer v2 store) may make; the defaults are far above what a warm "
        "state holds (an 8B model's compile cache is about 23 MB in about 150 files). Not a positive whole number: "
        "the default")),
    "TUNECACHE_STALL_TIMEOUT": Field(default=10, gt=0, description=(
        "seconds of the window an artifact's body is measured over: a body that brings fewer bytes in a whole window "
        "than `TUNECACHE_MIN_DOWNLOAD_RATE` asks is stalled and cut off at once (retried while the install deadline "
        "allows; `pull`: exit 4) (`tunecache.client.http.stall`). Not a positive whole number: the default")),
    "TUNECACHE_MIN_DOWNLOAD_RATE": Field(default=64 * 1024, gt=0, description=(
        "bytes per second below which an artifact's body is not moving: the seconds a body arrives at this rate or "
        "faster are not counted against `TUNECACHE_INSTALL_DEADLINE`, so a large download that keeps moving is never "
        "cut off by it. Not a positive whole number: the default")),
    "TUNECACHE_DOWNLOADS": Field(default=4, gt=0, description=(
        "how many of an install's artifacts are downloaded at once (each streamed to a file, never whole in memory; "
        "1: one after another). Not a positive whole number: the default")),
    "TUNECACHE_BOOT_ID": Field(default=None, json_schema_extra={
        "shown_default": "a random id, made once per process start",
        "accepted": "8-64 letters, digits, `-`, `_`, `.`"}, description=(
        "the pod boot every report carries (`boot_id`): the fleet view counts a boot once. Made when vLLM loads the "
        "plugin (its main process does, before it starts its workers) or at the first report, and put in the "
        "environment, so vLLM's workers inherit it; set it yourself (e.g. to the pod's UID) if you like, but never "
        "the same for two boots (`tunecache.client.report.boot_id`)")),
}
#: What an engine's main process hands to the workers it starts, through their environment (set
#: by the plugin, read by the plugin; none is a setting to give): the value it is set to (as
#: the default) and who reads it (as the description).
POD_HANDOFF_VARIABLES: dict[str, FieldInfo] = {
    "TUNECACHE_BOOT_STARTED_NS": Field(default=None, json_schema_extra={
        "shown_default": "when the boot started (nanoseconds since the epoch)"}, description=(
        "the attestation: files written since then")),
    "TUNECACHE_WARM_STATE_RUN": Field(default=None, json_schema_extra={
        "shown_default": "the id of the run whose warm state the main process installed"}, description=(
        "the workers install that run's tactics only, fetched by its id (never what became current meanwhile), or, "
        "when it cannot be fetched, nothing; their reports name it")),
    "TUNECACHE_COMPILE_CACHE": Field(default=None, json_schema_extra={"shown_default": (
        "the run's compile cache, staged under the cache root's `.tunecache/` (and unpacked beside it on a thread "
        "of the main process, named by the boot)")}, description=(
        "each worker renames its directories into place under its own names before its first forward pass")),
    "TUNECACHE_ENGINE_ARGS": Field(default=None, json_schema_extra={
        "shown_default": "the pod's engine arguments that differ from vLLM's defaults (JSON)"}, description=(
        "each worker's report, which names its engine variant with them")),
    "TUNECACHE_FLASHINFER_AOT_DIR": Field(default=None, json_schema_extra={
        "shown_default": "`<workspace>/tunecache-aot`"}, description=(
        "each worker points FlashInfer's AOT directory there before its model loads")),
    "DG_JIT_CACHE_DIR": Field(default=None, json_schema_extra={
        "shown_default": "the DeepGEMM directory the run's kernels were merged into"}, description=(
        "DeepGEMM, in each worker")),
}


def _is_local(url: str) -> bool:
    """Whether ``url`` names a server on this machine (``localhost`` or a loopback address)."""
    import ipaddress
    from urllib.parse import urlsplit

    try:
        host = urlsplit(url).hostname or ""
    except ValueError:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def default_token_file() -> Path:
    """``admin.token`` in the data dir of a ``tunecache serve`` on this machine
    (``$TUNECACHE_DATA_DIR``, else ``$XDG_DATA_HOME/tunecache`` or ``~/.local/share/tunecache``)."""
    from tunecache.formats.local_token import ADMIN_TOKEN, default_data_dir

    return default_data_dir() / ADMIN_TOKEN


class ClientSettings(BaseSettings):
    """Settings of a pod's tunecache client (each field's ``description`` says what it does)."""

    model_config = SettingsConfigDict(env_prefix="TUNECACHE_", extra="ignore")

    url: str | None = Field(default=None, description=(
        "the tunecache server, e.g. `http://tunecache:8321` (the default `--server` of the pod commands; the plugin "
        "does nothing without it)"))
    token: SecretStr | None = Field(default=None, description=(
        "sent as `Authorization: Bearer <token>` on every request (`--token` overrides it); printable ASCII without "
        "spaces; an empty one is refused (exit 13), never taken as no token"))
    connect_timeout: float = Field(default=5.0, gt=0, le=3600, description="seconds to connect")
    read_timeout: float = Field(default=30.0, gt=0, le=3600, description="seconds to wait for each read")
    total_timeout: float = Field(default=120.0, gt=0, le=86400, description=(
        "seconds one request may take in all: every attempt, its wait for the first byte and the waits between "
        "attempts together (no retry starts that would begin past it)"))
    attempts: int = Field(default=3, gt=0, le=100, description=(
        "tries per request for transient failures (refused, reset, timeouts, cut-short bodies, 429, 502, 503, 504)"))
    max_retry_after: float = Field(default=30.0, ge=0, le=3600, description=(
        "the most seconds a server's `Retry-After` is waited for"))
    install_deadline: float = Field(default=30.0, gt=0, le=3600, description=(
        "seconds one install (the lookup and every artifact download together: `pull`, the Python API, the plugin) "
        "may take in all, not counting the seconds an artifact's body arrives at `TUNECACHE_MIN_DOWNLOAD_RATE` or "
        "faster; past it the install gives up and writes nothing, and the pod boots as without tunecache "
        "(`pull`: exit 4)"))
    node_cache_dir: Path | None = Field(default=None, json_schema_extra={"shown_default": "unset: no node cache"},
                                        description=(
        "a directory shared by the pods of a node (e.g. a `hostPath` mounted into each): verified artifacts are kept "
        "there by sha256, so the node downloads each once and the other pods install from disk; entries are renamed "
        "in whole after their sha256 checks, hashed again before use (a corrupt one is downloaded anew) "
        "(`tunecache.client.node_cache`). One the pod cannot write is not used"))
    node_cache_max_bytes: int = Field(default=50 << 30, gt=0, description=(
        "the most bytes the node cache keeps: admitting an artifact evicts the least recently used others past it; "
        "an artifact larger than it is not kept"))
    jit: bool = Field(default=True, description="plugin: also install the run's FlashInfer JIT modules")
    push_back: bool = Field(default=False, description=(
        "plugin: upload a pod's own tuning after a miss (stored unverified)"))
    dtype: str = Field(default="auto", description="plugin: the key's dtype (vLLM's `--dtype`)")
    quantization: str = Field(default="auto", description="plugin: the key's quantization")
    environment_file: Path | None = Field(default=None, description=(
        "plugin: read the environment from this file instead of detecting it"))
    token_file: Path = Field(default_factory=default_token_file, json_schema_extra={
        "shown_default": "`<data dir>/admin.token`"}, description=(
        "a file holding the token, read when `TUNECACHE_TOKEN` is unset and the file exists, and sent to any server. "
        "Unset: the admin token a `tunecache serve` on this machine wrote in its data dir (the data dir as the "
        "service's: `TUNECACHE_DATA_DIR`, else `$XDG_DATA_HOME/tunecache` or `~/.local/share/tunecache`; "
        "`admin.token`, or `admin-<hash>.token` for a second database), sent only to that service: to an address "
        "its record beside the file (`admin.token.json`) lists, once the service there has proved it holds the token "
        "([trust.md](trust.md#the-local-admin-token))"))
    ca_bundle: Path | None = Field(default=None, description=(
        "CA certificates (PEM) to verify the server's TLS certificate with (default: the system's); TLS is always "
        "verified"))
    allow_insecure: bool = Field(default=False, description=(
        "allow sending a token over plain `http://` to a host that is not loopback (refused otherwise: exit 13)"))
    trusted_keys: str | None = Field(default=None, description=(
        "public keys of the fleet's tuner nodes: a file (one `ed25519:...` per line) or a comma-separated list; "
        "runs signed by none of them install no JIT module, no DeepGEMM cache, and no tactics "
        "([trust.md](trust.md))"))
    report: bool = Field(default=True, description=(
        "after each install (`pull`, the Python API, the plugin) send the server a report of it, in the background; "
        "`0`: never"))
    report_timeout: float = Field(default=2.0, gt=0, le=60, description=(
        "seconds one report may take in all (one attempt; connect, send and answer together)"))

    def resolved_token(self, server_url: str | None = None) -> str | None:
        """The token to send to ``server_url``: :meth:`resolved_credential`'s."""
        return self.resolved_credential(server_url).token

    def resolved_credential(self, server_url: str | None = None) -> "Credential":
        """The token to send to ``server_url`` and where it comes from: ``token``
        (``--token`` or ``TUNECACHE_TOKEN``), else the first line of a ``TUNECACHE_TOKEN_FILE``
        that is set, read for any server, else the admin token a ``tunecache serve`` on this
        machine left in its data dir, for that service only: ``server_url`` must be an
        address its record lists and the service there must prove it holds the token
        (:mod:`tunecache.client.local_token`; one request), so no other listener or service
        ever gets it. Else no token, and the source says why none.

        Raises:
            ValueError: a ``TUNECACHE_TOKEN_FILE`` that is set exists but cannot be read, is
                empty or is not text.
        """
        if self.token is not None:
            value = self.token.get_secret_value()
            source = "TUNECACHE_TOKEN" if os.environ.get("TUNECACHE_TOKEN") == value else "--token"
            return Credential(value, source)
        if "token_file" in self.model_fields_set:
            return self._token_file_credential()
        if server_url is None or not _is_local(server_url):
            return Credential(None, "no token")
        import ssl

        import httpx

        from tunecache.client.local_token import local_admin_token

        try:
            verify = ssl.create_default_context(cafile=str(self.ca_bundle)) if self.ca_bundle is not None else True
        except (ssl.SSLError, OSError):
            verify = True  # the client made with these settings says what is wrong with the bundle
        # the proof is one small answer: a service that does not give it within seconds gets no token
        local = local_admin_token(server_url, self.token_file.parent, verify=verify, timeout=httpx.Timeout(
            min(self.read_timeout, PROOF_TIMEOUT_S), connect=min(self.connect_timeout, PROOF_TIMEOUT_S)))
        if local.token is not None:
            return Credential(local.token, f"the admin token of the tunecache serve listening there ({local.path})")
        return Credential(None, f"no token ({local.why_not})" if local.why_not else "no token")

    def _token_file_credential(self) -> "Credential":
        where = f"TUNECACHE_TOKEN_FILE={str(self.token_file)!r}"
        try:
            text = self.token_file.read_text(encoding="ascii").strip()
        except FileNotFoundError:
            return Credential(None, f"no token ({where} does not exist)")
        except UnicodeDecodeError:
            raise ValueError(f"{where}: not a token (the file is not ASCII text)") from None
        except OSError as exc:
            raise ValueError(f"{where}: cannot read it: {exc.strerror}") from None
        if not text:
            raise ValueError(f"{where}: the file is empty")
        return Credential(text.splitlines()[0].strip(), where)

    @field_validator("token")
    @classmethod
    def _token_fits_a_header(cls, token: SecretStr | None) -> SecretStr | None:
        value = token.get_secret_value() if token is not None else None
        if value == "":  # never "no token": that would fall back to the token file (an admin's, on a server's machine)
            raise ValueError(EMPTY_TOKEN)
        if value is not None and not (value.isascii() and value.isprintable() and " " not in value and value):
            raise ValueError("must be printable ASCII without spaces (it is sent in an HTTP header)")
        return token


#: The most seconds a local service's proof that it holds its admin token is waited for
#: (to connect, and for the answer).
PROOF_TIMEOUT_S = 5.0


class Credential(NamedTuple):
    """A token to send (``None``: none) and where it comes from, as a 401 names it: ``--token``,
    ``TUNECACHE_TOKEN``, ``TUNECACHE_TOKEN_FILE='...'``, the local service's admin token (its
    file), or ``no token`` with why."""

    token: str | None
    source: str


#: Why an empty token is refused (the CLI exits 13 with it).
EMPTY_TOKEN = ("is set but empty: an empty token is refused, never taken as no token (which would fall back to "
               "TUNECACHE_TOKEN_FILE or a local server's admin.token); unset it, or give a token")


def load_client_settings(**overrides: object) -> ClientSettings:
    """The environment's settings with ``overrides`` (``None`` values are ignored).

    Raises:
        ValueError: one line naming the variable and what is wrong with it, e.g.
            ``TUNECACHE_ATTEMPTS='x': Input should be a valid integer``.
    """
    given = {name: value for name, value in overrides.items() if value is not None}
    try:
        return ClientSettings(**given)
    except ValidationError as exc:
        error = exc.errors()[0]
        name = str(error["loc"][0]) if error["loc"] else "?"
        shown_input = "<hidden>" if name == "token" else repr(error.get("input"))
        shown = f"TUNECACHE_{name.upper()}={shown_input}" if name not in given else f"{name}={shown_input}"
        raise ValueError(f"{shown}: {error['msg']}") from None
