"""tunecache as a warmup-cache store of vLLM's ``vllm preload`` (vLLM 0.34).

vLLM 0.34's preload daemons (``vllm preload``, one spawned process per GPU:
``model_executor/model_loader/weight_cache/daemon.py::_run_daemon``) tune FlashInfer once and
share the per-rank tables through warmup-cache stores: ``--warmup-cache-stores a,b`` names
backends of ``weight_cache/artifact_store.py::STORE_BACKENDS`` (name -> a constructor taking no
argument, "a new backend is one entry"), each an ``ArtifactStore``: ``name``,
``get(key) -> bytes | None`` and ``put(key, data) -> None``, with keys made by
``artifact_key(kind, config_hash, filename)``: ``vllm-warmup-cache/flashinfer_autotune/<config
hash>/autotune_configs_dp{dp}_rank{rank}.json`` (``warmup_cache.py::FlashInferWarmupCache``; the
config hash is ``flashinfer_autotune_cache_hash``'s). A daemon reads the stores in order before
tuning (``_adopt_from_stores``, then vLLM's own ``validate_payload`` against its FlashInfer) and
publishes its table to every store after (``_publish_autotune_table``).

:class:`TunecacheArtifactStore` is the store ``tunecache`` (``--warmup-cache-stores tunecache``):

* **get**: the current run of this daemon's key (:class:`StoreTarget`: the key a pod of the
  same deployment asks for, its FlashInfer environment), fetched and verified as a pod's
  install verifies it (:func:`tunecache.client.install.fetch_tuning` with the pod's
  ``TUNECACHE_TRUSTED_KEYS``: signed over this daemon's own key and environment by a trusted
  key, never older than a run installed here), and its FlashInfer file handed to vLLM for any
  rank of that key (one file serves every rank, as the plugin installs it). Stricter than a
  pod: without trusted keys it serves nothing; an unsigned or untrusted run is refused (one
  warning line); a key of another config hash or kind is a miss.
* **put**: rank 0's table of this daemon's key (one table per key, as the plugin's push-back)
  uploaded as an unverified ``pod`` run, exactly as ``tunecache push`` records one (the
  service stores it unverified and never makes it current); the table this store served
  itself, published back by vLLM after adopting it, is not uploaded again.

Neither ever raises into vLLM: a failure is one warning line under vLLM's logger and a miss.

**Registration** (:func:`register_store`, from the plugin's ``register`` where the release's
:attr:`~tunecache.engines.vllm.releases.VllmRelease.warmup_cache_store` says so: 0.34; 0.33 and
older are not registered). The daemons are spawned processes (``multiprocessing`` ``spawn``)
that load no vLLM plugins, and only there is the store built (``store_sources``). So the
plugin, in ``vllm preload``'s own process (which loads the general plugins while it builds its
parser and config), adds the entry to ``STORE_BACKENDS`` and wraps ``daemon._run_daemon`` with
:func:`run_daemon`; ``preload.py`` imports ``_run_daemon`` inside its command and hands it to
``ctx.Process``, so the spawned process unpickles :func:`run_daemon` by its own name, imports
this module, registers the store in that process and remembers the daemon's ``vllm_config``
(the key's and the config hash's source) before vLLM's ``_run_daemon`` runs.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.abc
import importlib.machinery
import logging
import re
import socket
import sys
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from tunecache.contract import MAX_AUTOTUNE_FILE_BYTES, EnvironmentMetadata, TuningKey

#: Under vLLM's own logger, as the plugin's lines (:mod:`tunecache.client.boot.hooks`).
log = logging.getLogger("vllm.plugins.tunecache")

#: The store's name in ``STORE_BACKENDS`` and ``--warmup-cache-stores``.
STORE_NAME = "tunecache"
#: ``FlashInferWarmupCache.kind``: the one warmup cache vLLM 0.34's daemons share.
KIND = "flashinfer_autotune"
#: An artifact key of that kind (``artifact_key`` over ``flashinfer_autotune_filename``); nothing
#: else is read or written.
_ARTIFACT_KEY = re.compile(r"^vllm-warmup-cache/flashinfer_autotune/(?P<config_hash>[0-9a-f]{64})/"
                           r"autotune_configs_dp(?P<dp>[0-9]{1,6})_rank(?P<rank>[0-9]{1,6})\.json$")

#: This daemon process's ``vllm_config``, as :func:`run_daemon` received it (``None``: not a daemon).
_daemon_config: Any = None
#: vLLM's own ``_run_daemon`` in this process, kept by :func:`register_store`.
_vllm_run_daemon: Any = None


@dataclass(frozen=True)
class ArtifactName:
    """What an artifact key names: the table of one rank of one config hash."""

    config_hash: str
    dp_rank: int
    rank: int

    @classmethod
    def parse(cls, key: str) -> "ArtifactName | None":
        """The key's parts, or ``None`` for any key that is not a FlashInfer table's."""
        match = _ARTIFACT_KEY.fullmatch(key) if isinstance(key, str) else None
        return cls(match["config_hash"], int(match["dp"]), int(match["rank"])) if match else None


@dataclass(frozen=True)
class StoreTarget:
    """What this store serves: the key and FlashInfer environment a pod of this daemon's
    deployment asks for, and the config hash vLLM names that deployment's tables by."""

    key: TuningKey
    environment: EnvironmentMetadata
    config_hash: str

    @classmethod
    def of_daemon(cls, config: Any, settings: Any) -> "StoreTarget":
        """The target of a preload daemon's ``vllm_config``: the key as the plugin makes it
        (:func:`tunecache.client.boot.engine.config_key`), the environment as a pod's worker
        detects it (:func:`tunecache.client.boot.coordination.pod_environment`) and the config
        hash from vLLM's own ``flashinfer_autotune_cache_hash`` (it reads only
        ``runner.vllm_config``)."""
        from vllm.model_executor.warmup.flashinfer_autotune_cache import flashinfer_autotune_cache_hash

        from tunecache.client.boot.coordination import pod_environment
        from tunecache.client.boot.engine import config_key

        environment = pod_environment(settings)
        return cls(config_key(config, environment, settings), environment,
                   flashinfer_autotune_cache_hash(SimpleNamespace(vllm_config=config)))


