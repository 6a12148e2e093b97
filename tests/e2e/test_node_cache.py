"""One download per node (``tunecache.client.node_cache``): pods sharing ``TUNECACHE_NODE_CACHE_DIR``
against a real ``tunecache serve``, the downloads counted by the server's own metrics."""

from __future__ import annotations

import hashlib
import os
import time

from tests.e2e.test_download_progress import pacer  # noqa: F401 (the fixture)
from tests.e2e.test_install_deadline import STARTUP_S, finish, start_pull
from tests.support.paths import CUDNN_FILE
from tests.support.serve import as_admin, scrape

SERVER_DATABASE_INCIDENTAL = True
ARTIFACTS = {"method": "GET", "route": "/v1/artifacts/{sha256}", "status": "200"}


def _downloads(server: str) -> float:
    return scrape(server).total("tunecache_http_requests_total", **ARTIFACTS)


def test_pods_of_a_node_download_each_artifact_once_and_a_corrupt_entry_again(server, pacer, tmp_path):  # noqa: F811
    """Three pulls at once, the body paced over about 2 s so that they overlap: the server sends
    it once, every pod installs the same bytes, the two that waited say so. Then the entry is
    corrupted on disk: the next pull hashes it, throws it away and downloads it again."""
    handler, url = pacer
    handler.part, handler.every_s = 2048, 0.2
    node = tmp_path / "node-cache"
    before = _downloads(server)
    pulls = [start_pull(url, tmp_path / f"pod{i}", TUNECACHE_NODE_CACHE_DIR=str(node)) for i in range(3)]
    results = [finish(started, STARTUP_S + 60) for started in pulls]
    assert [code for code, _, _ in results] == [0, 0, 0], [stderr for _, stderr, _ in results]
    assert _downloads(server) - before == 1
    data = CUDNN_FILE.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    assert (node / "sha256" / sha).read_bytes() == data
    assert not list((node / "tmp").iterdir())  # nothing half-written left
    for i in range(3):
        (installed,) = (tmp_path / f"pod{i}").iterdir()
        assert installed.read_bytes() == data
    assert sum("downloaded 0.0 MB in 0.00 s (0.0 MB/s); 1 of 1 from the node cache (0.0 MB)" in stderr
               for _, stderr, _ in results) == 2

    (node / "sha256" / sha).write_bytes(b"x" * len(data))  # same size, other bytes
    handler.every_s = 0.0
    code, stderr, _ = finish(start_pull(url, tmp_path / "pod3", TUNECACHE_NODE_CACHE_DIR=str(node)), STARTUP_S)
    assert code == 0, stderr
    assert _downloads(server) - before == 2
    assert (node / "sha256" / sha).read_bytes() == data
    assert next((tmp_path / "pod3").iterdir()).read_bytes() == data


def test_the_least_recently_used_entries_are_evicted_past_the_bound(server, tmp_path):
    """Three artifacts of 100 kB in a cache of 250 kB: fetching the third evicts the one used
    longest ago (the second: the first was used again since), never the one being admitted."""
    from tunecache.store.http import TunecacheClient
    from tunecache.client.node_cache import NodeCache, Transfer, fetch_artifact

    blobs = [os.urandom(100_000) for _ in range(3)]
    shas = [hashlib.sha256(blob).hexdigest() for blob in blobs]
    for sha, blob in zip(shas, blobs):
        assert as_admin.put(f"{server}/v1/artifacts/{sha}", content=blob, timeout=30).status_code in (200, 201)
    cache = NodeCache(tmp_path / "node", max_bytes=250_000)
    transfer = Transfer()
    with TunecacheClient(server) as client:
        for sha in shas[:2]:
            assert fetch_artifact(client, sha, transfer, cache).read_bytes() == blobs[shas.index(sha)]
            time.sleep(0.02)
        assert fetch_artifact(client, shas[0], transfer, cache).from_node_cache  # used again: newest
        time.sleep(0.02)
        third = fetch_artifact(client, shas[2], transfer, cache)
    assert third.read_bytes() == blobs[2]
    assert sorted(p.name for p in (tmp_path / "node" / "sha256").iterdir()) == sorted([shas[0], shas[2]])
    assert (transfer.artifacts, transfer.from_cache, transfer.bytes) == (4, 1, 300_000)
    # an artifact over the whole bound is handed over but never kept
    small = NodeCache(tmp_path / "small", max_bytes=50_000)
    with TunecacheClient(server) as client:
        assert fetch_artifact(client, shas[1], None, small).read_bytes() == blobs[1]
    assert not list((tmp_path / "small" / "sha256").iterdir()) and not list((tmp_path / "small" / "tmp").iterdir())


