"""The eval rows a GAUC needs (``[metrics] group_by``), in bounded memory: each row's group
(the hashed key of the ``group_by`` field), labels and probabilities, for the groups kept. At
first every group is kept; past ``cap`` rows, only the groups whose hash's top bit is 0 (a
random half), then top two bits (a quarter), and so on. Every feeder keeps by the same hash, so
the groups kept hold all their rows, whichever feeder scored them, and the GAUC over them is
exact; ``share`` says which share of the groups that is. Rows whose group is ``missing`` (the
key of a missing value) belong to no group: they are left out."""

from __future__ import annotations

import numpy as np

from roles.algorithms.shared.metrics import group_auc
from roles.data.keyspace import splitmix64


class GroupScores:
    def __init__(self, tasks: int, cap: int, level: int = 0, missing: int | None = None):
        self.tasks, self.cap, self.level, self.missing = tasks, cap, level, missing
        self.groups = np.zeros(0, dtype=np.int64)
        self.labels = np.zeros((0, tasks), dtype=np.float32)
        self.probs = np.zeros((0, tasks), dtype=np.float32)
        self._chunks: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._rows = 0

    @property
    def share(self) -> float:
        """The share of the groups kept."""
        return 0.5 ** self.level

    def kept(self, groups: np.ndarray, level: int | None = None) -> np.ndarray:
        level = self.level if level is None else level
        if level == 0:
            return np.ones(len(groups), dtype=bool)
        top = splitmix64(np.asarray(groups).astype(np.uint64)) >> np.uint64(64 - level)
        return np.asarray(top == 0)

    def add(self, groups: np.ndarray, labels: np.ndarray, probs: np.ndarray) -> None:
        """A batch's rows: ``labels`` and ``probs`` ``[n]`` for one task, ``[n, tasks]``."""
        keep = self.kept(groups)
        if self.missing is not None:
            keep &= np.asarray(groups) != self.missing
        rows = int(keep.sum())
        if not rows:
            return
        self._chunks.append((np.asarray(groups, dtype=np.int64)[keep],
                             np.asarray(labels, np.float32).reshape(-1, self.tasks)[keep],
                             np.asarray(probs, np.float32).reshape(-1, self.tasks)[keep]))
        self._rows += rows
        while self._rows > self.cap:
            self._thin(self.level + 1)

    def _join(self) -> None:
        if self._chunks:
            self.groups, self.labels, self.probs = (
                np.concatenate([getattr(self, k)] + [c[i] for c in self._chunks])
                for i, k in enumerate(("groups", "labels", "probs")))
            self._chunks = []

    def _thin(self, level: int) -> None:
        self._join()
        keep = self.kept(self.groups, level)
        self.level = level
        self.groups, self.labels, self.probs = (self.groups[keep], self.labels[keep],
                                                self.probs[keep])
        self._rows = len(self.groups)

    def rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every row held: groups, labels ``[rows, tasks]``, probabilities."""
        self._join()
        return self.groups, self.labels, self.probs

    @classmethod
    def of(cls, tasks: int, cap: int, level: int, groups: np.ndarray, labels: np.ndarray,
           probs: np.ndarray) -> GroupScores:
        out = cls(tasks, cap, level)
        out.groups = np.asarray(groups, dtype=np.int64)
        out.labels = np.asarray(labels, np.float32).reshape(-1, tasks)
        out.probs = np.asarray(probs, np.float32).reshape(-1, tasks)
        out._rows = len(out.groups)
        return out

    def merge(self, other: GroupScores) -> None:
        """Another feeder's rows: both thinned to the smaller share (no cap: control)."""
        level = max(self.level, other.level)
        self._thin(level)
        groups, labels, probs = other.rows()
        keep = self.kept(groups, level)
        self._chunks.append((groups[keep], labels[keep], probs[keep]))
        self._rows += int(keep.sum())

    def gauc(self, task: int) -> tuple[float, int]:
        """Task ``task``'s GAUC over the rows that have its label, and the groups it
        averages."""
        groups, labels, probs = self.rows()
        present = ~np.isnan(labels[:, task])
        return group_auc(labels[present, task], probs[present, task], groups[present])