class TunecacheArtifactStore:
    """vLLM's ``ArtifactStore`` (``weight_cache/artifact_store.py``) backed by tunecache (see
    the module). vLLM builds it with no argument; ``target`` and ``settings`` are resolved at
    the first call then (:meth:`StoreTarget.of_daemon`, ``ClientSettings`` from the environment)."""

    name = STORE_NAME

    def __init__(self, target: StoreTarget | None = None, settings: Any = None) -> None:
        self._target = target
        self._settings = settings
        self._known: set[str] = set()
        """sha256 of the tables this store served or uploaded: never uploaded (again)."""

    def get(self, key: str) -> bytes | None:
        """The FlashInfer file of the current run of this daemon's key, signed by a trusted
        key, for any rank's ``key`` of its config hash; ``None`` otherwise (a miss)."""
        try:
            return self._get(key)
        except Exception as exc:  # never into vLLM: a miss, and it tunes or asks the next store
            log.warning("tunecache: warmup-cache store: no table for %s: %s: %s", key, type(exc).__name__, exc)
            return None

    def put(self, key: str, data: bytes) -> None:
        """Upload rank 0's table of this daemon's key as an unverified ``pod`` run."""
        try:
            self._put(key, data)
        except Exception as exc:
            log.warning("tunecache: warmup-cache store: %s not uploaded: %s: %s", key, type(exc).__name__, exc)

    # ------------------------------------------------------------------------------------------

    def _resolved(self) -> tuple[StoreTarget, Any] | None:
        if self._settings is None:
            from tunecache.client.settings import load_client_settings

            self._settings = load_client_settings()
        if not self._settings.url:
            log.warning("tunecache: warmup-cache store: TUNECACHE_URL is not set, it serves nothing")
            return None
        if self._target is None:
            if _daemon_config is None:
                log.warning("tunecache: warmup-cache store: not in a preload daemon, no key to serve")
                return None
            self._target = StoreTarget.of_daemon(_daemon_config, self._settings)
        return self._target, self._settings

    def _get(self, key: str) -> bytes | None:
        from tunecache.store.http import TunecacheClient
        from tunecache.client.install import fetch_tuning
        from tunecache.signing import UntrustedRun, load_trusted_keys
        from tunecache.store import NoCompatibleTuning

        name = ArtifactName.parse(key)
        resolved = self._resolved() if name is not None else None
        if resolved is None or resolved[0].config_hash != name.config_hash:
            return None
        target, settings = resolved
        if not settings.trusted_keys:
            log.warning("tunecache: warmup-cache store: serves only signed tables, and no trusted keys are set "
                        "(TUNECACHE_TRUSTED_KEYS)")
            return None
        trusted = load_trusted_keys(settings.trusted_keys)
        try:
            with TunecacheClient.from_settings(settings) as client:
                fetched = fetch_tuning(client, target.key, target.environment, trusted_keys=trusted)
        except NoCompatibleTuning:
            return None
        except UntrustedRun as exc:
            log.warning("tunecache: warmup-cache store: %s", exc)
            return None
        self._known.add(hashlib.sha256(fetched.autotune).hexdigest())
        log.info("tunecache: warmup-cache store: run %s (signed by %s) for %s", fetched.run.id, fetched.signed_by, key)
        return fetched.autotune

    def _put(self, key: str, data: bytes) -> None:
        from tunecache.client.autotune_file import pushed_run
        from tunecache.store.http import TunecacheClient
        from tunecache.formats.autotune_file import parse_autotune_file

        name = ArtifactName.parse(key)
        if name is None or (name.dp_rank, name.rank) != (0, 0):
            return  # one table per key: rank 0's, as the plugin's push-back
        if not isinstance(data, bytes) or len(data) > MAX_AUTOTUNE_FILE_BYTES:
            log.warning("tunecache: warmup-cache store: %s not uploaded: not a table of at most %d bytes", key,
                        MAX_AUTOTUNE_FILE_BYTES)
            return
        sha256 = hashlib.sha256(data).hexdigest()
        resolved = self._resolved()
        if resolved is None or resolved[0].config_hash != name.config_hash or sha256 in self._known:
            return
        target, settings = resolved
        parsed = parse_autotune_file(data, source=key)
        with TunecacheClient.from_settings(settings) as client:
            stored = client.upload_artifact(data)
            run = client.record_run(pushed_run(target.key, parsed, stored.sha256, "pod", socket.gethostname()))
        self._known.add(sha256)
        log.info("tunecache: warmup-cache store: published %s as unverified run %s", key, run.id)


