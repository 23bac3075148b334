"""Control's view of the cluster (pure: control feeds it messages and the clock).

Every node that said Hello has a record. The job starts when the expected nodes (the feeder,
the aggregator, the shards and the first ``workers`` workers) are all ready. Workers may join
later under any new index, leave (SIGTERM), or fail (silent for ``node_timeout_s``); each of
these changes the live worker set and raises ``version``. ``events`` is the history.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ALIVE, FAILED, LEFT = "alive", "failed", "left"


@dataclass
class NodeState:
    role: str
    index: int
    host: str
    pid: int
    last_seen: float
    status: str = ALIVE
    state: str = "starting"   # what the node says it is doing
    ready: bool = False
    final: bool = False
    load: dict[str, Any] = field(default_factory=dict)
    counters: dict[str, Any] = field(default_factory=dict)
    probe_pending_since: float | None = None  # oldest probe not answered yet


class Members:
    def __init__(self, expected: list[str], max_workers: int, started: float):
        self.expected = expected
        self.max_workers = max_workers
        self.started = started
        self.nodes: dict[str, NodeState] = {}
        self.version = 0
        self.events: list[dict[str, Any]] = []

    def refusal(self, node_id: str, role: str, index: int, pid: int) -> str:
        """Why a Hello cannot be admitted ('' when it can)."""
        claimed = f"{role}-{index}"
        joinable = role == "worker" and 0 <= index < self.max_workers
        if claimed != node_id or not (claimed in self.expected or joinable):
            return (f"{claimed} (socket identity {node_id!r}) is not a node of this job, "
                    f"which has {', '.join(self.expected)} (and workers may join)")
        known = self.nodes.get(node_id)
        if (known is not None and known.status == ALIVE and known.pid != pid and known.ready
                and role not in ("aggregator", "ps", "feeder")):  # those recover
            return f"{node_id} is already running as pid {known.pid}"
        return ""

    def admit(self, node_id: str, role: str, index: int, host: str, pid: int,
              now: float) -> bool:
        """Record a node; True when it is new (or a new process under a known id)."""
        known = self.nodes.get(node_id)
        if known is not None and known.pid == pid and known.status == ALIVE:
            known.last_seen = now
            return False
        self.nodes[node_id] = NodeState(role, index, host, pid, now)
        return True

    def mark_ready(self, node_id: str, now: float) -> bool:
        """True when this changes the live workers."""
        node = self.nodes[node_id]
        if node.ready:
            return False
        node.ready = True
        if node.role != "worker":
            return False
        self._event(node_id, "joined", now)
        return True

    def fail(self, node_id: str, now: float, reason: str) -> bool:
        return self._end(node_id, FAILED, now, reason)

    def leave(self, node_id: str, now: float, reason: str) -> bool:
        return self._end(node_id, LEFT, now, reason)

    def _end(self, node_id: str, status: str, now: float, reason: str) -> bool:
        node = self.nodes.get(node_id)
        if node is None or node.status != ALIVE:
            return False
        node.status = status
        self._event(node_id, status, now, reason)
        return node.role == "worker" and node.ready

    def _event(self, node_id: str, event: str, now: float, reason: str = "") -> None:
        self.version += 1
        entry = {"node": node_id, "event": event, "t": round(now - self.started, 3)}
        if reason:
            entry["reason"] = reason
        self.events.append(entry)

    def live_workers(self) -> list[str]:
        return sorted((n for n, s in self.nodes.items()
                       if s.role == "worker" and s.ready and s.status == ALIVE),
                      key=lambda n: self.nodes[n].index)

    def all_expected_ready(self) -> bool:
        return all(n in self.nodes and self.nodes[n].ready and self.nodes[n].status == ALIVE
                   for n in self.expected)

    def missing(self) -> list[str]:
        return [n for n in self.expected if n not in self.nodes or not self.nodes[n].ready]

    def live_nodes(self) -> list[NodeState]:
        return [s for s in self.nodes.values() if s.ready and s.status == ALIVE]

    def silent(self, now: float, timeout: float) -> list[str]:
        """Ready, live nodes not heard from for longer than ``timeout``."""
        return [n for n, s in self.nodes.items()
                if s.ready and s.status == ALIVE and now - s.last_seen > timeout]

    def not_final(self, alive: bool = False) -> list[str]:
        """Nodes whose figures are those of a heartbeat before Finish (every node's, before
        the job finishes; a failed node's always); ``alive``: of the live, ready nodes only."""
        return [n for n, s in self.nodes.items() if not s.final
                and (not alive or (s.ready and s.status == ALIVE))]
