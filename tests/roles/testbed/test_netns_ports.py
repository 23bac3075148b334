"""The tests' hosts (``roles.testbed.netns``) are configured as docs/operations.md ("Ports")
asks of a host: a job's ports reserved, so that no outgoing connection takes one as its local
port and a role started again can bind it."""

from __future__ import annotations

import pytest
from harness import hosts_or_skip

from roles.protocol.topology import MAX_SHARDS, ROWS_OFFSET, reserved_ports


def test_the_reserved_range_covers_every_port_a_role_binds():
    assert reserved_ports() == "47100-49794"
    assert reserved_ports(20000) == f"20000-{20000 + ROWS_OFFSET + MAX_SHARDS - 1}"


@pytest.mark.integration
def test_each_host_namespace_reserves_the_jobs_ports():
    with hosts_or_skip() as hosts:
        for host in ("a", "b", "c"):
            got = hosts.run(host, ["cat", "/proc/sys/net/ipv4/ip_local_reserved_ports"])
            assert got.stdout.decode().strip() == reserved_ports(), host
