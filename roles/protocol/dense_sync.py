"""Dense synchronisation: control's rounds and decisions, the workers' progress and
contributions, the aggregator's weights, and its backups and restores."""

from __future__ import annotations

from typing import Any

import numpy as np

from zbus.codec import Message, array, finite, message, require


@message()
class Aggregate(Message):
    """Every worker in ``participants`` sends its Contribution for ``round``."""

    round: int
    participants: list[str]
    reason: str


@message()
class Decision(Message):
    """Sync mode lazy: control's aggregation decision, published each time it is taken, with
    the figures behind it (``local_rounds``: worker -> local rounds since the last round)."""

    round: int
    aggregate: bool
    reason: str
    net_util: float
    failure_rate: float
    local_rounds: dict[str, Any]


@message()
class RoundReady(Message):
    """A worker's local progress towards round ``round``: ``steps`` local steps since its last
    contribution (sync mode every: sent once ``sync_every`` are done; lazy: after every local
    round of ``sync_every`` steps). ``idle``: it has nothing more to train for now."""

    round: int
    steps: int
    idle: bool


@message()
class RoundDrained(Message):
    """The feeder (sync mode round): every batch of round ``round`` is acknowledged."""

    round: int
    samples: int


@message()
class RoundDone(Message):
    """The aggregator combined round ``round`` and published the new weights."""

    round: int
    contributors: list[str]
    samples_by: list[int]  # samples each contributor trained for the round, in that order
    coefficient: float
    samples: int

    def check(self) -> None:
        require(len(self.samples_by) == len(self.contributors),
                "samples_by and contributors differ in length")


@message("dense_sync")
class WeightsRequest(Message):
    """A worker asks for the current global dense weights (at start, or when it missed some)."""


@message("dense_sync")
class Weights(Message):
    """Global dense weights after round ``round`` (and ``step`` gradient steps in mode step).
    ``generation`` counts restores from backup: weights of a newer generation replace a
    worker's weights outright."""

    round: int
    step: int
    generation: int
    params: np.ndarray = array("float32", 1)

    def require_finite(self) -> None:
        """The consumer's check (the worker, before it adopts them; not on decoding: the codec
        reads no large payload, see zbus.codec)."""
        require(finite(self.params), "non-finite weights")


@message("dense_sync")
class StepGrad(Message):
    """Sync mode step: one local dense gradient, averaged over ``coefficient`` sample weight."""

    coefficient: float
    grads: np.ndarray = array("float32", 1)

    def require_finite(self) -> None:
        """The consumer's check (the root aggregator, before it applies the step)."""
        require(finite(self.grads), "non-finite gradient")


@message("dense_sync")
class Contribution(Message):
    """A worker's share of round ``round``: its change of the dense weights since its last
    contribution (``delta``, empty when it trained nothing) and the sample weight behind it.
    ``done``: the worker leaves; it gets no further weights."""

    round: int
    coefficient: float
    samples: int
    done: bool
    delta: np.ndarray = array("float32", 1)

    def check(self) -> None:
        require(self.coefficient >= 0 and self.samples >= 0, "negative coefficient or samples")

    def require_finite(self) -> None:
        """The consumer's check (the aggregator, before it keeps the contribution)."""
        require(finite(self.delta), "non-finite delta")


@message("dense_sync")
class Partial(Message):
    """Hierarchical aggregation: a group aggregator's share of round ``round``, forwarded to the
    root: ``total`` = sum of coefficient x delta over its contributors, ``coefficient`` the sum
    of their coefficients (float64, so that the root's combination equals the flat one)."""

    round: int
    contributors: list[str]
    samples_by: list[int]
    done: list[str]
    coefficient: float
    samples: int
    total: np.ndarray = array("float64", 1)

    def check(self) -> None:
        require(len(self.samples_by) == len(self.contributors),
                "samples_by and contributors differ in length")
        require(self.coefficient >= 0 and self.samples >= 0, "negative coefficient or samples")

    def require_finite(self) -> None:
        """The consumer's check (the root aggregator, before it keeps the partial sum)."""
        require(finite(self.total), "non-finite partial sum")


@message()
class BackupNow(Message):
    """The aggregator writes a backup whatever the change (an operator asked)."""

    request: int


@message()
class BackupWritten(Message):
    """The aggregator wrote a backup of the dense weights after ``round`` (atomically)."""

    round: int
    path: str
    change: float  # relative change of the weights since the previous backup


@message()
class Restore(Message):
    """The aggregator restarted: it loads the backup at ``path`` and publishes it as round
    ``round`` under restore ``generation``; workers replace their dense weights with it."""

    generation: int
    round: int
    path: str


@message()
class Restored(Message):
    """The aggregator loaded the backup control named and published it as round ``round``."""

    generation: int
    round: int
