"""Control's aggregation rounds: the round number, the round in flight, the rounds done and
each worker's samples per round; when the next one is due is the sync mode's to say
(``roles.control.sync_modes``). Round r is called with ``Aggregate(r)`` (standing until the
aggregator reports RoundDone(r)); every live worker then contributes to it.

Before an epoch's evaluation every worker must hold the same weights: the evaluation waits
for one more round (``end of epoch``), or in sync mode round for the epoch's last drained one.
"""

from __future__ import annotations

from dataclasses import dataclass

from roles.algorithms.control.membership import Members
from roles.control.commands import Commands, ProgressClock
from roles.control.sync_modes import SyncMode
from roles.job.rundir import MetricsLog
from roles.protocol.dense_sync import Aggregate, RoundDone, RoundReady

ROUND_SAMPLES_KEPT = 10_000   # rounds whose samples per worker the summary lists (the newest)


@dataclass
class RoundsState:
    round: int = 0
    in_flight: bool = False
    done: int = 0
    eval_round: int | None = None   # the round this epoch's evaluation uses, once known
    mode: dict | None = None


class Rounds:
    def __init__(self, mode: SyncMode, members: Members, commands: Commands,
                 metrics: MetricsLog, progress: ProgressClock):
        self.mode = mode
        self.members = members
        self.commands = commands
        self.metrics = metrics
        self.progress = progress
        self.round = 0
        self.in_flight = False
        self.done_count = 0
        self.eval_round: int | None = None
        # worker -> samples it trained in each of the newest ROUND_SAMPLES_KEPT rounds
        self.samples: dict[str, list[int]] = {}

    # -- reports ----------------------------------------------------------------------------
    def ready(self, node_id: str, m: RoundReady) -> None:
        if m.round == self.round + 1:  # else progress towards a round already called
            self.mode.progress(node_id, m)

    def drained(self, round_: int) -> None:
        """Sync mode round: every batch of ``round_`` is acknowledged; call it, in order."""
        self.mode.queued(round_, self.round)
        self.call_queued()

    def finished(self, m: RoundDone, now: float) -> bool:
        """The aggregator combined a round; True when it was the round in flight."""
        if m.round != self.round or not self.in_flight:
            return False
        self.done_count += 1
        self.progress.touch(now)
        by_worker = dict(zip(m.contributors, m.samples_by, strict=True))
        kept = max((len(v) for v in self.samples.values()), default=0)
        for worker in set(self.samples) | set(by_worker):
            samples = self.samples.setdefault(worker, [0] * kept)
            samples.append(by_worker.get(worker, 0))
            del samples[:-ROUND_SAMPLES_KEPT]  # a long job's memory stays flat
        self.metrics.write("round_done", round=m.round, samples_by=by_worker,
                           coefficient=m.coefficient, samples=m.samples)
        self.over()
        return True

    def over(self) -> None:
        """The round in flight is done (or void: its aggregator was restored)."""
        self.in_flight = False
        self.commands.withdraw("round")
        self.call_queued()

    # -- calling rounds ---------------------------------------------------------------------
    def call(self, reason: str) -> None:
        self.round += 1
        self.in_flight = True
        self.mode.issued()
        self.metrics.write("aggregate", round=self.round, reason=reason)
        self.commands.publish(Aggregate(round=self.round,
                                        participants=self.members.live_workers(),
                                        reason=reason), "round")

    def call_if_due(self, now: float) -> None:
        """While training, with an aggregator and live workers: a round when the mode says."""
        live = self.members.live_workers()
        if self.in_flight or not live:
            return
        reason = self.mode.due(live, self.round + 1, now)
        if reason is not None:
            self.call(reason)

    def call_queued(self) -> None:
        if not self.in_flight:
            round_ = self.mode.next_queued(self.round)
            if round_ is not None:
                self.call(f"round {round_} queue drained")

    def call_now(self, sender: str, aggregator_lost: bool) -> tuple[bool, str]:
        """An operator asks for a round now (modes every and lazy, while training)."""
        if not self.mode.operator_rounds:
            return False, (f"sync mode {self.mode.name} decides its rounds itself "
                           "(aggregate now works in modes every and lazy)")
        if self.in_flight:
            return False, f"round {self.round} is still in flight"
        if aggregator_lost or not self.members.live_workers():
            return False, "no aggregator or no live worker to aggregate with"
        self.call(f"aggregate now: asked by {sender}")
        return True, f"round {self.round} called"

    # -- epochs -----------------------------------------------------------------------------
    def new_epoch(self) -> None:
        self.eval_round = None

    def round_for_eval(self) -> int | None:
        """The round every worker evaluates this epoch with, or None while rounds are still to
        finish first (one more is called here when the mode ends epochs with one)."""
        if self.in_flight or self.mode.rounds_waiting():
            return None
        if self.eval_round is None:
            if self.mode.epoch_end_round:
                self.call("end of epoch")
                self.eval_round = self.round
                return None
            self.eval_round = self.round
        return self.eval_round

    # -- state ------------------------------------------------------------------------------
    def to_state(self) -> RoundsState:
        return RoundsState(self.round, self.in_flight, self.done_count, self.eval_round,
                           self.mode.to_state())

    def from_state(self, s: RoundsState, samples: dict[str, list[int]]) -> None:
        self.round, self.in_flight, self.done_count = s.round, s.in_flight, s.done
        self.eval_round = s.eval_round
        self.mode.from_state(s.mode or {})
        self.samples = samples
