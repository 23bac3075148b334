"""Control's side of the four sync modes (``[train] sync``), one class each: which progress
reports it counts, when a round is due, and what the mode allows; which deaths a mode survives
is its row in ``roles.job.sync_rules`` (with the shapes of cluster it refuses). The workers',
feeder's and aggregator's sides of the same modes are in their own modules.

- ``step``: no rounds while training (the aggregator applies every step); the aggregator
  holds the only dense optimiser, so its death fails the job.
- ``every``: a round once every live worker reported ``sync_every`` local steps (RoundReady).
- ``round``: a round when the feeder reports the round's queue drained (RoundDrained), in
  order; the epoch's evaluation uses the epoch's last round, and a feeder restart fails the
  job (a round counts one feeder process's batches).
- ``lazy``: control decides (``roles.algorithms.control.decision``) on the cluster's network
  utilisation and failure rate and the workers' local rounds, and publishes every decision and
  refusal with its reason (a refusal once per heartbeat interval).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Any

from roles.algorithms.control.decision import decide
from roles.control.health import Health
from roles.job.rundir import MetricsLog
from roles.job.sync_rules import SYNC_MODES
from roles.protocol.dense_sync import Decision, RoundReady


class SyncMode:
    """Step mode, and the defaults of the others."""

    name = "step"
    rules = SYNC_MODES[name]      # the deaths it survives (``roles.job.sync_rules``)
    operator_rounds = False       # an operator may call a round now
    epoch_end_round = True        # evaluation waits for one more round (else the last one)
    decides_every_tick = False    # control asks ``due`` on every tick, not only on reports
    checkpoint_round = True       # a checkpoint's flush calls a round (else the drained one)
    last: Decision | None = None  # the latest aggregation decision (lazy decides)
    last_at = 0.0                 # when it was taken

    def decision_counts(self) -> dict[str, int]:
        """The decisions to aggregate and to wait taken so far (lazy decides)."""
        return {"aggregate": 0, "wait": 0}

    def progress(self, node_id: str, m: RoundReady) -> None:
        """A worker's RoundReady towards the next round."""

    def due(self, live_workers: list[str], next_round: int, now: float) -> str | None:
        """The reason to call the next round now, or None."""
        return None

    def issued(self) -> None:
        """A round was called: progress starts again from nothing."""

    def workers_changed(self, workers: list[str]) -> None:
        """The live workers are now ``workers``."""

    def queued(self, round_: int, current: int) -> None:
        """Sync mode round: the feeder drained ``round_``."""

    def next_queued(self, current: int) -> int | None:
        """Sync mode round: the drained round to call now, in order, or None."""
        return None

    def rounds_waiting(self) -> bool:
        """Rounds drained but not yet called (evaluation waits for them)."""
        return False

    def to_state(self) -> dict[str, Any]:
        return {}

    def from_state(self, state: dict[str, Any]) -> None:
        """Restore what ``to_state`` gave (a resumed control)."""


class EveryMode(SyncMode):
    name = "every"
    rules = SYNC_MODES[name]
    operator_rounds = True

    def __init__(self, sync_every: int):
        self.sync_every = sync_every
        self.ready: set[str] = set()

    def progress(self, node_id: str, m: RoundReady) -> None:
        self.ready.add(node_id)

    def due(self, live_workers: list[str], next_round: int, now: float) -> str | None:
        if self.ready.issuperset(live_workers):
            return f"every worker did {self.sync_every} local steps"
        return None

    def issued(self) -> None:
        self.ready.clear()

    def workers_changed(self, workers: list[str]) -> None:
        self.ready &= set(workers)


class RoundMode(SyncMode):
    name = "round"
    rules = SYNC_MODES[name]
    epoch_end_round = False
    checkpoint_round = False      # the round the feeders drained is the flush

    def __init__(self) -> None:
        self.drained: list[int] = []   # drained rounds not yet called, ascending

    def queued(self, round_: int, current: int) -> None:
        if round_ > current and round_ not in self.drained:
            bisect.insort(self.drained, round_)

    def next_queued(self, current: int) -> int | None:
        if self.drained and self.drained[0] == current + 1:
            return self.drained.pop(0)
        return None

    def rounds_waiting(self) -> bool:
        return bool(self.drained)

    def to_state(self) -> dict[str, Any]:
        return {"drained": list(self.drained)}

    def from_state(self, state: dict[str, Any]) -> None:
        self.drained = [int(r) for r in state.get("drained", [])]


class LazyMode(SyncMode):
    name = "lazy"
    rules = SYNC_MODES[name]
    operator_rounds = True
    decides_every_tick = True

    def __init__(self, sync_every: int, health: Health, settings: Callable[[], dict],
                 send: Callable[[Decision], object], metrics: MetricsLog, interval: float):
        self.sync_every = sync_every
        self.health = health
        self.settings = settings
        self.send = send
        self.metrics = metrics
        self.interval = interval          # a refusal is published once per interval
        self.local_rounds: dict[str, int] = {}
        self.idle: set[str] = set()
        self.next_decision = 0.0
        self.last_kind = ""
        self.decisions = {"aggregate": 0, "wait": 0}

    def decision_counts(self) -> dict[str, int]:
        return dict(self.decisions)

    def progress(self, node_id: str, m: RoundReady) -> None:
        self.local_rounds[node_id] = m.steps // self.sync_every
        if m.idle:
            self.idle.add(node_id)
        else:
            self.idle.discard(node_id)

    def due(self, live_workers: list[str], next_round: int, now: float) -> str | None:
        """Aggregate when the network is quiet, the cluster healthy and every worker has done
        its local rounds; publish the decision and its reason either way."""
        s = self.settings()
        net_util, failures = self.health.figures(now, s["probe_timeout_s"])
        verdict = decide(net_util=net_util, failure_rate=failures,
                         local_rounds=self.local_rounds, idle=self.idle,
                         workers=live_workers, net_util_max=s["net_util_max"],
                         failure_rate_max=s["failure_rate_max"],
                         min_local_rounds=s["min_local_rounds"])
        if not verdict.aggregate and now < self.next_decision:
            return None
        self.next_decision = now + self.interval
        decision = Decision(round=next_round, aggregate=verdict.aggregate,
                            reason=verdict.reason, net_util=round(net_util, 6),
                            failure_rate=round(failures, 6),
                            local_rounds={w: self.local_rounds.get(w, 0) for w in live_workers})
        kind = "aggregate" if verdict.aggregate else \
            ";".join(b.split(" ")[0] for b in verdict.blockers)
        changed, self.last_kind = kind != self.last_kind, kind
        self.last, self.last_at = decision, now
        self.decisions["aggregate" if verdict.aggregate else "wait"] += 1
        self.send(decision)
        if changed and not verdict.aggregate:
            self.metrics.write("decision", round=decision.round, aggregate=False,
                               reason=verdict.reason, net_util=decision.net_util,
                               failure_rate=decision.failure_rate)
        return verdict.reason if verdict.aggregate else None

    def issued(self) -> None:
        self.local_rounds.clear()
        self.idle.clear()


def sync_mode(name: str, sync_every: int, *, health: Health, settings: Callable[[], dict],
              send: Callable[[Decision], object], metrics: MetricsLog,
              interval: float) -> SyncMode:
    if name == "step":
        return SyncMode()
    if name == "every":
        return EveryMode(sync_every)
    if name == "round":
        return RoundMode()
    if name == "lazy":
        return LazyMode(sync_every, health, settings, send, metrics, interval)
    raise ValueError(f"unknown sync mode {name!r}")
