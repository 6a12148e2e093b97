"""A replica without ``TUNECACHE_ARTIFACT_STORE`` asked for a blob kept in the object store
(issue 39, Why 8): it answered 500 ``internal error: StoreNotConfigured`` while ``/v1/health``
said ok. Now 503 naming the setting, and health is ``degraded`` naming it.

The condition is made as a replica meets it: a blob row recorded (by another replica, with
the setting) with its bytes in the object store, served by this one, which has no store."""

from __future__ import annotations

import hashlib

from tunecache.service.models import ArtifactBlob
from tunecache.service import db


def test_a_blob_in_a_store_this_replica_lacks_is_a_503_naming_the_setting_and_health_degrades(app_client, engine):
    sha = hashlib.sha256(b"kept in the bucket").hexdigest()
    with db.session_factory(engine)() as session:
        session.add(ArtifactBlob(sha256=sha, size_bytes=18, location="s3"))
        session.commit()
    answer = app_client.get(f"/v1/artifacts/{sha}")
    assert answer.status_code == 503, answer.text
    assert answer.json()["detail"] == ("artifact bytes are in the 's3' store, and this process has none (set "
                                       "TUNECACHE_ARTIFACT_STORE and the AWS_* variables)")
    health = app_client.get("/v1/health").json()
    assert health["status"] == "degraded"
    assert health["problems"] == ["artifact blobs are kept in the 's3' store, which this process has no "
                                  "TUNECACHE_ARTIFACT_STORE for: they cannot be served here"]
