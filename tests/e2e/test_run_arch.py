"""``push --arch`` must be the arch of the file's GPU (issue 39, Why 8): ``push --arch sm999``,
or ``sm80`` for an H200 file, was stored as current under a key no pod could ever look up."""

from __future__ import annotations

import pytest

from tests.support.builders import h200_key, run_payload
from tests.support.cli import push
from tests.support.paths import CUDNN_FILE
from tests.support.serve import as_admin
from tunecache.cli_kit import ExitCode


@pytest.mark.parametrize("arch", ["sm999", "sm80"])
def test_an_arch_that_is_not_the_files_gpus_is_refused_by_the_cli_and_the_service(server, arch):
    pushed = push(server, CUDNN_FILE, "--arch", arch)
    assert pushed.returncode == int(ExitCode.BAD_INPUT), pushed.stderr
    assert pushed.stderr.splitlines() == [
        f"tunecache: error: {CUDNN_FILE}: key.arch {arch!r} is not the arch of the GPU the file was tuned on "
        "(_metadata.gpu 'NVIDIA H200' is sm90); pods on that GPU look up sm90, so no pod would ever find it; nothing "
        "was uploaded"]
    # any client: the service refuses the record too, naming the field
    sha = __import__("hashlib").sha256(CUDNN_FILE.read_bytes()).hexdigest()
    assert as_admin.put(f"{server}/v1/artifacts/{sha}", content=CUDNN_FILE.read_bytes()).status_code in (200, 201)
    answer = as_admin.post(f"{server}/v1/tunings", json=run_payload(CUDNN_FILE, h200_key(arch=arch)))
    assert answer.status_code == 422 and f"key.arch {arch!r} is not the arch of the GPU" in answer.text, answer.text
    assert as_admin.get(f"{server}/v1/tunings").json()["total"] == 0
    assert push(server, CUDNN_FILE, "--arch", "sm90").returncode == 0  # the file's own arch
