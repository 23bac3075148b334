"""The job's course: epochs, evaluation, membership of the workers, exports, and the restart
of a shard or a feeder (control PUB -> every node; reports node -> control)."""

from __future__ import annotations

import numpy as np

from roles.protocol.datapath import MAX_TASKS
from zbus.codec import Message, array, finite, message, require


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
    """A feeder scored the eval rows of ``parts`` for ``epoch``: per task (``[data] labels``),
    their scores as a histogram of negatives and positives per score bin, the summed log loss
    and the summed probabilities (``roles.algorithms.shared.metrics.TaskScores``; control adds
    every feeder's up into the epoch's figures), and the rows read and rejected. ``counts``
    stacks the tasks' ``[2, bins]``. With ``[metrics] group_by``: the rows of the groups it
    kept (``roles.algorithms.shared.grouped``: the share ``0.5 ** group_level`` of them),
    their groups, labels and probabilities (``[rows, tasks]`` flattened); else none."""

    epoch: int
    parts: list[int]
    rows_read: int
    rejected: int
    scored: int          # eval rows scored (a task's histogram counts those with its label)
    group_level: int
    counts: np.ndarray = array("int64", 2)
    loss_sums: np.ndarray = array("float64", 1)
    prob_sums: np.ndarray = array("float64", 1)
    groups: np.ndarray = array("int64", 1)
    group_labels: np.ndarray = array("float32", 1)
    group_probs: np.ndarray = array("float32", 1)

    def check(self) -> None:
        tasks = len(self.loss_sums)
        require(1 <= tasks <= MAX_TASKS and self.prob_sums.shape == (tasks,),
                "one loss and one probability sum per task")
        require(self.counts.ndim == 2 and self.counts.shape[0] == 2 * tasks,
                "counts must be 2 x bins per task")
        require(not self.counts.size or int(self.counts.min()) >= 0, "negative counts")
        require(finite(self.loss_sums) and finite(self.prob_sums), "non-finite sums")
        require(0 <= self.group_level <= 63, "group_level out of range")
        require(self.group_labels.size == self.group_probs.size == self.groups.size * tasks,
                "one label and one probability per group row and task")


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
