"""Safe publishing against a live `tunecache serve`, on SQLite and PostgreSQL: what cannot be
loaded, matched or trusted never becomes a fleet's current run. Each test is one row of the
publishing review (a case that was stored and made current before)."""

from __future__ import annotations

import hashlib
import json

import pytest

from tests.support.builders import h200_key, run_payload
from tests.support.cli import push
from tests.support.paths import CUBLASLT_FILE, CUDNN_FILE
from tests.support.serve import as_admin


def _put(server, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    assert as_admin.put(f"{server}/v1/artifacts/{digest}", content=data).status_code in (200, 201)
    return digest


def _post_file(server, data: bytes):
    payload = run_payload(CUDNN_FILE, h200_key())
    payload["artifacts"][0]["sha256"] = _put(server, data)
    return as_admin.post(f"{server}/v1/tunings", json=payload)


def test_a_file_with_an_entry_flashinfer_cannot_load_is_refused_at_record(server, tmp_path):
    doc = json.loads(CUDNN_FILE.read_text())
    doc["garbage key"] = "x"  # FlashInfer's AutoTuner.load_configs raises IndexError on it in every pod
    answer = _post_file(server, json.dumps(doc).encode())
    assert answer.status_code == 422
    assert "entry 'garbage key' is not [runner_class, tactic, ...]" in answer.json()["detail"]
    bad = tmp_path / "garbage.json"
    bad.write_text(json.dumps(doc))
    pushed = push(server, bad)
    assert pushed.returncode == 7 and "entry 'garbage key'" in pushed.stderr, pushed.stderr
    assert as_admin.get(f"{server}/v1/tunings").json()["total"] == 0  # nothing stored, nothing current


def test_a_wildcard_environment_is_refused_naming_the_field(server, tmp_path):
    doc = json.loads(CUDNN_FILE.read_text())
    doc["_metadata"]["cuda_version"] = "*"
    answer = _post_file(server, json.dumps(doc).encode())
    assert answer.status_code == 422 and "_metadata.cuda_version is the wildcard '*'" in answer.json()["detail"]
    wildcard = tmp_path / "wildcard.json"
    wildcard.write_text(json.dumps(doc))
    pushed = push(server, wildcard)
    assert pushed.returncode == 7 and "_metadata.cuda_version is the wildcard" in pushed.stderr


def _h100_file(tmp_path):
    doc = json.loads(CUDNN_FILE.read_text())
    doc["_metadata"]["gpu"] = "NVIDIA H100 80GB HBM3"
    path = tmp_path / "h100.json"
    path.write_text(json.dumps(doc))
    return path


def test_keys_no_pod_could_ask_for_are_refused_with_the_field_named(server, tmp_path):
    pushed = push(server, _h100_file(tmp_path), "--gpu-name", "NVIDIA H200")
    assert pushed.returncode == 7, pushed.stderr
    assert "key.gpu_name 'NVIDIA H200' is not the GPU the file was tuned on (_metadata.gpu 'NVIDIA H100 80GB HBM3')" \
        in pushed.stderr
    for field, value, named in (("model", "   ", "model"), ("model", "meta-llama/Llama\t3", "control characters"),
                                ("model", " meta-llama/Llama-3.1-8B", "whitespace"),
                                ("dtype", "potato", "dtype 'potato' is not one of vLLM's --dtype choices"),
                                ("quantization", "fp9", "quantization 'fp9' is not one of vLLM's --quantization")):
        payload = run_payload(CUDNN_FILE, h200_key())
        payload["key"][field] = value
        _put(server, CUDNN_FILE.read_bytes())
        answer = as_admin.post(f"{server}/v1/tunings", json=payload)
        assert answer.status_code == 422 and named in answer.text, (field, value, answer.text)
    assert as_admin.get(f"{server}/v1/tunings").json()["total"] == 0


def test_jobs_no_tuner_could_run_are_refused_with_the_field_named(server):
    key = h200_key().model_dump()
    for body, named in (({"key": key, "gemm_backends": ["bogus"]}, "'bogus': not a FlashInfer GEMM backend"),
                        ({"key": key, "hf_config": json.loads(CUDNN_FILE.read_text())},
                         "is a FlashInfer autotune file (it has _metadata), not a model's config.json"),
                        ({"key": key, "hf_config": {"hidden_size": 4096}}, "neither model_type nor architectures"),
                        ({"key": {**key, "dtype": "potato"}, "hf_config": {"model_type": "llama"}}, "key.dtype 'potato'")):
        answer = as_admin.post(f"{server}/v1/tuning-jobs", json=body)
        assert answer.status_code == 422 and named in answer.text, (body.keys(), answer.text)
    assert as_admin.get(f"{server}/v1/tuning-jobs").json()["total"] == 0


def _signed_run(server, signing_key, path=CUDNN_FILE, data: bytes | None = None, **key):
    from tests.support.builders import signed

    data = data if data is not None else path.read_bytes()
    payload = run_payload(CUDNN_FILE, h200_key(**key))
    payload["artifacts"][0]["sha256"] = _put(server, data)
    payload["summary"]["entries"] = sum(1 for k in json.loads(data) if not k.startswith("_"))
    return payload if signing_key is None else signed(payload, signing_key)


def _lookup(server):
    body = {"key": h200_key().model_dump(), "environment": run_payload(CUDNN_FILE)["environment"]}
    return as_admin.post(f"{server}/v1/tunings/lookup", json=body)


def _audit(server) -> list[str]:
    return [event.get("detail") or "" for event in as_admin.get(f"{server}/v1/audit").json()["events"]]


def test_with_trusted_keys_only_a_signed_run_becomes_current(node_signing_key, server):
    """The service trusts the node's key (TUNECACHE_TRUSTED_KEYS, set before it started)."""
    first = as_admin.post(f"{server}/v1/tunings", json=_signed_run(server, node_signing_key)).json()
    assert first["is_current"] and first["signature_verified"] is True and first["held"] is None
    unsigned = as_admin.post(f"{server}/v1/tunings", json=_signed_run(server, None))
    assert unsigned.status_code == 201
    assert not unsigned.json()["is_current"]
    assert unsigned.json()["held"] == ("not signed by a key this service trusts (TUNECACHE_TRUSTED_KEYS): run is unsigned")
    assert _lookup(server).json()["id"] == first["id"]  # pods keep the signed run
    assert any(f"run {unsigned.json()['id']}" in d and "held: not signed" in d for d in _audit(server))


def test_an_emptier_run_or_a_flagged_regression_is_held_unless_forced(server, tmp_path):
    full = as_admin.post(f"{server}/v1/tunings", json=_signed_run(server, None)).json()
    assert full["is_current"]
    doc = json.loads(CUDNN_FILE.read_text())
    empty = json.dumps({"_metadata": doc["_metadata"]}).encode()
    held = as_admin.post(f"{server}/v1/tunings", json=_signed_run(server, None, data=empty)).json()
    assert not held["is_current"]
    assert held["held"] == (f"it has 0 FlashInfer entries, fewer than the 42 of current run {full['id']}: an emptier "
                            "run does not replace the current one unless forced")
    slower = dict(doc)
    key = next(k for k, v in doc.items() if not k.startswith("_") and isinstance(v, list) and len(v) > 3)
    runner, tactic, policy, selection = doc[key]
    slower[key] = [runner, [tactic, "other"] if not isinstance(tactic, int) else tactic + 1000, policy,
                   {**selection, "time_ms": selection["time_ms"] * 1.5}]  # 50 % slower, far beyond its margin
    regressed = as_admin.post(f"{server}/v1/tunings", json=_signed_run(server, None, data=json.dumps(slower).encode())).json()
    assert not regressed["is_current"]
    assert regressed["held"].startswith(f"the run diff against current run {full['id']} flags 1 regression")
    assert _lookup(server).json()["id"] == full["id"]
    path = tmp_path / "empty.json"
    path.write_bytes(empty)
    pushed = push(server, path)
    assert pushed.returncode == 0 and "is not current: it has 0 FlashInfer entries" in pushed.stderr
    forced = push(server, path, "--force")
    assert forced.returncode == 0 and "current)" in forced.stdout and "not current" not in forced.stdout, forced.stdout
    assert any("forced" in d for d in _audit(server))


def test_a_key_rolls_back_to_an_earlier_signed_run_with_one_command(node_signing_key, server, tmp_path):
    from tests.support.cli import tunecache

    old = as_admin.post(f"{server}/v1/tunings", json=_signed_run(server, node_signing_key)).json()
    new = as_admin.post(f"{server}/v1/tunings", json=_signed_run(server, node_signing_key, path=CUBLASLT_FILE)).json()
    assert new["is_current"] and _lookup(server).json()["id"] == new["id"]
    rolled = tunecache("promote", str(old["id"]), "--server", server)
    assert rolled.returncode == 0, rolled.stderr
    assert rolled.stdout.strip() == f"run {old['id']} is current for meta-llama/Llama-3.1-8B on NVIDIA H200 " \
                                    "(max_num_batched_tokens 8192)"
    assert _lookup(server).json()["id"] == old["id"]
    pulled = tunecache("pull", "--server", server, "--model", "meta-llama/Llama-3.1-8B", "--max-num-batched-tokens",
                       "8192", "--dest", str(tmp_path / "pod"), "--environment", str(CUDNN_FILE))
    assert pulled.returncode == 0 and f"run {old['id']} is signed by trusted key" in pulled.stderr, pulled.stderr
    assert (tmp_path / "pod").glob("*.json") and next((tmp_path / "pod").glob("*.json")).read_bytes() == CUDNN_FILE.read_bytes()
    unsigned = as_admin.post(f"{server}/v1/tunings", json=_signed_run(server, None)).json()
    refused = tunecache("promote", str(unsigned["id"]), "--server", server)
    assert refused.returncode == 15 and "is not signed by a key this service trusts" in refused.stderr
    assert tunecache("promote", "999999", "--server", server).returncode == 5
    assert any(f"promoted run {old['id']}" in d for d in _audit(server))


def test_the_dashboard_says_signed_by_only_for_a_verified_signature_and_rolls_back(node_signing_key, server):
    import re

    import httpx

    from tests.support.serve import admin_token

    old = as_admin.post(f"{server}/v1/tunings", json=_signed_run(server, node_signing_key)).json()
    new = as_admin.post(f"{server}/v1/tunings", json=_signed_run(server, node_signing_key, path=CUBLASLT_FILE)).json()
    unsigned = as_admin.post(f"{server}/v1/tunings", json=_signed_run(server, None)).json()
    with httpx.Client(base_url=server, timeout=30) as browser:
        page = browser.get(f"/runs/{old['id']}").text
        assert "signed by" in page and "(verified by this service against its trusted keys)" in page
        assert "Make this run current (roll back)" in page
        held = browser.get(f"/runs/{unsigned['id']}").text
        assert re.search(r'id="signature">unsigned<', held) and 'id="held"' in held and "not signed by a key" in held
        assert "Make this run current" not in browser.get(f"/runs/{new['id']}").text  # it is current
        csrf = re.search(r'name="csrf" value="([^"]+)"', page).group(1)
        refused = browser.post(f"/runs/{old['id']}/promote", data={"csrf": csrf, "token": "tc_not_a_token"})
        assert refused.status_code == 401
        promoted = browser.post(f"/runs/{old['id']}/promote", data={"csrf": csrf, "token": admin_token()})
        assert promoted.status_code == 200 and 'class="badge">current<' in promoted.text
    assert _lookup(server).json()["id"] == old["id"]
    assert any(f"promoted run {old['id']}" in d and "from the dashboard" in d for d in _audit(server))


def test_a_replay_that_changes_the_signed_summary_fields_is_refused_by_pods(node_signing_key, server, tmp_path):
    """A second recorder replays run 1's signature and artifacts with the JIT validity fields
    of its summary changed (so that pods would skip, or take, modules built elsewhere while
    saying "signed by trusted key"): those fields are inside the signature (manifest 2)."""
    from tests.support.builders import signed
    from tests.support.cli import tunecache

    payload = _signed_run(server, None)
    payload["summary"]["flashinfer_jit"] = {"workspace_subdir": "0.7.4/90a", "cuda_home": "/usr/local/cuda"}
    original = signed(payload, node_signing_key)
    assert original["signature"]["manifest"] == 2
    as_admin.post(f"{server}/v1/tunings", json=original)
    replay = {**original, "summary": {**original["summary"], "flashinfer_jit": {"workspace_subdir": "0.7.4/100a",
                                                                               "cuda_home": "/usr/local/cuda"}}}
    replayed = as_admin.post(f"{server}/v1/tunings", json=replay).json()
    assert replayed["held"].startswith("not signed by a key this service trusts")  # the service checks it too
    forced = as_admin.post(f"{server}/v1/tunings?force=true", json=replay).json()
    assert forced["is_current"]  # an admin forced it past the service: the pods are the last line
    pulled = tunecache("pull", "--server", server, "--model", "meta-llama/Llama-3.1-8B", "--max-num-batched-tokens",
                       "8192", "--dest", str(tmp_path / "pod"), "--environment", str(CUDNN_FILE))
    assert pulled.returncode == 14 and "signature does not match the run's manifest" in pulled.stderr, pulled.stderr


def test_pods_never_move_back_to_an_older_run_unless_a_signer_signed_the_move(node_signing_key, server, tmp_path):
    """Run 2 is current after run 1, and a pod installed it; then run 1 comes back (a second
    recorder replays its signature and artifacts, or an admin promotes it unsigned): the pod
    refuses it as a replayed older run. Signed anew (promote --signing-key), it installs."""
    import os
    import time

    from tests.support.cli import tunecache
    from tunecache.signing import generate_signing_key

    pull_args = ("pull", "--server", server, "--model", "meta-llama/Llama-3.1-8B", "--max-num-batched-tokens", "8192",
                 "--dest", str(tmp_path / "pod"), "--environment", str(CUDNN_FILE))
    run_1 = as_admin.post(f"{server}/v1/tunings", json=_signed_run(server, node_signing_key)).json()
    assert tunecache(*pull_args).returncode == 0
    time.sleep(1.1)  # signing times are whole seconds
    run_2 = as_admin.post(f"{server}/v1/tunings", json=_signed_run(server, node_signing_key, path=CUBLASLT_FILE)).json()
    assert run_2["is_current"] and run_2["signature"]["signed_at"] > run_1["signature"]["signed_at"]
    assert tunecache(*pull_args).returncode == 0
    assert tunecache("promote", str(run_1["id"]), "--server", server).returncode == 0  # run 1 back, its old signature
    refused = tunecache(*pull_args)
    assert refused.returncode == 14, refused.stderr
    assert "before the run this pod installed for the key" in refused.stderr and "a replayed older run" in refused.stderr
    assert next((tmp_path / "pod").glob("*.json")).read_bytes() == CUBLASLT_FILE.read_bytes()  # kept run 2's file
    key_file = tmp_path / "node-key-file"
    assert "TUNECACHE_TRUSTED_KEYS" in os.environ  # the pods' and the service's: the node's key only
    private = generate_signing_key(tmp_path / "operator")  # an operator key the pods do not trust: refused anew
    untrusted = tunecache("promote", str(run_1["id"]), "--server", server, "--signing-key", str(private.private_path))
    assert untrusted.returncode == 15 and "not signed by a key this service trusts" in untrusted.stderr
    from cryptography.hazmat.primitives import serialization

    key_file.write_bytes(node_signing_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                        serialization.NoEncryption()))
    resigned = tunecache("promote", str(run_1["id"]), "--server", server, "--signing-key", str(key_file))
    assert resigned.returncode == 0 and "signed anew by" in resigned.stdout, resigned.stderr
    accepted = tunecache(*pull_args)
    assert accepted.returncode == 0 and f"run {run_1['id']} is signed by trusted key" in accepted.stderr, accepted.stderr
    assert next((tmp_path / "pod").glob("*.json")).read_bytes() == CUDNN_FILE.read_bytes()


