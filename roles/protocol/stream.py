"""A stream job's course (docs/streams.md): control's word that the stream ends, and each
feeder's scores of progressive validation at the end of its pass."""

from __future__ import annotations

from typing import Any

import numpy as np

from zbus.codec import Message, array, message, require

SCORE_BINS = 1 << 16   # ScoreHistogram.BINS (roles.algorithms.shared.metrics; a test pins it)
BINS = 2 * SCORE_BINS   # a lifetime histogram's cells (negatives, then positives)


@message()
class StreamEnd(Message):
    """Control: the training pass of ``epoch`` takes no more events (``[train] until_events``
    trained, ``until_s`` past): each feeder sends what it holds and reports the pass
    (standing)."""

    epoch: int
    reason: str


@message()
class StreamScores(Message):
    """A feeder's progressive validation at the end of its pass: its lifetime score histogram
    (``ScoreHistogram``'s counts, flattened, only the cells ``bins`` that are not zero), log
    loss sum, its closed windows (``Window.as_dict``, the newest kept), its counts, its lag
as the pass ends (-1: the broker did not say), and with labels on a topic of their own the
join's counts (``roles.feeder.joining``). With several labels (``[data] labels``) each label's
lifetime histogram too: ``task_bins`` index the cells of every task's histogram stacked
(``tasks × BINS``), with each task's summed log loss and probabilities, and each task's closed
windows, as ``windows`` (none: one label)."""

    events_read: int
    events_trained: int
    events_rejected: int
    messages_acked: int
    lag_messages: int
    lag_events: int
    lag_s: float
    loss_sum: float
    windows: list[dict[str, Any]]
    join: dict[str, Any]   # the label join's counts ({}: labels came with the events)
    task_loss_sums: list[float]
    task_prob_sums: list[float]
    task_windows: list[list[dict[str, Any]]]
    bins: np.ndarray = array("int64", 1)
    counts: np.ndarray = array("int64", 1)
    task_bins: np.ndarray = array("int64", 1)
    task_counts: np.ndarray = array("int64", 1)

    def check(self) -> None:
        require(self.bins.shape == self.counts.shape, "one count per bin")
        tasks = len(self.task_loss_sums)
        require(len(self.task_prob_sums) == tasks <= 64
                and self.task_bins.shape == self.task_counts.shape
                and (tasks > 0 or not self.task_bins.size), "one count per task bin")
        require(not self.task_bins.size or bool(
            (self.task_bins >= 0).all() and (self.task_bins < tasks * BINS).all()
            and (self.task_counts > 0).all()), "task bins out of range or counts not positive")
        require(not self.bins.size or bool(
            (self.bins >= 0).all() and (self.bins < BINS).all() and (self.counts > 0).all()),
            "bins out of range or counts not positive")
        require(isinstance(self.windows, list) and all(isinstance(w, dict)
                                                        for w in self.windows),
                "windows must be a list of objects")
        require(isinstance(self.task_windows, list) and len(self.task_windows) in (0, tasks)
                and all(isinstance(ws, list) and all(isinstance(w, dict) for w in ws)
                        for ws in self.task_windows),
                "task_windows must be one list of objects per task")
        require(min(self.events_read, self.events_trained, self.events_rejected,
                    self.messages_acked) >= 0, "negative counts")

    def task_histograms(self) -> tuple[np.ndarray, list[float], list[float]] | None:
        """Each task's histogram counts (``[tasks, 2, SCORE_BINS]``), summed log losses and
        probabilities; None with one label."""
        tasks = len(self.task_loss_sums)
        if not tasks:
            return None
        counts = np.zeros(tasks * BINS, dtype=np.int64)
        counts[self.task_bins] = self.task_counts
        return counts.reshape(tasks, 2, SCORE_BINS), self.task_loss_sums, self.task_prob_sums

    def histogram_counts(self) -> np.ndarray:
        """The histogram's counts, [2, SCORE_BINS]."""
        counts = np.zeros(BINS, dtype=np.int64)
        counts[self.bins] = self.counts
        return counts.reshape(2, SCORE_BINS)
