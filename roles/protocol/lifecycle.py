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
    """A feeder: every training batch of ``parts`` of ``epoch`` is acknowledged. ``rows``: the
    samples its parts made; ``rows_once`` / ``rows_repeated`` / ``rows_missed``: how many of
    them were trained exactly once, more than once, not at all (counted per batch from the
    acks); ``rows_read`` / ``rejected`` / ``dropped`` / ``merged``: what this pass made of the
    parts' rows (``roles.data.stream``)."""

    epoch: int
    samples: int
    batches: int
    loss_sum: float
    weight_sum: float
    seconds: float
    parts: list[int]
    rows: int
    rows_once: int
    rows_repeated: int
    rows_missed: int
    rows_read: int
    rejected: int
    dropped: int
    merged: int


@message()
class EvalReport(Message):
    """A feeder scored the eval rows of ``parts`` for ``epoch``: their scores as a histogram
    of negatives and positives per score bin and the summed log loss
    (``roles.algorithms.shared.metrics.ScoreHistogram``; control adds every feeder's up into the
    epoch's AUC and logloss), and the rows read and rejected."""

    epoch: int
    parts: list[int]
    loss_sum: float
    rows_read: int
    rejected: int
    counts: np.ndarray = array("int64", 2)

    def check(self) -> None:
        require(self.counts.ndim == 2 and self.counts.shape[0] == 2, "counts must be 2 x bins")
        require(not self.counts.size or int(self.counts.min()) >= 0, "negative counts")


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


@message()
class NetworkWanted(Message):
    """A node whose job names a network file (``[model] module = "file.py:factory"``) that is
    not on its host asks control for it, before it starts (``roles.job.network_file``);
    ``path``: where its job looked, for control's log."""

    path: str


@message()
class NetworkFile(Message):
    """Control's answer to NetworkWanted: the job's network file as control read it at the
    start, its file ``name`` and the ``sha256`` of ``source``; or, ``source`` empty, ``reason``
    why not."""

    name: str
    sha256: str
    reason: str
    source: np.ndarray = array("uint8", 1)

    def check(self) -> None:
        require(bool(self.reason) or (len(self.sha256) == 64 and plain_name(self.name)),
                "a network file needs its name (no directory) and sha256, or a reason")


def plain_name(name: str) -> bool:
    """A file's name alone: no directory, nothing a path would read otherwise."""
    return bool(name) and name not in (".", "..") and not set(name) & {"/", "\\", "\0"}