def test_an_expired_signature_is_refused_by_the_service_and_by_pods(node_signing_key, server, tmp_path):
    from tests.support.cli import tunecache
    from tunecache.contract import TuningRunCreate
    from tunecache.signing import sign_run

    payload = _signed_run(server, None)
    run = TuningRunCreate.model_validate(payload)
    old = sign_run(node_signing_key, run.key, run.environment, run.artifacts, run.summary, valid_days=1, now=1_700_000_000)
    answer = as_admin.post(f"{server}/v1/tunings", json={**payload, "signature": old.model_dump()}).json()
    assert answer["held"].startswith("not signed by a key this service trusts (TUNECACHE_TRUSTED_KEYS): signature expired")
    as_admin.post(f"{server}/v1/tunings/{answer['id']}/promote")  # refused by the service too
    forced = as_admin.post(f"{server}/v1/tunings?force=true", json={**payload, "signature": old.model_dump()}).json()
    assert forced["is_current"]
    pulled = tunecache("pull", "--server", server, "--model", "meta-llama/Llama-3.1-8B", "--max-num-batched-tokens",
                       "8192", "--dest", str(tmp_path / "pod"), "--environment", str(CUDNN_FILE))
    assert pulled.returncode == 14 and "signature expired at 2023-11-15" in pulled.stderr, pulled.stderr


