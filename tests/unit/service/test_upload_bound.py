"""The default upload bound fits the largest artifacts a tuner makes (4 GiB: a FlashInfer JIT
module's tarball is hundreds of MB, a whole architecture's module set about 2 GB), and is still
enforced: a body declared past it is refused with 413 before any of it is read."""

from __future__ import annotations

import asyncio
import json

from tunecache.service.limits import RequestBodyGuard
from tunecache.service.settings import DEFAULT_MAX_UPLOAD_BYTES, Settings


def test_the_default_fits_a_tuners_largest_artifacts():
    assert DEFAULT_MAX_UPLOAD_BYTES == 4 << 30
    assert Settings(worker="off").max_upload_bytes == 4 << 30


class _App:
    def __init__(self):
        self.calls = 0

    async def __call__(self, scope, receive, send):
        self.calls += 1


def _put(guard: RequestBodyGuard, declared: int) -> tuple[int | None, dict]:
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "PUT", "path": "/v1/artifacts/" + "0" * 64,
             "headers": [(b"content-length", str(declared).encode())]}
    asyncio.run(guard(scope, receive, send))
    return (sent[0]["status"], json.loads(sent[1]["body"])) if sent else (None, {})


def test_a_body_declared_past_the_default_bound_is_refused_unread():
    app = _App()
    guard = RequestBodyGuard(app, max_upload_bytes=Settings(worker="off").max_upload_bytes, max_json_bytes=1 << 20)
    status, body = _put(guard, DEFAULT_MAX_UPLOAD_BYTES + 1)
    assert status == 413 and app.calls == 0
    assert "TUNECACHE_MAX_UPLOAD_BYTES" in body["detail"]
    assert _put(guard, 600 << 20) == (None, {}) and app.calls == 1  # a 600 MB module: passed on (256 MiB refused it)
