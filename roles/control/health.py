"""The cluster's health as control measures it: network utilisation per host from the load
figures in heartbeats, and the failure rate from probes (``roles.algorithms.decision`` holds
the arithmetic). Sync mode lazy decides on these figures; consoles see them in the status."""

from __future__ import annotations

from collections.abc import Callable

from roles.algorithms.decision import HostMeter, counted_interfaces, failure_rate, utilisation
from roles.algorithms.membership import ALIVE, Members, NodeState
from roles.protocol.topology import ClusterConfig
from zbus.codec import ProtocolError
from zbus.messages import Probe


class Health:
    def __init__(self, cluster: ClusterConfig, members: Members,
                 send_probe: Callable[[str, Probe], None]):
        self.cluster = cluster
        self.members = members
        self.send_probe = send_probe
        self.hosts: dict[str, HostMeter] = {}
        self.nonce = 0
        self.next_probe = 0.0

    def meter(self, node: NodeState, load: dict, now: float) -> None:
        """A heartbeat's network counters; ProtocolError when they are malformed."""
        net, speeds = load.get("net"), load.get("speed", {})
        c = self.cluster
        try:
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

    def figures(self, now: float, probe_timeout_s: float) -> tuple[float, float]:
        """(network utilisation, failure rate) of the cluster now."""
        pending = [n.probe_pending_since for n in self.members.live_nodes()]
        return (utilisation(list(self.hosts.values())),
                failure_rate(pending, now, probe_timeout_s))