def test_the_rollback_memory_keeps_what_was_verified_not_the_key_an_answer_names(node_signing_key, server, tmp_path,
                                                                               monkeypatch):
    """A proxy rewrites ``key.model`` in the lookup's answer. The signature is checked against
    the pod's own key (and holds); the install must then be remembered under that key, so that
    a later replay of an older signed run for it is refused. It was remembered under the
    answer's key: the memory for the pod's own key stayed empty and the replay was accepted."""
    import time

    import httpx

    from tunecache.store.http import TunecacheClient
    from tunecache.client.install import fetch_tuning, install
    from tunecache.client.layouts import FlashInferFile
    from tunecache.client.pipeline import InstallTarget
    from tunecache.client.installed import newest_installed
    from tests.support.builders import file_environment
    from tunecache.signing import format_public_key, load_trusted_keys

    monkeypatch.setenv("TUNECACHE_STATE_DIR", str(tmp_path / "pod-state"))
    key = h200_key()
    environment = file_environment(CUDNN_FILE)
    trusted = load_trusted_keys(format_public_key(node_signing_key.public_key()))
    run_1 = as_admin.post(f"{server}/v1/tunings", json=_signed_run(server, node_signing_key)).json()
    time.sleep(1.1)  # signing times are whole seconds
    run_2 = as_admin.post(f"{server}/v1/tunings", json=_signed_run(server, node_signing_key, path=CUBLASLT_FILE)).json()

    class Rewriting(httpx.BaseTransport):
        def __init__(self):
            self.inner = httpx.HTTPTransport()

        def handle_request(self, request):
            answer = self.inner.handle_request(request)
            if request.url.path.endswith("/v1/tunings/lookup") and answer.status_code == 200:
                doc = json.loads(answer.read())
                doc["key"]["model"] = "someone/else"
                return httpx.Response(200, json=doc, headers={"content-type": "application/json"})
            return answer

    with TunecacheClient(server, transport=Rewriting(), reports=False) as client:
        fetched = fetch_tuning(client, key, environment, trusted_keys=trusted)
        assert fetched.run.id == run_2["id"] and fetched.run.key.model == "someone/else"
        install(fetched, InstallTarget.of((), FlashInferFile(tmp_path / "pod", "autotune.json")))
    assert newest_installed(key, environment) == run_2["signature"]["signed_at"]
    assert tunecache_promote(server, run_1["id"]) == 0  # run 1 current again, its old signature
    with TunecacheClient(server, reports=False) as client:
        with pytest.raises(Exception, match="a replayed older run"):
            fetch_tuning(client, key, environment, trusted_keys=trusted)


