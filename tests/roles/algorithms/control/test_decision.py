"""The lazy aggregation decision and the figures it rests on (pure)."""

from __future__ import annotations

import pytest

from roles.algorithms.control.decision import (
    MBIT,
    FailureWindow,
    HostMeter,
    counted_interfaces,
    decide,
    utilisation,
)

WORKERS = ["worker-0", "worker-1"]
HEALTHY = dict(net_util=0.1, failure_rate=0.0, local_rounds={"worker-0": 4, "worker-1": 5},
               idle=set(), workers=WORKERS, net_util_max=0.3, failure_rate_max=0.05,
               min_local_rounds=4)


def test_all_conditions_together_allow_aggregation():
    verdict = decide(**HEALTHY)
    assert verdict.aggregate and verdict.reason.startswith("aggregate: network 0.100 < 0.3")


@pytest.mark.parametrize("change, blocker", [
    ({"net_util": 0.3}, "network utilisation 0.300 >= net_util_max 0.3"),
    ({"failure_rate": 0.2}, "failure rate 0.200 >= failure_rate_max 0.05"),
    ({"local_rounds": {"worker-0": 4, "worker-1": 3}},
     "local rounds below min_local_rounds 4: worker-1 3"),
    ({"local_rounds": {"worker-0": 4}}, "local rounds below min_local_rounds 4: worker-1 0"),
    ({"workers": []}, "no live worker"),
])
def test_each_condition_alone_blocks_aggregation_and_says_why(change, blocker):
    verdict = decide(**{**HEALTHY, **change})
    assert not verdict.aggregate
    assert verdict.blockers == [blocker] and verdict.reason == f"wait: {blocker}"


def test_every_failing_condition_is_named():
    verdict = decide(**{**HEALTHY, "net_util": 0.9, "failure_rate": 0.5})
    assert len(verdict.blockers) == 2 and "network" in verdict.reason \
        and "failure rate" in verdict.reason


def test_an_idle_worker_does_not_hold_the_round_back():
    starved = {**HEALTHY, "local_rounds": {"worker-0": 9, "worker-1": 1}}
    assert not decide(**starved).aggregate
    assert decide(**{**starved, "idle": {"worker-1"}}).aggregate


def test_utilisation_is_bytes_per_second_over_duplex_capacity_summed_over_hosts():
    a, b = HostMeter(), HostMeter()
    a.update(0.0, {"eth0": [0, 0]}, {"eth0": 1000}, ["eth0"], 10_000)
    a.update(2.0, {"eth0": [250 * MBIT, 250 * MBIT]}, {"eth0": 1000}, ["eth0"], 10_000)
    assert a.rate == pytest.approx(250 * MBIT)              # (250 + 250) Mbit over 2 s
    assert a.capacity == pytest.approx(2 * 1000 * MBIT)      # 1 Gbit/s each way
    assert utilisation([a]) == pytest.approx(0.125)
    # a host whose NIC reports no speed (0) counts at the configured link_mbps
    b.update(0.0, {"ens5": [0, 0]}, {"ens5": 0}, ["ens5"], 3000)
    b.update(1.0, {"ens5": [0, 0]}, {"ens5": 0}, ["ens5"], 3000)
    assert b.capacity == pytest.approx(2 * 3000 * MBIT) and b.rate == 0
    assert utilisation([a, b]) == pytest.approx(250 * MBIT / (8000 * MBIT))
    assert utilisation([]) == 0.0


def test_counters_that_go_backwards_do_not_make_negative_rates():
    m = HostMeter()
    m.update(0.0, {"lo": [100, 100]}, {}, ["lo"], 10_000)
    m.update(1.0, {"lo": [10, 10]}, {}, ["lo"], 10_000)  # a counter reset
    assert m.rate == 0


def test_counted_interfaces_loopback_only_on_one_host_named_ones_when_configured():
    nics = ["lo", "eth0", "docker0"]
    assert counted_interfaces(nics, [], single_host=True) == ["lo"]
    assert counted_interfaces(nics, [], single_host=False) == ["eth0", "docker0"]
    assert counted_interfaces(nics, ["eth0", "wlan9"], single_host=False) == ["eth0"]


def test_failure_rate_counts_failing_nodes_over_every_node_in_a_sliding_window():
    w = FailureWindow()
    for t in (0.0, 5.0, 10.0):
        for node in ("a", "b", "c", "d"):
            w.saw(node, t, failing=(node == "b" and t == 5.0))   # b answered one probe late
    assert w.rate(10.0, window_s=30.0) == pytest.approx(1 / 4)
    assert w.rate(36.0, window_s=30.0) == 0.0           # its late answer is out of the window
    w.crashed("c", 12.0)                                 # c crashed: no longer seen alive
    for t in (20.0, 30.0, 41.0):
        for node in ("a", "b", "d"):
            w.saw(node, t)
    # a crashed node still counts, as failing and as a node of the job, while in the window
    assert w.rate(30.0, window_s=30.0) == pytest.approx(2 / 4)
    assert w.rate(41.0, window_s=30.0) == pytest.approx(1 / 4)
    assert w.rate(42.5, window_s=30.0) == 0.0           # the window has passed both
    w.forget(42.5, 30.0)
    assert set(w.seen) == {"a", "b", "d"}
    assert FailureWindow().rate(1.0, 30.0) == 0.0
