"""Pod-side settings, read from ``TUNECACHE_*`` environment variables (pydantic-settings).

One :class:`ClientSettings` serves the CLI, the Python API and the vLLM plugin alike: how the
pod connects (:class:`tunecache.store.http.settings.ConnectionSettings`, the HTTP store's
settings, which it extends) and what the pod does. Each
field's ``description`` is its documentation, and so is each entry's of :data:`POD_VARIABLES`
(variables the pod code reads where it uses them) and :data:`POD_HANDOFF_VARIABLES` (what an
engine's main process hands to its workers): the pod guide's tables are made from them
(``scripts/settings_docs.py``).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic.fields import FieldInfo

from tunecache.formats.tarball import DEFAULT_MAX_UNPACK_BYTES, DEFAULT_MAX_UNPACK_FILES
from tunecache.store.http.settings import ConnectionSettings, load_settings


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
        "allows; `pull`: exit 4) (`tunecache.store.http.stall`). Not a positive whole number: the default")),
    "TUNECACHE_MIN_DOWNLOAD_RATE": Field(default=64 * 1024, gt=0, description=(
        "bytes per second below which an artifact's body is not moving: the seconds a body arrives at this rate or "
        "faster are not counted against `TUNECACHE_INSTALL_DEADLINE`, so a large download that keeps moving is never "
        "cut off by it. Not a positive whole number: the default")),
    "TUNECACHE_DOWNLOADS": Field(default=4, gt=0, description=(
        "how many of an install's artifacts are downloaded at once where they are downloaded before the install (the "
        "vLLM plugin's main process, a node cache: each streamed to a file, never whole in memory; 1: one after "
        "another); `tunecache pull` and the Python API without a node cache stream each tarball into its unpacking, "
        "one at a time. Not a positive whole number: the default")),
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


class ClientSettings(ConnectionSettings):
    """Settings of a pod's tunecache client: how it connects (:class:`ConnectionSettings`, the
    HTTP store's) and what the pod does (each field's ``description`` says what it does)."""

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
    trusted_keys: str | None = Field(default=None, description=(
        "public keys of the fleet's tuner nodes: a file (one `ed25519:...` per line) or a comma-separated list; "
        "runs signed by none of them install no JIT module, no DeepGEMM cache, and no tactics "
        "([trust.md](trust.md))"))


def load_client_settings(**overrides: object) -> ClientSettings:
    """The environment's :class:`ClientSettings` with ``overrides`` (``None`` values are ignored).

    Raises:
        ValueError: one line naming the variable and what is wrong with it, e.g.
            ``TUNECACHE_ATTEMPTS='x': Input should be a valid integer``.
    """
    return load_settings(ClientSettings, **overrides)
