"""The cluster's health as control measures it: network utilisation per host from the load
figures in heartbeats, and the failure rate from probes and crashes over a sliding window
(``roles.algorithms.control.decision`` holds the arithmetic). Sync mode lazy decides on these
figures; consoles see them in the status.

A crash is found here from the membership: a node newly declared failed, or a known node
answering as a new process (a shard, feeder or aggregator started again) while it had not left.
The whole job going back to a checkpoint (a resume after every process was stopped: every node
a new process) is planned, not a crash (``Members.restart_all``): what was known of the nodes
before it is forgotten.
"""

from __future__ import annotations

from collections.abc import Callable

from roles.algorithms.control.decision import (
    FailureWindow,
    HostMeter,
    counted_interfaces,
    utilisation,
)
from roles.algorithms.control.membership import ALIVE, FAILED, Members, NodeState
from roles.protocol.topology import ClusterConfig
from zbus.codec import ProtocolError
from zbus.messages import Probe


class Health:
    def __init__(self, cluster: ClusterConfig, members: Members,
                 send_probe: Callable[[str, Probe], object], failure_window_s: float = 30.0):
        self.cluster = cluster
        self.members = members
        self.send_probe = send_probe
        self.failure_window_s = failure_window_s
        self.failures = FailureWindow()
        self.known: dict[str, tuple[int, str]] = {}  # node -> (pid, status) last observed
        self.restarts = members.restarts   # the whole-job restarts known of
        self.hosts: dict[str, HostMeter] = {}
        self.nonce = 0
        self.next_probe = 0.0

    def meter(self, node: NodeState, load: dict, now: float) -> None:
        """A heartbeat's network counters; ProtocolError when they are malformed."""
        net, speeds = load.get("net"), load.get("speed", {})
        c = self.cluster
        try:
            if not isinstance(net, dict):
                raise TypeError
            nics = counted_interfaces(list(net), c.interfaces, c.single_host())
            self.hosts.setdefault(node.host, HostMeter()).update(
                now, net, speeds, nics, c.link_mbps)
        except (TypeError, ValueError, KeyError, IndexError, AttributeError):
            raise ProtocolError("bad_field", "heartbeat load.net/speed are not "
                                             "{interface: [sent, received]} / {interface: "
                                             "Mbit/s}") from None

    def probe(self, now: float, interval: float) -> None:
        """Probe every live, ready node (once per ``interval``); one that has not answered
        within probe_timeout_s counts as failing."""
        if now < self.next_probe:
            return
        self.next_probe = now + interval
        self.nonce += 1
        for node_id, node in self.members.nodes.items():
            if node.status == ALIVE and node.ready:
                node.probe_pending_since = node.probe_pending_since or now
                self.send_probe(node_id, Probe(nonce=self.nonce))

    def observe(self, now: float, probe_timeout_s: float) -> None:
        """Every node of the job as it is now: live (answering probes late or not), or found
        crashed since the last look."""
        if self.members.restarts != self.restarts:   # every node started anew, on purpose
            self.restarts = self.members.restarts
            self.known.clear()
        for node_id, node in self.members.nodes.items():
            before = self.known.get(node_id)
            self.known[node_id] = (node.pid, node.status)
            if before is not None and before[1] == ALIVE and (
                    node.status == FAILED or node.pid != before[0]):
                self.failures.crashed(node_id, now)  # declared failed, or replaced
            elif node.status == ALIVE and node.ready:
                pending = node.probe_pending_since
                self.failures.saw(node_id, now, failing=pending is not None
                                  and now - pending > probe_timeout_s)
            # a node that left on purpose drops out once the window has passed it
        self.failures.forget(now, self.failure_window_s)

    def figures(self, now: float, probe_timeout_s: float) -> tuple[float, float]:
        """(network utilisation, failure rate) of the cluster now."""
        self.observe(now, probe_timeout_s)
        return (utilisation(list(self.hosts.values())),
                self.failures.rate(now, self.failure_window_s))
