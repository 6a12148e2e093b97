"""A node whose disks fill up says so: an upload whose spool (``TMPDIR``) is full is a 503 the
client retries (it was a 500 ``internal error: OSError``), and health is ``degraded`` naming
the disk (it said ``ok``, also with a full data directory). The full disk is a stand-in at
the edge: the spool's ``write`` raising ENOSPC, ``shutil.disk_usage`` reporting little room."""

from __future__ import annotations

import errno
import hashlib
import shutil
import tempfile
from collections import namedtuple

from tunecache.service.routes import artifacts, health

Usage = namedtuple("Usage", "total used free")


class FullSpool:
    """``tempfile.SpooledTemporaryFile`` on a disk with no room left."""

    def __init__(self, *args, **kwargs):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def write(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")


def test_an_upload_into_a_full_spool_is_a_503_to_retry_and_stores_nothing(app_client, monkeypatch):
    data = b"x" * 1000
    sha = hashlib.sha256(data).hexdigest()
    monkeypatch.setattr(artifacts.tempfile, "SpooledTemporaryFile", FullSpool)
    answer = app_client.put(f"/v1/artifacts/{sha}", content=data)
    assert answer.status_code == 503, answer.text
    assert answer.headers["Retry-After"] == "30"
    assert answer.json()["detail"] == (f"no room to receive the upload: No space left on device in the upload spool "
                                       f"({tempfile.gettempdir()}); retry later")
    monkeypatch.undo()
    assert app_client.head(f"/v1/artifacts/{sha}").status_code == 404  # nothing stored
    assert app_client.put(f"/v1/artifacts/{sha}", content=data).status_code == 201  # room again: stored


def test_health_is_degraded_naming_a_disk_with_little_room(app_client, monkeypatch):
    assert app_client.get("/v1/health").json()["status"] == "ok"
    real = shutil.disk_usage
    spool = tempfile.gettempdir()
    monkeypatch.setattr(health.shutil, "disk_usage",
                        lambda path: Usage(10 << 30, 10 << 30, 4096) if str(path) == spool else real(path))
    seen = app_client.get("/v1/health").json()
    assert seen["status"] == "degraded"
    assert seen["problems"] == [f"upload spool {spool} has 4,096 bytes free"]
    anonymous = app_client.get("/v1/health", headers={"Authorization": ""})
    assert anonymous.json() == {"status": "degraded"}  # the status only, to anyone
