"""``POST /v1/tunings?trusted_signature=true`` (``tunecache import``): a run is recorded only
where its signature checks against the service's trusted keys; else 409, and nothing is stored."""

from __future__ import annotations

from tests.support.builders import run_payload, signed, upload
from tests.support.paths import CUDNN_FILE


def test_a_service_without_trusted_keys_refuses_an_imported_run_and_stores_nothing(app_client, tmp_path):
    from tunecache.signing import generate_signing_key, load_signing_key

    upload(app_client, CUDNN_FILE)
    body = signed(run_payload(CUDNN_FILE), load_signing_key(generate_signing_key(tmp_path / "key").private_path))
    refused = app_client.post("/v1/tunings?trusted_signature=true", json=body)
    assert refused.status_code == 409, refused.text
    assert refused.json()["detail"].startswith("this service has no trusted keys (TUNECACHE_TRUSTED_KEYS) to check "
                                               "the run's signature against")
    assert refused.json()["detail"].endswith("; nothing was recorded")
    assert app_client.get("/v1/tunings").json()["total"] == 0
    assert app_client.post("/v1/tunings", json=body).status_code == 201  # recorded as ever without the flag
