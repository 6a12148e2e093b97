"""tunecache as a warmup-cache store of ``vllm preload`` (vLLM 0.34), against a live server.

The store is called as vLLM 0.34's ``FlashInferWarmupCache`` calls its stores: with keys made by
that release's own ``artifact_key`` and ``flashinfer_autotune_filename`` (run from its wheel's
source) and the table's bytes. What it hands out is what a pod would install: the current run,
signed by a trusted key over this daemon's key and environment; an unsigned run, one signed by
another key, and any run without trusted keys set are refused. What a daemon publishes arrives
as an unverified ``pod`` run that does not become current.
"""

from __future__ import annotations

import hashlib
import json

import httpx
import pytest

from tests.support.builders import file_environment, h200_key, run_payload, signed
from tests.support.paths import CUBLASLT_FILE, CUDNN_FILE
from tests.support.serve import admin_headers
from tests.support.vllm_wheels import pure_functions, wheel_source
from tunecache.client.preload_store import ArtifactName, StoreTarget, TunecacheArtifactStore
from tunecache.client.settings import load_client_settings
from tunecache.signing import generate_signing_key, load_signing_key

# What this module tests happens on the daemon's side: its server runs on SQLite only (tests/conftest.py).
SERVER_DATABASE_INCIDENTAL = True

CONFIG_HASH = "c0" * 32
OTHER_FILE = CUBLASLT_FILE


@pytest.fixture(scope="module")
def vllm_key():
    """``(dp_rank, rank, config_hash) -> key`` as vLLM 0.34's daemons name a table in every store."""
    store_source = wheel_source("0.34.0", "vllm/model_executor/model_loader/weight_cache/artifact_store.py")
    if store_source is None:
        pytest.skip("no vLLM 0.34.0 wheel here (pip download --no-deps vllm==0.34.0 -d ~/.cache/tunecache-tests/vllm-wheels/)")
    names = pure_functions(store_source, ["artifact_key"], ("_KEY_PREFIX",))
    cache_source = wheel_source("0.34.0", "vllm/model_executor/warmup/flashinfer_autotune_cache.py")
    files = pure_functions(cache_source, ["flashinfer_autotune_filename"])
    kind = "flashinfer_autotune"  # FlashInferWarmupCache.kind
    return lambda dp, rank, config_hash=CONFIG_HASH: names["artifact_key"](
        kind, config_hash, files["flashinfer_autotune_filename"](dp, rank))


@pytest.fixture
def fleet(server, tmp_path):
    """Tokens (a tuner node's, a pod's), the node's signing key and a stranger's."""
    admin = admin_headers()
    tokens = {}
    for name, scope in (("gpu-node-1", "tune"), ("pods", "push")):
        answer = httpx.post(f"{server}/v1/tokens", json={"name": name, "scope": scope}, headers=admin)
        assert answer.status_code == 201, answer.text
        tokens[scope] = answer.json()["token"]
    node = generate_signing_key(tmp_path / "node-key")
    stranger = generate_signing_key(tmp_path / "stranger-key")
    return {"server": server, "tokens": tokens, "node": node, "stranger": load_signing_key(stranger.private_path)}


def _publish(fleet, path=CUDNN_FILE, signing_key=None) -> dict:
    """A run of ``path`` recorded with the node's tune token, signed by ``signing_key`` (or not)."""
    headers = {"Authorization": f"Bearer {fleet['tokens']['tune']}"}
    data = path.read_bytes()
    assert httpx.put(f"{fleet['server']}/v1/artifacts/{hashlib.sha256(data).hexdigest()}", content=data,
                     headers=headers).status_code in (200, 201)
    payload = run_payload(path, key=h200_key(), summary={"entries": 3})
    payload = signed(payload, signing_key) if signing_key is not None else payload
    answer = httpx.post(f"{fleet['server']}/v1/tunings", json=payload, headers=headers)
    assert answer.status_code == 201 and answer.json()["is_current"], answer.text
    return answer.json()


def _store(fleet, trusted: bool = True) -> TunecacheArtifactStore:
    settings = load_client_settings(url=fleet["server"], token=fleet["tokens"]["push"], attempts=1,
                                    trusted_keys=str(fleet["node"].public_path) if trusted else None)
    return TunecacheArtifactStore(StoreTarget(h200_key(), file_environment(CUDNN_FILE), CONFIG_HASH), settings)


def _runs(fleet) -> list[dict]:
    return httpx.get(f"{fleet['server']}/v1/tunings", params={"limit": 50}).json()["items"]


def test_a_daemon_gets_the_signed_current_table_for_every_rank(fleet, vllm_key):
    _publish(fleet, signing_key=load_signing_key(fleet["node"].private_path))
    store = _store(fleet)
    for dp, rank in ((0, 0), (0, 1), (1, 3)):
        table = store.get(vllm_key(dp, rank))
        assert table == CUDNN_FILE.read_bytes()
        assert json.loads(table)["_metadata"]["gpu"] == "NVIDIA H200"  # what vLLM's validate_payload reads
    assert store.get(vllm_key(0, 0, "d1" * 32)) is None  # another deployment's config hash: a miss
    for foreign in ("vllm-warmup-cache/flashinfer_autotune/../../etc/passwd", "vllm-warmup-cache/other_kind/"
                    + CONFIG_HASH + "/autotune_configs_dp0_rank0.json", vllm_key(0, 0) + "/x"):
        assert ArtifactName.parse(foreign) is None and store.get(foreign) is None


@pytest.mark.parametrize("run_is", ["unsigned", "signed by another key"])
def test_an_unsigned_or_untrusted_table_is_refused(fleet, vllm_key, run_is, caplog):
    _publish(fleet, signing_key=fleet["stranger"] if run_is != "unsigned" else None)
    assert _store(fleet).get(vllm_key(0, 0)) is None
    refused = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert refused and ("unsigned" in refused[0] if run_is == "unsigned" else "not among the 1 trusted key" in refused[0]), refused


def test_without_trusted_keys_the_store_serves_nothing(fleet, vllm_key, caplog):
    _publish(fleet, signing_key=load_signing_key(fleet["node"].private_path))
    assert _store(fleet, trusted=False).get(vllm_key(0, 0)) is None
    assert any("no trusted keys are set" in r.getMessage() for r in caplog.records)


def test_a_published_table_arrives_as_an_unverified_pod_run(fleet, vllm_key):
    current = _publish(fleet, signing_key=load_signing_key(fleet["node"].private_path))
    store = _store(fleet)
    served = store.get(vllm_key(0, 0))
    store.put(vllm_key(0, 0), served)  # vLLM publishes the table it adopted: nothing to upload
    store.put(vllm_key(0, 1), OTHER_FILE.read_bytes())  # another rank's: one table per key, rank 0's
    store.put(vllm_key(0, 0, "d1" * 32), OTHER_FILE.read_bytes())  # another deployment's
    assert [r["id"] for r in _runs(fleet)] == [current["id"]]
    store.put(vllm_key(0, 0), OTHER_FILE.read_bytes())
    store.put(vllm_key(0, 0), OTHER_FILE.read_bytes())  # the same table again: once
    runs = _runs(fleet)
    assert len(runs) == 2
    pushed = runs[0]
    assert (pushed["trigger"], pushed["verified"], pushed["is_current"]) == ("pod", False, False)
    assert pushed["key"] == h200_key().model_dump(mode="json")
    [artifact] = pushed["artifacts"]
    assert artifact["sha256"] == hashlib.sha256(OTHER_FILE.read_bytes()).hexdigest()
    assert store.get(vllm_key(0, 0)) == CUDNN_FILE.read_bytes()  # the current run is still the node's
