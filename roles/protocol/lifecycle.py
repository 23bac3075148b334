"""The job's course: epochs, evaluation, membership of the workers, exports, and the restart
of a shard or a feeder (control PUB -> every node; reports node -> control)."""

from __future__ import annotations

import numpy as np

from zbus.codec import Message, array, message, require


@message()
class EpochStart(Message):
    epoch: int


@message()
class Membership(Message):
    """The live workers; ``version`` rises with every change (joined, left, failed)."""

    version: int
    workers: list[str]


@message()
class Evaluate(Message):
    """The feeder sends the eval split; workers evaluate with weights of ``round`` or later."""

    epoch: int
    round: int


@message()
class EpochTrained(Message):
    """A feeder: every training batch of ``slices`` of ``epoch`` is acknowledged. ``rows``:
    the rows of its slices; ``rows_once`` / ``rows_repeated`` / ``rows_missed``: how many of them
    were trained exactly once, more than once, not at all (counted from the acks)."""

    epoch: int
    samples: int
    batches: int
    loss_sum: float
    weight_sum: float
    seconds: float
    slices: list[int]
    rows: int
    rows_once: int
    rows_repeated: int
    rows_missed: int


@message()
class EvalReport(Message):
    """A feeder scored the eval rows of ``slices`` for ``epoch``: their labels and predictions
    (control joins every feeder's into the epoch's AUC and logloss)."""

    epoch: int
    slices: list[int]
    labels: np.ndarray = array("float32", 1)
    preds: np.ndarray = array("float32", 1)

    def check(self) -> None:
        require(self.labels.shape == self.preds.shape, "labels and preds differ in length")


@message()
class Export(Message):
    """Write the model into ``dir``: the aggregator the dense weights, each shard its
    embeddings, the feeder the dense transform; each answers Exported."""

    request: int
    dir: str


@message()
class Exported(Message):
    """A node wrote its part of export ``request`` (file names relative to the export dir)."""

    request: int
    part: str
    files: list[str]


@message()
class ShardBack(Message):
    """Shard ``shard`` was restarted from its checkpoint (standing; ``generation`` counts
    restarts): feeders send it the keys of their batches in flight again, workers their
    look-ups that it has not answered."""

    shard: int
    generation: int


@message()
class FeederBack(Message):
    """Feeder ``feeder`` was started again and has loaded the data (standing; ``generation``
    counts restarts): every worker sends it again its latest acks to that feeder (one may have
    been lost with the dead process) and then Holding."""

    feeder: int
    generation: int
