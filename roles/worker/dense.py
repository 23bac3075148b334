"""A worker's side of the dense network's synchronisation: its replica, its place in the rounds
(``roles.algorithms.worker.replica``), its sync mode (``roles.algorithms.sync.worker``) and its
links to the aggregators.

On Aggregate(r) the worker contributes (its delta but in mode step, the samples and sample
weight behind it) and keeps training, one round in flight at a time, and adopts the weights of
r when they come (broadcast, or the answer to a WeightsRequest). Weights of a newer restore
generation (the aggregator restarted and restored a backup) replace the replica's outright. In
mode step each step's gradient goes to the aggregator, whose answer is the new weights: the
aggregator answers a DEALER's requests in order, so the worker keeps what each answer is for
(``replies_due``). With ``[cluster] aggregators`` > 1 a worker sends its contributions to
aggregator ``index % aggregators``, everything else to the root.

A worker that leads a model-parallel group reads and loads its replica's weights over the group:
an operation on the replica waits for the members' weights (``with_replica``,
``roles.worker.group_link``).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable

import zmq

from roles.algorithms.sync.worker import WorkerSync
from roles.algorithms.worker.replica import RESTORED, STALE, Replica, WorkerRounds
from roles.protocol.datapath import SampleBatch
from roles.protocol.dense_sync import Contribution, StepGrad, Weights, WeightsRequest
from roles.worker.group_link import GroupLink
from zbus.codec import Message

log = logging.getLogger(__name__)


class DenseSide:
    def __init__(self, name: str, replica: Replica, sync: WorkerSync, aggregator: zmq.Socket,
                 group_aggregator: zmq.Socket, send: Callable[[zmq.Socket, Message], object],
                 ask_every_s: float, group: GroupLink | None):
        self.name, self.replica, self.sync = name, replica, sync
        self.aggregator, self.group_aggregator, self.send = aggregator, group_aggregator, send
        self.group = group
        self.rounds = WorkerRounds(ask_every_s)
        # "request" or "step": the aggregator answers a DEALER's requests in order
        self.replies_due: deque[str] = deque()
        self.counts = {"contributions": 0, "rounds_adopted": 0, "restores": 0}

    def with_replica(self, op: Callable[[], None]) -> None:
        """Run ``op`` on the replica: now, or, leading a group, once the members' weights are
        gathered (after the group's work queued before it)."""
        if self.group is not None and self.group.leader is not None:
            self.group.run(self.group.on_weights(op))
        else:
            op()

    def due(self, s: SampleBatch) -> bool:
        """The batch's turn has come (its weights, or what its sync mode waits for)."""
        if s.eval:
            return self.replica.version >= s.min_round
        return self.sync.due(self.replica, s.round)

    def reconnect(self, reconnect: Callable[[zmq.Socket], zmq.Socket]) -> None:
        """The aggregator restarted: its links connected anew where it was made again
        elsewhere (``reconnect``: the worker's, a socket renewed if its peer moved)."""
        same = self.group_aggregator is self.aggregator
        self.aggregator = reconnect(self.aggregator)
        self.group_aggregator = self.aggregator if same else reconnect(self.group_aggregator)

    # -- weights in ------------------------------------------------------------------------------
    def request_weights(self) -> None:
        self.rounds.asked_at = time.monotonic()
        self.replies_due.append("request")
        self.send(self.aggregator, WeightsRequest())

    def answers_step(self) -> bool:
        """An answer from the aggregator: True when it ends a step (mode step), False when it
        answers a WeightsRequest."""
        return self.replies_due.popleft() == "step"

    def adopt(self, w: Weights) -> bool:
        """Weights of a round (or, of a newer generation, restored ones): False when they
        are stale (nothing changed)."""
        taken = self.rounds.weights(self.replica, w)
        if taken == STALE:
            return False
        if taken == RESTORED:
            log.warning("%s: weights restored from a backup (generation %d, round %d) "
                        "replace its own", self.name, w.generation, w.round)
            self.counts["restores"] += 1
        self.counts["rounds_adopted"] += 1
        return True

    def missed(self, now: float, eval_waiting: bool) -> bool:
        """Ask for the weights now (``WorkerRounds.missed``)?"""
        return self.rounds.missed(now, self.replica, eval_waiting)

    # -- out -------------------------------------------------------------------------------------
    def contribute(self, round_: int, done: bool = False) -> None:
        delta, coefficient, samples = self.replica.contribute(round_, self.sync.deltas)
        self.send(self.group_aggregator, Contribution(round=round_, coefficient=coefficient,
                                                      samples=samples, done=done, delta=delta))
        self.counts["contributions"] += 1
        self.rounds.contributed_at = time.monotonic()

    def send_step(self, step: StepGrad) -> None:
        """Mode step: the step's gradient, answered by the new weights."""
        self.send(self.aggregator, step)
        self.replies_due.append("step")

    def counters(self) -> dict:
        r = self.replica
        return {**self.counts, **self.sync.counters(), "round": r.version,
                "generation": self.rounds.generation,
                "round_sent": r.sent_round if r.in_flight else None,
                "round_deferred": self.rounds.deferred, "round_samples": r.samples_since}

    def close(self) -> None:
        # a last contribution on leaving: closed here, with its linger (the context's
        # destroy would set every socket still open to linger 0 and drop it)
        self.group_aggregator.setsockopt(zmq.LINGER, 1000)
        self.group_aggregator.close()