def test_an_installs_artifacts_download_several_at_once_in_their_order(server, pacer, tmp_path, monkeypatch):  # noqa: F811
    """Three artifacts whose bodies each take about 1 s through the pacing relay: four at once
    (the default) fetch them in about 1 s, one at a time in about 3 s; the files come back in the
    order asked, and the tally adds them up."""
    from tunecache.store.http import TunecacheClient
    from tunecache.client.node_cache import Transfer, fetch_artifacts

    handler, url = pacer
    handler.part, handler.every_s = 2048, 0.1
    blobs = [os.urandom(20_000) for _ in range(3)]
    shas = [hashlib.sha256(blob).hexdigest() for blob in blobs]
    for sha, blob in zip(shas, blobs):
        assert as_admin.put(f"{server}/v1/artifacts/{sha}", content=blob, timeout=30).status_code in (200, 201)
    took = {}
    for downloads in ("4", "1"):
        monkeypatch.setenv("TUNECACHE_DOWNLOADS", downloads)
        transfer = Transfer()
        started = time.monotonic()
        with TunecacheClient(url) as client, client.deadline_scope():
            files = fetch_artifacts(client, shas, transfer)
        took[downloads] = time.monotonic() - started
        assert [f.read_bytes() for f in files] == blobs
        assert (transfer.artifacts, transfer.bytes) == (3, 60_000)
    assert took["4"] < 2.2 < 2.8 < took["1"], took


def test_a_pod_waiting_for_another_pods_moving_download_keeps_its_install_deadline(server, pacer, tmp_path,  # noqa: F811
                                                                                      monkeypatch):
    """Pod A downloads an artifact over about 3 s (paced); pod B, whose install deadline is 1.5 s,
    waits for that entry of the node cache and then downloads its second artifact itself: the
    time A's download moved is given back to B's deadline, as B's own moving body would be, so
    B installs both (before: its second request came after its deadline and it gave up)."""
    import threading

    from tunecache.client.node_cache import NodeCache, fetch_artifact, fetch_artifacts
    from tunecache.store.http import TunecacheClient

    handler, url = pacer
    handler.part, handler.every_s = 2048, 0.2
    slow, small = os.urandom(30_000), os.urandom(1_000)
    shas = [hashlib.sha256(blob).hexdigest() for blob in (slow, small)]
    for sha, blob in zip(shas, (slow, small)):
        assert as_admin.put(f"{server}/v1/artifacts/{sha}", content=blob, timeout=30).status_code in (200, 201)
    cache = NodeCache(tmp_path / "node-cache")
    got: dict[str, bytes] = {}

    def pod_a() -> None:
        with TunecacheClient(url) as client, client.deadline_scope(60):
            got["a"] = fetch_artifact(client, shas[0], None, cache).read_bytes()

    first = threading.Thread(target=pod_a)
    first.start()
    waited = time.monotonic()
    while not list((tmp_path / "node-cache" / "tmp").glob("*.part")):  # A holds the entry's lock and downloads
        assert time.monotonic() - waited < 30 and first.is_alive(), "pod A never started its download"
        time.sleep(0.01)
    monkeypatch.setenv("TUNECACHE_DOWNLOADS", "1")
    started = time.monotonic()
    with TunecacheClient(url) as client, client.deadline_scope(1.5):
        files = fetch_artifacts(client, shas, None, cache)
    first.join(30)
    assert [f.read_bytes() for f in files] == [slow, small] and got["a"] == slow
    assert time.monotonic() - started > 1.5  # it waited past its deadline, the other pod's bytes moving
