"""The delay bridge (``roles/testbed/delay_bridge.py``) that the benchmark across namespaces uses in
place of ``tc netem``: it forwards between the namespaces (a TCP echo and a stream through it),
and it applies its delay (a round trip through it takes at least the RTT it was given; no
upper bound is asserted, the machine may be loaded). Skipped, with the reason, where the machine
does not allow network namespaces."""

from __future__ import annotations

import subprocess

import pytest
from harness import hosts_or_skip

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("mtu", [None, 65535])
def test_the_bridge_forwards_and_delays_by_the_rtt_it_was_given(mtu):
    with hosts_or_skip(rtt_ms=2.0, mtu=mtu) as hosts:
        delayed = hosts.probe("a", "c", "rtt", "5")
        streamed = hosts.probe("b", "c", "stream", "0.5")
        assert hosts.bridge is not None and hosts.bridge.poll() is None
    assert delayed["connect_ms"] >= 2.0 and delayed["echo_min_ms"] >= 2.0, delayed
    assert streamed["mb_per_s"] > 0
    assert hosts.bridge_stats["frames"] > 0 and hosts.bridge_stats["send_errors"] == 0
    assert hosts.bridge is None and not list_namespaces(hosts.tag)


def test_without_delay_the_bridge_adds_none():
    with hosts_or_skip(rtt_ms=0.0) as hosts:
        undelayed = hosts.probe("a", "b", "rtt", "5")
    assert undelayed["echo_min_ms"] < 2.0, undelayed  # the configured 2 ms above is applied
    assert not list_namespaces(hosts.tag)


def list_namespaces(tag: str) -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, timeout=30).stdout
    return [line for line in out.decode().splitlines() if tag in line]
