"""The in-memory bounds of pod reports (no database): who a source is, the per-source gate
and its window, the filter's per-key, new-key and repeat rules, and their memory bounds."""

from __future__ import annotations

from tunecache.service.report_bounds import OTHER_SOURCES, ReportFilter, SourceGate, source_of
from tunecache.service.tokens import ANONYMOUS, Caller


def test_a_source_is_the_token_name_else_the_address_ipv6_by_its_64():
    assert source_of("10.0.0.7", Caller(name="team-a", scope="read")) == "token:team-a"
    assert source_of("10.0.0.7", ANONYMOUS) == "10.0.0.7"
    assert source_of("2001:db8:1:2:aaaa::1", ANONYMOUS) == source_of("2001:db8:1:2:bbbb::9", ANONYMOUS) == "2001:db8:1:2::/64"
    assert source_of("::ffff:10.0.0.7", ANONYMOUS) == "10.0.0.7"
    assert source_of(None, ANONYMOUS) == "-" and source_of("testclient", ANONYMOUS) == "testclient"


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_the_gate_takes_a_bounded_number_per_source_and_window_and_bounds_its_sources():
    clock = Clock()
    gate = SourceGate(3, window_s=60, clock=clock, max_sources=2)
    assert [gate.admit("a") for _ in range(4)] == [True, True, True, False]
    assert gate.admit("b")  # a source of its own
    assert [gate.admit(f"x{i}") for i in range(4)] == [True, True, True, False]  # past 2 sources: one shared budget
    assert set(gate._taken) == {"a", "b", OTHER_SOURCES}
    clock.now = 60  # a new window: everything starts again
    assert gate.admit("a") and gate._taken == {"a": 1}


def _row(key="k1", boot="boot-0001", pod="p", outcome="miss", sender="s", rank=0, run_id=None):
    return dict(key_hash=key, boot_id=boot, pod=pod, outcome=outcome, sender=sender, rank=rank, environment_hash="e",
                compiled=None, run_id=run_id, error_kind=None, source="plugin")


def test_the_filter_keeps_a_boot_once_a_bounded_number_of_boots_and_new_keys_per_source():
    clock = Clock()
    bounds = ReportFilter(boots_per_key=2, new_keys=1, window_s=60, clock=clock)
    tuned, runs = {"tuned"}, {7: "tuned"}
    drop = lambda row: bounds.drop_reason(row, tuned, runs)  # noqa: E731
    assert drop(_row()) is None and drop(_row()) == "repeat"
    assert drop(_row(rank=1)) is None  # another rank of the boot: stored, the same boot
    assert drop(_row(rank=1) | {"source": "cli"}) is None  # not the same report: stored, the same boot
    assert drop(_row(boot="boot-0002")) is None and drop(_row(boot="boot-0003")) == "key"
    assert drop(_row(boot=None)) == "key"  # a report without boot id is a boot of its own
    assert drop(_row(boot="boot-0003", sender="t")) is None  # another source
    assert drop(_row(key="k2")) == "new_key"  # "s" brought k1 already
    assert drop(_row(key="tuned")) is None  # a tuned key is not new
    assert drop(_row(key="tuned", outcome="installed", run_id=7, boot="boot-0009")) is None
    assert drop(_row(key="k1", outcome="installed", run_id=7, boot="boot-0010")) == "unknown_run"  # another key's run
    assert drop(_row(key="tuned", outcome="installed", run_id=8, boot="boot-0011")) == "unknown_run"  # no such run
    clock.now = 60
    assert drop(_row(key="k2")) is None and drop(_row(key="k2")) == "repeat"  # a new window