def tunecache_promote(server, run_id) -> int:
    from tests.support.cli import tunecache

    return tunecache("promote", str(run_id), "--server", server).returncode


@pytest.mark.parametrize("where", ["node", "summary value", "summary key"])
def test_a_lone_surrogate_is_a_422_naming_the_field_not_a_500(server, where):
    """JSON can spell a lone surrogate (``"\\ud800"``), which encodes to no UTF-8 and which
    PostgreSQL's JSON refuses: a push answered 500."""
    payload = _signed_run(server, None)
    marker = "LONE-SURROGATE"
    if where == "node":
        payload["node"] = marker
    elif where == "summary value":
        payload["summary"]["note"] = marker
    else:
        payload["summary"][marker] = 1
    body = json.dumps(payload).replace(marker, "\\ud800").encode()
    answer = as_admin.post(f"{server}/v1/tunings", content=body, headers={"content-type": "application/json"})
    assert answer.status_code == 422, answer.text
    assert "lone surrogate" in answer.text and ("node" if where == "node" else "summary") in answer.text
    assert as_admin.get(f"{server}/v1/tunings").json()["total"] == 0


def test_an_autotune_file_nested_100000_deep_is_a_422_not_a_500(server):
    deep = b'{"_metadata": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    answer = _post_file(server, deep)
    assert answer.status_code == 422, answer.text
    assert "nested too deeply" in answer.json()["detail"]


