"""Control's side of sync mode lazy: the figures the aggregation decision rests on (network
utilisation from heartbeats, failure rate from probes) and the decision itself
(``roles.algorithms.decision``). ``LazyControl`` is a part of ``roles.control.Control`` (a mixin
over its state), kept here to keep each module readable.
"""

from __future__ import annotations

import logging
import time

from roles.algorithms.decision import (
    HostMeter,
    counted_interfaces,
    decide,
    failure_rate,
    utilisation,
)
from roles.algorithms.membership import ALIVE, NodeState
from roles.protocol.dense_sync import Decision
from zbus.codec import ProtocolError
from zbus.messages import Probe

log = logging.getLogger(__name__)


class LazyControl:
    """The aggregation decision, probes and network metering."""

    def meter_network(self, node: NodeState, load: dict) -> None:
        net, speeds = load.get("net"), load.get("speed", {})
        c = self.job.cluster
        try:
            nics = counted_interfaces(list(net), c.interfaces, c.single_host())
            self.hosts.setdefault(node.host, HostMeter()).update(
                time.monotonic(), net, speeds, nics, c.link_mbps)
        except (TypeError, ValueError, KeyError, IndexError, AttributeError):
            raise ProtocolError("bad_field", "heartbeat load.net/speed are not "
                                             "{interface: [sent, received]} / {interface: "
                                             "Mbit/s}") from None

    def cluster_figures(self) -> tuple[float, float]:
        """(network utilisation, failure rate) of the cluster now."""
        now = time.monotonic()
        pending = [n.probe_pending_since for n in self.members.live_nodes()]
        return (utilisation(list(self.hosts.values())),
                failure_rate(pending, now, self.settings["probe_timeout_s"]))

    def decide(self, live_workers: list[str]) -> None:
        """Sync mode lazy: aggregate when the network is quiet, the cluster healthy and every
        worker has done its local rounds; publish the decision and its reason either way."""
        net_util, failures = self.cluster_figures()
        s = self.settings
        verdict = decide(net_util=net_util, failure_rate=failures,
                         local_rounds=self.local_rounds, idle=self.idle_workers,
                         workers=live_workers, net_util_max=s["net_util_max"],
                         failure_rate_max=s["failure_rate_max"],
                         min_local_rounds=s["min_local_rounds"])
        now = time.monotonic()
        if not verdict.aggregate and now < self.next_decision:
            return  # a refusal is published once per heartbeat interval
        self.next_decision = now + self.heartbeat_s
        decision = Decision(round=self.round + 1, aggregate=verdict.aggregate,
                            reason=verdict.reason, net_util=round(net_util, 6),
                            failure_rate=round(failures, 6),
                            local_rounds={w: self.local_rounds.get(w, 0) for w in live_workers})
        kind = "aggregate" if verdict.aggregate else \
            ";".join(b.split(" ")[0] for b in verdict.blockers)
        changed, self.last_decision_kind = kind != self.last_decision_kind, kind
        self.last_decision, self.last_decision_at = decision, now
        self.decisions["aggregate" if verdict.aggregate else "wait"] += 1
        self.send(self.pub, decision)
        if changed and not verdict.aggregate:
            self.metrics.write("decision", round=decision.round, aggregate=False,
                               reason=verdict.reason, net_util=decision.net_util,
                               failure_rate=decision.failure_rate)
        if verdict.aggregate:
            self.issue_round(verdict.reason)

    def probe(self, now: float) -> None:
        """Probe every live node; one not answering within probe_timeout_s is failing."""
        self.next_probe = now + self.heartbeat_s
        self.probe_nonce += 1
        for node_id, node in self.members.nodes.items():
            if node.status == ALIVE and node.ready:
                node.probe_pending_since = node.probe_pending_since or now
                self.send(self.router, Probe(nonce=self.probe_nonce),
                          identity=node_id.encode())

