"""What this pod installed before: the newest signing time per key and environment, so that a
replayed older run (a proxy or a second recorder serving run 1 after run 2) is refused. An
engine variant's compile cache, fetched on its own (:func:`tunecache.client.boot.staged.fetch_variant_compile_cache`),
has a slot of its own beside its key's: ``"<key hash>/<environment hash>/<variant>"``. A run
that records the package versions it was built with has a slot per image
(:func:`tunecache.formats.dependencies.image_of`; ``"...@<image>"``): a fleet upgraded node by
node serves each image its own run, so a run of this pod's image signed before another image's
that this pod once installed is no replay.

Kept in ``$TUNECACHE_STATE_DIR/installed-signatures.json`` (default ``~/.cache/tunecache``;
give pods a persistent directory there for the memory to outlive them), a JSON object
``{"<key hash>/<environment hash>": signed_at}``, rewritten whole (staged and renamed). A
missing or unreadable file is an empty memory: a fresh pod accepts any run whose signature
checks and has not expired (the expiry bounds that window).
"""

from __future__ import annotations

import json
from pathlib import Path

from tunecache.client.atomic import write_atomically
from tunecache.client.journal import state_dir
from tunecache.contract import EnvironmentMetadata, TuningKey

STATE_FILE = "installed-signatures.json"


def state_path() -> Path:
    """``$TUNECACHE_STATE_DIR/installed-signatures.json`` (default ``~/.cache/tunecache``)."""
    return state_dir() / STATE_FILE


def _slot(key: TuningKey, environment: EnvironmentMetadata, variant: str | None = None, image: str | None = None) -> str:
    return (f"{key.key_hash()}/{environment.environment_hash()}" + (f"/{variant}" if variant else "")
            + (f"@{image}" if image else ""))


def _read() -> dict[str, int]:
    try:
        doc = json.loads(state_path().read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in doc.items() if isinstance(v, int)} if isinstance(doc, dict) else {}


def newest_installed(key: TuningKey, environment: EnvironmentMetadata, variant: str | None = None,
                     image: str | None = None) -> int | None:
    """The newest signing time (seconds since the epoch) of a run this pod installed for the key
    (with ``variant``: of that engine variant's compile cache; with ``image``: of a run of that image)."""
    return _read().get(_slot(key, environment, variant, image))


def remember_installed(key: TuningKey, environment: EnvironmentMetadata, signed_at: int | None,
                       variant: str | None = None, image: str | None = None) -> None:
    """Remember ``signed_at`` for the key (with ``variant``: for that variant; with ``image``:
    for the runs of that image) when it is newer. Never raises (a read-only state directory
    only means a shorter memory)."""
    if signed_at is None:
        return
    try:
        state = _read()
        slot = _slot(key, environment, variant, image)
        if state.get(slot, -1) < signed_at:
            state[slot] = signed_at
            write_atomically(state_path(), json.dumps(state, sort_keys=True).encode())
    except OSError:
        pass