def test_an_undated_format_1_signature_installs_the_tactics_and_no_code(node_signing_key, server, tmp_path, monkeypatch):
    """Manifest-format-1 signatures never expire and cannot be ordered by the rollback memory:
    a pod without memory installed their DeepGEMM kernels (and Triton cache, compile-cache
    pickles). Code the pod loads now needs a dated signature."""
    import base64

    from tests.support.builders import file_environment
    from tests.support.jit import deep_gemm_tarball
    from tunecache.store.http import TunecacheClient
    from tunecache.client.install import fetch_tuning
    from tunecache.contract import RunSignature, TuningRunCreate
    from tunecache.signing import canonical_manifest, format_public_key, key_id, load_trusted_keys

    monkeypatch.setenv("TUNECACHE_STATE_DIR", str(tmp_path / "pod-state"))
    tarball = deep_gemm_tarball([("cache/kernel.abc/kernel.cubin", b"cubin")])
    payload = _signed_run(server, None)
    payload["artifacts"].append({"kind": "deep_gemm_jit_cache", "name": "deep-gemm-jit-cache.tar.gz",
                                 "media_type": "application/gzip", "sha256": _put(server, tarball)})
    run = TuningRunCreate.model_validate(payload)
    manifest = canonical_manifest(run.key, run.environment, run.artifacts, key_id(node_signing_key.public_key()), manifest=1)
    payload["signature"] = RunSignature(key_id=key_id(node_signing_key.public_key()), manifest=1,
                                        signature=base64.b64encode(node_signing_key.sign(manifest)).decode()).model_dump()
    recorded = as_admin.post(f"{server}/v1/tunings?force=true", json=payload)
    assert recorded.status_code == 201, recorded.text
    trusted = load_trusted_keys(format_public_key(node_signing_key.public_key()))
    with TunecacheClient(server, reports=False) as client:
        fetched = fetch_tuning(client, h200_key(), file_environment(CUDNN_FILE), trusted_keys=trusted, deep_gemm=True,
                               warm_state=True)
    assert fetched.signed_by is not None and fetched.autotune == CUDNN_FILE.read_bytes()  # the tactics install
    assert fetched.deep_gemm is None and not fetched.warm_state
    assert fetched.executable_refused.startswith("JIT modules, DeepGEMM caches and the rest of the warm state not "
                                                 "installed: the run's signature (manifest format 1) is undated")
