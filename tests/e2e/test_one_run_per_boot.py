"""One run per boot: the engine's main process installs a run's warm state and hands the run's id
to its workers, which install the tactics of that run, by id, whatever became current meanwhile
(tests/support/vllm_stand_in.py drives the boot; a real `tunecache serve` answers it).

Before, the first worker looked the key up again: a promote between the two lookups gave a pod
one run's warm state and another run's tactics, and its report named only the second.
"""

from __future__ import annotations

import pytest

from tests.e2e.test_warm_state import pod_env, push_warm_run
from tests.support.builders import stored_reports
from tests.support.serve import admin_token, as_admin
from tests.support.vllm_stand_in import rank_file, run_engine, run_worker, tunecache_lines

# What this module tests happens on the pod: its server runs on SQLite only (tests/conftest.py).
SERVER_DATABASE_INCIDENTAL = True


def _two_runs(server, tmp_path, signing_key) -> tuple[int, int]:
    """Two warm runs of one key, the first current (the second was promoted back from)."""
    runs = []
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
        runs.append(push_warm_run(server, tmp_path / name, signing_key, block_size=32))
    assert as_admin.post(f"{server}/v1/tunings/{runs[0]}/promote").status_code == 200
    return runs[0], runs[1]


def test_a_promote_between_the_main_process_and_its_worker_leaves_the_boot_on_one_run(server, tmp_path,
                                                                                    node_signing_key, database_url):
    one, two = _two_runs(server, tmp_path, node_signing_key)
    promote = tmp_path / "promote.py"  # run by the stand-in after the main process installed, before its worker
    promote.write_text(f"import httpx\nanswer = httpx.post({f'{server}/v1/tunings/{two}/promote'!r}, "
                       f"headers={{'Authorization': 'Bearer {admin_token()}'}})\n"
                       "assert answer.status_code == 200, answer.text\n")
    seen, log = run_engine(tmp_path, **pod_env(tmp_path, server, STAND_IN_BETWEEN=str(promote)))
    assert seen["compile"] == {"backbone": True, "aot": True}
    lines = tunecache_lines(log)
    assert lines[0].startswith(f"tunecache: warm state of run {one} installed for "), lines
    [tactics] = [line for line in lines if line.startswith("tunecache: installed run ")]
    assert tactics.startswith(f"tunecache: installed run {one} "), lines  # not the run promoted meanwhile
    assert as_admin.get(f"{server}/v1/tunings/{two}").json()["is_current"] is True  # the promote did happen
    [report] = stored_reports(database_url, 1)
    assert report.outcome == "installed" and report.run_id == one and report.installed_from == [one]


def test_a_worker_that_cannot_fetch_the_handed_run_installs_nothing_and_says_why(server, tmp_path,
                                                                                 node_signing_key, database_url):
    one, _ = _two_runs(server, tmp_path, node_signing_key)
    missing = one + 100  # the run the main process installed was deleted meanwhile
    seen, log = run_worker(tmp_path, TUNECACHE_URL=server, TUNECACHE_WARM_STATE_RUN=str(missing))
    assert seen["flashinfer_autotune"]["file_present_at_warmup"] is False
    assert not rank_file(tmp_path, 0).exists()
    [line] = tunecache_lines(log)
    assert line.startswith(f"tunecache: no tuning installed, vLLM will tune: HandedRunUnavailable: run {missing}, "
                           "whose warm state this boot's engine installed, could not be fetched: "), line
    [report] = stored_reports(database_url, 1)
    assert report.outcome == "error" and report.error_kind == "HandedRunUnavailable"
    assert report.run_id is None and report.installed_from == [missing]


@pytest.mark.parametrize("handed", ["", "not-a-run"])
def test_a_worker_without_a_handed_run_looks_the_key_up(server, tmp_path, node_signing_key, handed):
    one, _ = _two_runs(server, tmp_path, node_signing_key)
    seen, log = run_worker(tmp_path, TUNECACHE_URL=server, TUNECACHE_WARM_STATE_RUN=handed)
    assert seen["flashinfer_autotune"]["file_present_at_warmup"] is True
    assert tunecache_lines(log)[0].startswith(f"tunecache: installed run {one} "), log
