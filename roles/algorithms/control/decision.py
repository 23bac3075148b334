"""Control's aggregation decision for sync mode lazy, and the figures behind it (pure).

Aggregate round r only when all three hold:

1. cluster network utilisation < ``net_util_max``. Per host, the bytes/s through the counted
   interfaces (sent + received, from the cumulative counters in heartbeats) over twice their
   capacity (links are full duplex); the cluster's figure is the sum of the hosts' bytes/s over
   the sum of their capacities. Every node on a host reports the same host counters, so each
   host counts once. Counted interfaces: those ``[cluster] interfaces`` names, else loopback
   when the whole cluster is on one host, else every interface but loopback. Capacity: the
   speed psutil reports, or ``[cluster] link_mbps`` where it reports none (loopback, most
   virtual NICs).
2. cluster failure rate < ``failure_rate_max``: over a sliding window of ``failure_window_s``,
   the nodes that crashed (declared failed, or found replaced by a new process) or left a probe
   unanswered for longer than ``probe_timeout_s``, over every node of the job in that window
   (``FailureWindow``). A crashed node counts until the window has passed its crash: then a
   recovered cluster aggregates again.
3. every live worker has done at least ``min_local_rounds`` local rounds since the last
   aggregation, or has nothing left to train (idle) — otherwise a worker starved at the end of
   a pass would hold the round back while the others wait at ``max_local_rounds``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

MBIT = 1_000_000 / 8  # bytes/s in one Mbit/s


def is_loopback(nic: str) -> bool:
    return nic == "lo" or nic.startswith("lo") or nic.lower().startswith("loopback")


def counted_interfaces(nics: list[str], named: list[str], single_host: bool) -> list[str]:
    if named:
        return [n for n in nics if n in named]
    return [n for n in nics if is_loopback(n) == single_host]


@dataclass
class HostMeter:
    """Bytes/s and capacity of one host's counted interfaces, from successive heartbeats."""

    last: tuple[float, int] | None = None
    rate: float = 0.0          # bytes/s, sent + received
    capacity: float = 0.0      # bytes/s, both directions

    def update(self, now: float, net: dict[str, list[int]], speeds: dict[str, float],
               nics: list[str], default_mbps: float) -> None:
        total = sum(int(net[n][0]) + int(net[n][1]) for n in nics if n in net)
        self.capacity = sum(2 * MBIT * (speeds.get(n) or default_mbps) for n in nics)
        if self.last is not None and now - self.last[0] >= 0.2:
            then, before = self.last
            self.rate = max(0, total - before) / (now - then)
            self.last = (now, total)
        elif self.last is None:
            self.last = (now, total)


def utilisation(hosts: list[HostMeter]) -> float:
    capacity = sum(h.capacity for h in hosts)
    return sum(h.rate for h in hosts) / capacity if capacity > 0 else 0.0


class FailureWindow:
    """The failure rate over a sliding time window: the nodes that were failing at some moment
    of the window (a probe answered late, or a crash), over the nodes that were part of the job
    at some moment of it. A node is *seen* while it lives; a crash is seen once, when it is
    found, and the node counts (as failing, and as a node of the job) until the window has
    passed that moment."""

    def __init__(self) -> None:
        self.seen: dict[str, float] = {}      # node -> the last moment it was part of the job
        self.failing: dict[str, float] = {}   # node -> the last moment it was failing

    def saw(self, node: str, now: float, failing: bool = False) -> None:
        self.seen[node] = max(self.seen.get(node, now), now)
        if failing:
            self.failing[node] = max(self.failing.get(node, now), now)

    def crashed(self, node: str, now: float) -> None:
        self.saw(node, now, failing=True)

    def rate(self, now: float, window_s: float) -> float:
        since = now - window_s
        nodes = [n for n, t in self.seen.items() if t >= since]
        if not nodes:
            return 0.0
        return sum(1 for n in nodes if self.failing.get(n, -math.inf) >= since) / len(nodes)

    def forget(self, now: float, window_s: float) -> None:
        """Nodes out of the window for good (bounded memory)."""
        for n in [n for n, t in self.seen.items() if t < now - window_s]:
            del self.seen[n]
            self.failing.pop(n, None)


@dataclass(frozen=True)
class Verdict:
    aggregate: bool
    reason: str
    blockers: list[str] = field(default_factory=list)


def decide(*, net_util: float, failure_rate: float, local_rounds: dict[str, int],
           idle: set[str], workers: list[str], net_util_max: float, failure_rate_max: float,
           min_local_rounds: int) -> Verdict:
    blockers = []
    if net_util >= net_util_max:
        blockers.append(f"network utilisation {net_util:.3f} >= net_util_max {net_util_max}")
    if failure_rate >= failure_rate_max:
        blockers.append(f"failure rate {failure_rate:.3f} >= failure_rate_max "
                        f"{failure_rate_max}")
    behind = [w for w in workers
              if local_rounds.get(w, 0) < min_local_rounds and w not in idle]
    if not workers:
        blockers.append("no live worker")
    elif behind:
        shown = ", ".join(f"{w} {local_rounds.get(w, 0)}" for w in behind[:4])
        more = f" and {len(behind) - 4} more" if len(behind) > 4 else ""
        blockers.append(f"local rounds below min_local_rounds {min_local_rounds}: "
                        f"{shown}{more}")
    if blockers:
        return Verdict(False, "wait: " + "; ".join(blockers), blockers)
    return Verdict(True, f"aggregate: network {net_util:.3f} < {net_util_max}, failure rate "
                         f"{failure_rate:.3f} < {failure_rate_max}, every worker did >= "
                         f"{min_local_rounds} local rounds")
