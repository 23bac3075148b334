"""Control's view of the cluster (pure: control feeds it messages and the clock).

Every node that said Hello has a record. The job starts when the expected nodes (the feeder,
the aggregator, the shards and the first ``workers`` workers) are all ready. Workers may join
later under any new index, leave (SIGTERM), or fail (silent for ``node_timeout_s``); each of
these changes the live worker set and raises ``version``. ``events`` is the history.

``Stalls`` tells a silence control could not have heard from a lost node: control's own loop
stalled (its host was starved or stopped), or every node went silent at once (their host, or
control's network, stalled). Either way each live node gets a fresh ``node_timeout_s``, once.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

ALIVE, FAILED, LEFT = "alive", "failed", "left"
KEEP_STALLS = 100  # the stalls a summary lists (all are counted)


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
    signalled: str = ""   # the signal that stopped the process, as it said leaving


class Members:
    def __init__(self, expected: list[str], max_workers: int, started: float):
        self.expected = expected
        self.max_workers = max_workers
        self.started = started
        self.nodes: dict[str, NodeState] = {}
        self.version = 0
        self.events: list[dict[str, Any]] = []
        self.restarts = 0   # the whole job went back to a checkpoint (``restart_all``)

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

    def restart_all(self) -> None:
        """The whole job goes back to a checkpoint: every node joins anew, as a new process
        (planned: no node crashed)."""
        self.nodes.clear()
        self.version += 1
        self.restarts += 1

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

    def excuse(self, now: float, heard_after: float | None) -> int:
        """Give a fresh timeout from ``now`` to every live, ready node heard from after
        ``heard_after`` (any, when None), and forget its pending probe (control could not
        have heard it); returns how many."""
        fresh = [s for s in self.live_nodes()
                 if heard_after is None or s.last_seen > heard_after]
        for s in fresh:
            s.last_seen = now
            s.probe_pending_since = None
        return len(fresh)

    def all_quiet(self, now: float, quiet: float) -> bool:
        """Every live, ready node (two at least) silent for longer than ``quiet``."""
        live = self.live_nodes()
        return len(live) >= 2 and all(now - s.last_seen > quiet for s in live)

    def not_final(self, alive: bool = False) -> list[str]:
        """Nodes whose figures are those of a heartbeat before Finish (every node's, before
        the job finishes; a failed node's always); ``alive``: of the live, ready nodes only."""
        return [n for n, s in self.nodes.items() if not s.final
                and (not alive or (s.ready and s.status == ALIVE))]


class Stalls:
    """Silences control could not have heard. Control calls ``check`` before it times nodes
    out; a stall gives every live node a fresh timeout (``Members.excuse``: once, to a node
    silent since the last one) and is recorded.

    - control's own loop went more than half a timeout (and one and a half heartbeats)
      between two checks: its host was starved or the process stopped, and a live node's
      heartbeats may not have been sent, or not read yet;
    - a node is due to be failed while every live node has been silent for longer than
      ``quiet`` (two heartbeats, less when the timeout is short: the nodes' last heartbeats
      before a stall are up to one heartbeat apart, and the first to reach the timeout must
      find the others quiet): a stall of their host or of control's network is likelier than
      every process dying within the same heartbeat.
    """

    def __init__(self, timeout: float, heartbeat: float, started: float):
        self.timeout = timeout
        self.gap_limit = max(timeout / 2, 1.5 * heartbeat)
        self.quiet = min(2 * heartbeat, (timeout - heartbeat) / 2)  # <= 0: not looked for
        self.started = started
        self.last_check: float | None = None
        self.excused_at: float | None = None  # the latest fresh timeout given
        self.count = 0
        self.events: deque[dict[str, Any]] = deque(maxlen=KEEP_STALLS)  # the latest

    def check(self, now: float, members: Members) -> str:
        """'' when nothing stalled, else why live nodes got a fresh timeout."""
        gap = 0.0 if self.last_check is None else now - self.last_check
        self.last_check = now
        if gap > self.gap_limit:
            why = f"control's own loop stalled for {gap:.1f} s"
        elif (self.quiet > 0 and members.silent(now, self.timeout)
              and members.all_quiet(now, self.quiet)):
            quiet = min(now - s.last_seen for s in members.live_nodes())
            why = f"every live node went silent at once (for {quiet:.1f} s at least)"
        else:
            return ""
        nodes = members.excuse(now, heard_after=self.excused_at)  # once to a silent node
        self.excused_at = now
        if not nodes:  # each silent since the last stall: they are failed now
            return ""
        self.count += 1
        self.events.append({"t": round(now - self.started, 3), "why": why, "nodes": nodes})
        return why
