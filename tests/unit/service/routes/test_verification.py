"""``PUT /v1/tunings/{id}/verification``: a run's verification boot stored with it (both
databases): who may store it, what it refuses, and that every answer carrying the run
(read, lookup, history) carries it, the lookup's cache included."""

from __future__ import annotations

from tests.support.builders import lookup_body, make_token, run_payload
from tests.support.paths import CUDNN_FILE


def _record(app_client, **overrides) -> dict:
    payload = run_payload(CUDNN_FILE) | overrides
    assert app_client.put(f"/v1/artifacts/{payload['artifacts'][0]['sha256']}", content=CUDNN_FILE.read_bytes()).status_code in (200, 201)
    answer = app_client.post("/v1/tunings", json=payload)
    assert answer.status_code == 201, answer.text
    return answer.json()


def test_a_verification_is_stored_with_its_run_and_shown_wherever_the_run_is(app_client, engine):
    run = _record(app_client)
    assert run["verification"] is None
    before = app_client.post("/v1/tunings/lookup", json=lookup_body())
    assert before.status_code == 200 and before.json()["verification"] is None  # now in the lookup's cache
    dirty = {"compiled": {"inductor_graphs": 2, "triton_kernels": 14, "aot_compiles": 0}, "ready_s": 41.5}
    stored = app_client.put(f"/v1/tunings/{run['id']}/verification", json=dirty)
    assert stored.status_code == 200, stored.text
    assert stored.json()["verification"] == dirty | {"error": None}
    clean = {"compiled": {"inductor_graphs": 0, "triton_kernels": 0}, "ready_s": 20.8}
    assert app_client.put(f"/v1/tunings/{run['id']}/verification", json=clean).status_code == 200  # a later one replaces it
    for answer in (app_client.get(f"/v1/tunings/{run['id']}").json(),
                   app_client.post("/v1/tunings/lookup", json=lookup_body()).json(),  # the cache moved with it
                   app_client.get("/v1/tunings").json()["items"][0]):
        assert answer["verification"] == clean | {"error": None}
    events = [e["detail"] for e in app_client.get("/v1/audit").json()["events"]]
    assert f"verification of run {run['id']}: compiled nothing" in events
    assert f"verification of run {run['id']}: compiled 2 inductor_graphs, 14 triton_kernels" in events
    failed = {"error": "RuntimeError: CUDA error: out of memory"}
    assert app_client.put(f"/v1/tunings/{run['id']}/verification", json=failed).json()["verification"] == (
        {"compiled": {}, "ready_s": None} | failed)


def test_who_may_store_one_and_what_is_refused(app_client, engine):
    run = _record(app_client)
    body = {"compiled": {"triton_kernels": 0}, "ready_s": 1.0}
    push = {"Authorization": f"Bearer {make_token(engine, 'pod-pusher', 'push')}"}
    tune = {"Authorization": f"Bearer {make_token(engine, 'gpu-node', 'tune')}"}
    assert app_client.put(f"/v1/tunings/{run['id']}/verification", json=body, headers=push).status_code == 403
    assert app_client.put(f"/v1/tunings/{run['id']}/verification", json=body, headers={"Authorization": ""}).status_code == 401
    assert app_client.put(f"/v1/tunings/{run['id']}/verification", json=body, headers=tune).status_code == 200
    missing = app_client.put("/v1/tunings/999999/verification", json=body)
    assert missing.status_code == 404 and missing.json()["detail"] == "no tuning run 999999"
    for bad, field in (({"compiled": {"triton_kernels": -1}}, "compiled"), ({"compiled": {"warp_drives": 1}}, "compiled"),
                       ({"ready_s": -3}, "ready_s"), ({"clean": True}, "clean")):
        refused = app_client.put(f"/v1/tunings/{run['id']}/verification", json=bad)
        assert refused.status_code == 422, (bad, refused.text)
        assert field in refused.text
    failed = _record(app_client, status="failed", error="tuner process died with signal SIGSEGV")
    conflict = app_client.put(f"/v1/tunings/{failed['id']}/verification", json=body)
    assert conflict.status_code == 409
    assert conflict.json()["detail"] == f"run {failed['id']} failed: only a succeeded run is booted to verify it"
