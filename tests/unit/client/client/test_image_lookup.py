"""The pod's side of images (tunecache.formats.dependencies.image_of): its lookup carries its
package versions, asked again without them of a service before images, and its memory of
installed runs keeps one slot per image."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.support.builders import file_environment, h200_key
from tests.support.paths import CUDNN_FILE
from tunecache.store.http import TunecacheClient
from tunecache.client.installed import newest_installed, remember_installed
from tunecache.store import NoCompatibleTuning

VERSIONS = {"apache-tvm-ffi": "0.1.4", "torch": "2.9.0", "triton": "3.5.0"}


def test_a_service_before_images_is_asked_again_without_the_versions():
    """A service whose lookup forbids unknown fields answers FastAPI's 422 naming
    ``dependencies``; the pod asks once more as before images, and gets that answer."""
    bodies = []

    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        bodies.append(body)
        if "dependencies" in body:
            return httpx.Response(422, json={"detail": [{"type": "extra_forbidden", "loc": ["body", "dependencies"],
                                                         "msg": "Extra inputs are not permitted"}]})
        return httpx.Response(404, json={"detail": "no tuning is stored yet", "closest": []})

    with TunecacheClient("http://tunecache.test", transport=httpx.MockTransport(answer), attempts=1) as client:
        with pytest.raises(NoCompatibleTuning, match="no tuning is stored yet"):
            client.lookup(h200_key(), file_environment(CUDNN_FILE), dependencies={**VERSIONS, "torch": "9" * 80})
    assert [("dependencies" in body) for body in bodies] == [True, False]
    assert bodies[0]["dependencies"]["torch"] == "9" * 64  # bounded as the service bounds it


def test_another_422_is_not_asked_again():
    calls = []

    def answer(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return httpx.Response(422, json={"detail": [{"type": "missing", "loc": ["body", "key"], "msg": "Field required"}]})

    with TunecacheClient("http://tunecache.test", transport=httpx.MockTransport(answer), attempts=1) as client:
        with pytest.raises(Exception):
            client.lookup(h200_key(), file_environment(CUDNN_FILE), dependencies=VERSIONS)
    assert len(calls) == 1


def test_the_memory_of_installed_runs_has_a_slot_per_image(tmp_path, monkeypatch):
    """A run of this pod's image signed before another image's run it once installed is no
    replay: each image's runs are ordered among themselves."""
    monkeypatch.setenv("TUNECACHE_STATE_DIR", str(tmp_path))
    key, environment = h200_key(), file_environment(CUDNN_FILE)
    remember_installed(key, environment, 2000, image="bbbbbbbbbbbbbbbb")
    assert newest_installed(key, environment, image="aaaaaaaaaaaaaaaa") is None
    assert newest_installed(key, environment, image="bbbbbbbbbbbbbbbb") == 2000
    assert newest_installed(key, environment) is None  # a run that records no versions: the key's own slot
