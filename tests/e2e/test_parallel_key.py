"""The expert-parallel key field through a live `tunecache serve` and the CLI (the key's own
tests are in tests/unit/client/test_parallel_key.py)."""

from __future__ import annotations


from tests.support.paths import CUDNN_FILE
from tests.support.cli import pull, push


def test_an_expert_parallel_pod_does_not_get_a_tuning_made_without_it(server, tmp_path):
    assert push(server, CUDNN_FILE, "-tp", "4").returncode == 0
    same = pull(server, tmp_path / "a", CUDNN_FILE, "-tp", "4")
    assert same.returncode == 0, same.stderr
    ep = pull(server, tmp_path / "b", CUDNN_FILE, "-tp", "4", "--enable-expert-parallel")
    assert ep.returncode == 3
    assert "expert_parallel_size: stored 1, yours 4" in ep.stderr
    dp = pull(server, tmp_path / "c", CUDNN_FILE, "-tp", "4", "--data-parallel-size", "2")
    assert dp.returncode == 3 and "data_parallel_size: stored 1, yours 2" in dp.stderr
    assert not (tmp_path / "b").exists() and not (tmp_path / "c").exists()
    # its own tuning, pushed with the same flags, is found
    assert push(server, CUDNN_FILE, "-tp", "4", "--enable-expert-parallel").returncode == 0
    ep = pull(server, tmp_path / "b", CUDNN_FILE, "-tp", "4", "--enable-expert-parallel")
    assert ep.returncode == 0, ep.stderr
