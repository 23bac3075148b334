"""The worker's side of each sync mode (``roles.algorithms.sync``): whether its replica has a
local optimiser, what follows a training batch's backward pass, when a training batch may go,
and what the worker tells control of its progress (RoundReady). Pure: the worker sends what a
strategy returns. What every mode shares (contributing on Aggregate, adopting weights) is the
worker's and the replica's (``roles.algorithms.worker.replica``).
"""

from __future__ import annotations

from typing import Protocol

from roles.algorithms.shared.live import LiveValues
from roles.algorithms.worker.replica import Replica
from roles.job.settings import TrainConfig
from roles.protocol.dense_sync import RoundReady, StepGrad


class WorkerSync(Protocol):
    @property
    def local_lr(self) -> float | None:
        """The learning rate of the replica's local Adam; None: it has none."""

    @property
    def deltas(self) -> bool:
        """Contributions carry the local progress since the last one."""

    def after_backward(self, replica: Replica, weight_sum: float) -> StepGrad | None:
        """A training batch's gradients are in: None when the step is taken locally (the
        batch is done), else the StepGrad to send, whose answer (the new weights) ends it."""

    def due(self, replica: Replica, round_: int) -> bool:
        """A training batch of sync round ``round_`` may train now."""

    def trained(self, replica: Replica) -> RoundReady | None:
        """A training batch is done: the progress report control is due, if any."""

    def starved(self, replica: Replica) -> RoundReady | None:
        """Nothing to train for a heartbeat: the report control is due, if any."""

    def counters(self) -> dict[str, int]:
        """The mode's figures for the heartbeat (the same keys in every mode)."""


def step_locally(replica: Replica) -> None:
    if replica.optimizer is not None:  # a group leader may own no weights
        replica.optimizer.step()


def progress(replica: Replica, idle: bool = False) -> RoundReady:
    """The replica's progress towards the next round, as control hears it."""
    return RoundReady(round=replica.settled_round + 1, steps=replica.steps_since, idle=idle)


class StepSync:
    """``step``: no local optimiser; the dense gradient of every step goes to the aggregator,
    which applies it with its Adam and answers with the new weights; the worker waits for
    them. Rounds (the epoch-end round) carry samples and coefficients, no delta."""

    local_lr = None
    deltas = False

    def after_backward(self, replica: Replica, weight_sum: float) -> StepGrad | None:
        return StepGrad(coefficient=weight_sum, grads=replica.dense_grads())

    def due(self, replica: Replica, round_: int) -> bool:
        return True

    def trained(self, replica: Replica) -> RoundReady | None:
        return None

    def starved(self, replica: Replica) -> RoundReady | None:
        return None

    def counters(self) -> dict[str, int]:
        return {"waits_at_max": 0}


class EverySync:
    """``every``: local Adam; once ``sync_every`` local steps are done since its last
    contribution, the worker tells control it is ready (once per round); on Aggregate(r) it
    contributes its delta and keeps training."""

    deltas = True

    def __init__(self, local_lr: float, sync_every: int):
        self.local_lr = local_lr
        self.sync_every = sync_every
        self.ready_sent_for = -1  # the round the last RoundReady was for

    def after_backward(self, replica: Replica, weight_sum: float) -> StepGrad | None:
        step_locally(replica)
        return None

    def due(self, replica: Replica, round_: int) -> bool:
        return True

    def trained(self, replica: Replica) -> RoundReady | None:
        next_round = replica.settled_round + 1
        if replica.steps_since >= self.sync_every and self.ready_sent_for < next_round:
            self.ready_sent_for = next_round
            return progress(replica)
        return None

    def starved(self, replica: Replica) -> RoundReady | None:
        return None

    def counters(self) -> dict[str, int]:
        return {"waits_at_max": 0}


class RoundSync:
    """``round``: local Adam; the feeder releases ``round_iterations`` batches per worker per
    round, control calls Aggregate(r) when they are all acknowledged, and a batch of round
    r + 1 trains only once the worker has contributed to round r, so that its samples in the
    round are exact."""

    deltas = True

    def __init__(self, local_lr: float):
        self.local_lr = local_lr

    def after_backward(self, replica: Replica, weight_sum: float) -> StepGrad | None:
        step_locally(replica)
        return None

    def due(self, replica: Replica, round_: int) -> bool:
        return round_ <= replica.settled_round + 1  # round r - 1 contributed

    def trained(self, replica: Replica) -> RoundReady | None:
        return None

    def starved(self, replica: Replica) -> RoundReady | None:
        return None

    def counters(self) -> dict[str, int]:
        return {"waits_at_max": 0}


class LazySync:
    """``lazy``: local Adam; a local round is ``sync_every`` local steps, each reported to
    control (RoundReady), which decides when to aggregate (``roles.algorithms.control.decision``). A
    worker that has done ``max_local_rounds`` (a live setting) local rounds since its last
    contribution waits; one starved for a heartbeat (the end of a pass) says so (idle), so
    that it does not hold the aggregation back."""

    deltas = True

    def __init__(self, local_lr: float, sync_every: int, settings: LiveValues):
        self.local_lr = local_lr
        self.sync_every = sync_every
        self.settings = settings
        self.waits_at_max = 0  # local rounds that ended at the maximum

    def at_max_local_rounds(self, replica: Replica) -> bool:
        return bool(replica.steps_since >= self.settings["max_local_rounds"] * self.sync_every)

    def after_backward(self, replica: Replica, weight_sum: float) -> StepGrad | None:
        step_locally(replica)
        return None

    def due(self, replica: Replica, round_: int) -> bool:
        return not self.at_max_local_rounds(replica)  # else wait for an aggregation

    def trained(self, replica: Replica) -> RoundReady | None:
        if replica.steps_since % self.sync_every:
            return None
        self.waits_at_max += self.at_max_local_rounds(replica)  # one more local round
        return progress(replica)

    def starved(self, replica: Replica) -> RoundReady | None:
        return progress(replica, idle=True)

    def counters(self) -> dict[str, int]:
        return {"waits_at_max": self.waits_at_max}


def for_mode(train: TrainConfig, settings: LiveValues) -> WorkerSync:
    """The worker's strategy for ``train.sync``."""
    match train.sync:
        case "step":
            return StepSync()
        case "every":
            return EverySync(train.dense_lr, train.sync_every)
        case "round":
            return RoundSync(train.dense_lr)
        case "lazy":
            return LazySync(train.dense_lr, train.sync_every, settings)
    raise ValueError(f"unknown sync mode {train.sync!r}")