def register_store(release: Any) -> bool:
    """Make ``tunecache`` one of ``release``'s warmup-cache stores in this process and in the
    preload daemons it spawns (see the module); ``False`` where the release has none
    (:attr:`~tunecache.engines.vllm.releases.VllmRelease.warmup_cache_store`: 0.33 and older).

    Nothing of vLLM is imported here: the daemon's module (torch, the distributed layer) is
    only ever imported by ``vllm preload``, so the entry and the wrap are made right after it
    is imported (:class:`_AfterImport`), or at once where it is already. Idempotent."""
    if not getattr(release, "warmup_cache_store", False):
        return False
    module = _daemon_target().module
    if module in sys.modules:
        _patch(sys.modules[module])
    elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(module, _patch))
    return True


def _daemon_target() -> Any:
    from tunecache.engines.vllm.adaptor import PRELOAD_HOOK_TARGETS

    [target] = [t for t in PRELOAD_HOOK_TARGETS if t.role == "preload_daemon"]
    return target


def _patch(daemon: Any) -> None:
    """Add the store to ``STORE_BACKENDS`` and wrap the daemon module's ``_run_daemon`` with
    :func:`run_daemon` (the daemon's module imports the stores' module, so it is there)."""
    global _vllm_run_daemon
    from tunecache.engines.vllm.adaptor import PRELOAD_HOOK_TARGETS

    [stores] = [t for t in PRELOAD_HOOK_TARGETS if t.role == "warmup_cache_stores"]
    getattr(importlib.import_module(stores.module), stores.qualname).setdefault(STORE_NAME, TunecacheArtifactStore)
    name = _daemon_target().qualname
    current = getattr(daemon, name)
    if current is not run_daemon:
        _vllm_run_daemon = current
        setattr(daemon, name, run_daemon)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``then(module)`` right after the module ``name`` is first imported (found by the
    path finder as any module; its loader's ``exec_module`` runs first). Removes itself."""

    def __init__(self, name: str, then: Any) -> None:
        self.name, self.then = name, then

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loaded, then = spec.loader.exec_module, self.then

        def exec_module(module: Any) -> None:
            loaded(module)
            try:
                then(module)
            except Exception as exc:  # never into vLLM's import
                log.warning("tunecache: not a warmup-cache store of vllm preload (%s: %s)", type(exc).__name__, exc)

        spec.loader.exec_module = exec_module
        return spec


def run_daemon(*args: Any, **kwargs: Any) -> Any:
    """vLLM's ``_run_daemon(global_rank, local_rank, vllm_config, ...)`` in a spawned preload
    daemon: registers the store in this process (:func:`_patch`) and remembers the daemon's
    ``vllm_config``, then runs vLLM's. Pickled by its own name (module-level, not wrapped
    with ``functools.wraps``), so the spawned process imports this module."""
    global _daemon_config
    _daemon_config = kwargs["vllm_config"] if "vllm_config" in kwargs else args[2]
    target = _daemon_target()
    daemon = importlib.import_module(target.module)
    try:
        _patch(daemon)
    except Exception as exc:
        log.warning("tunecache: warmup-cache store not registered in this daemon: %s: %s", type(exc).__name__, exc)
    original = _vllm_run_daemon or getattr(daemon, target.qualname)
    return original(*args, **kwargs)
