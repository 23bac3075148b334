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
join's counts (``roles.feeder.joining``)."""

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
    bins: np.ndarray = array("int64", 1)
    counts: np.ndarray = array("int64", 1)

    def check(self) -> None:
        require(self.bins.shape == self.counts.shape, "one count per bin")
        require(not self.bins.size or bool(
            (self.bins >= 0).all() and (self.bins < BINS).all() and (self.counts > 0).all()),
            "bins out of range or counts not positive")
        require(isinstance(self.windows, list) and all(isinstance(w, dict)
                                                        for w in self.windows),
                "windows must be a list of objects")
        require(min(self.events_read, self.events_trained, self.events_rejected,
                    self.messages_acked) >= 0, "negative counts")

    def histogram_counts(self) -> np.ndarray:
        """The histogram's counts, [2, SCORE_BINS]."""
        counts = np.zeros(BINS, dtype=np.int64)
        counts[self.bins] = self.counts
        return counts.reshape(2, SCORE_BINS)
