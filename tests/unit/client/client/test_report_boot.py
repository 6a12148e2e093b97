"""The boot identity a pod's reports carry (``boot_id``): one per pod boot, so the fleet
view counts a boot once whatever the number of its installs, ranks and repeats. Made once
per process start and handed down through ``TUNECACHE_BOOT_ID`` to the processes it starts
(vLLM's workers), so every rank of a boot sends the same; a value set by the operator is
used as it is; one that is not a valid boot id is replaced."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support.builders import file_environment, h200_key
from tests.support.paths import CUDNN_FILE
from tunecache.client import report as reporting
from tunecache.contract import ReportOutcome, ReportSource


def _report(**fields):
    return reporting.build_report(h200_key(), file_environment(CUDNN_FILE), ReportOutcome.INSTALLED, 1.0,
                                  ReportSource.API, run_id=1, **fields)


def test_every_report_of_a_process_carries_one_boot_id_its_children_inherit(monkeypatch):
    monkeypatch.delenv("TUNECACHE_BOOT_ID", raising=False)
    monkeypatch.setattr(reporting, "_boot_id", None)
    first, second = _report(), _report(rank=1)
    assert first.boot_id and first.boot_id == second.boot_id
    assert os.environ["TUNECACHE_BOOT_ID"] == first.boot_id  # a worker started now sends the same
    child = subprocess.run([sys.executable, "-c", "from tunecache.client.report import boot_id; print(boot_id())"],
                           capture_output=True, text=True, check=True, env=os.environ.copy())
    assert child.stdout.strip() == first.boot_id


def test_an_operators_boot_id_is_used_and_an_invalid_one_replaced(monkeypatch):
    monkeypatch.setattr(reporting, "_boot_id", None)
    monkeypatch.setenv("TUNECACHE_BOOT_ID", "pod-uid-1234-5678")
    assert _report().boot_id == "pod-uid-1234-5678"
    monkeypatch.setattr(reporting, "_boot_id", None)
    monkeypatch.setenv("TUNECACHE_BOOT_ID", "no spaces / allowed")
    replaced = _report().boot_id
    assert replaced and replaced != "no spaces / allowed" and os.environ["TUNECACHE_BOOT_ID"] == replaced
