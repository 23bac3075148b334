"""A feeder's share of the statistics pass (``roles.data.stats``): its training parts, each
summarised from its first rows (every row when decay needs the data's newest time), a slice of
time at a time so that the feeder's loop, and its heartbeats, go on; what is done goes to
control as PartStats."""

from __future__ import annotations

import time

import numpy as np

from roles.data.index import Part
from roles.data.readers import Rejected
from roles.data.source import DataSource
from roles.data.stats import PartSummary
from roles.job.settings import DataConfig
from roles.protocol.datapath import PartStats


class StatisticsPass:
    def __init__(self, source: DataSource, data: DataConfig, dense: int):
        self.source, self.data, self.dense = source, data, dense
        self.todo: list[Part] = []
        self.sent: set[int] = set()
        self.sample = data.stats_rows
        self.shown: list[Rejected] = []   # rejected rows of a part beyond the limit

    def want(self, parts: list[Part], training_parts: int) -> None:
        """Summarise these training parts (``training_parts``: how many the data has; each
        gives its first stats_rows / training_parts rows)."""
        self.sample = -(-self.data.stats_rows // max(1, training_parts))
        known = self.sent | {p.number for p in self.todo}
        self.todo += [p for p in parts if p.number not in known]

    @property
    def pending(self) -> bool:
        return bool(self.todo)

    def run(self, until: float) -> PartStats | None:
        """Summarise parts until ``until`` (monotonic); the report of those done, if any."""
        done: list[PartSummary] = []
        first_bad = ""
        whole = self.data.decay_base > 1.0   # decay needs the newest time of every row
        while self.todo and time.monotonic() < until:
            part = self.todo.pop(0)
            rejected: list[Rejected] = []
            s = self.source.summary(part, self.data.log1p, self.sample, whole, rejected)
            if rejected and not first_bad:
                r = rejected[0]
                first_bad = f"{r.file}:{r.line}: {r.reason}"
            if s.rows_read and s.rejected > self.data.max_rejected_fraction * s.rows_read:
                self.shown += rejected  # the job will stop: every bad row read is shown
            done.append(s)
        if not done:
            return None
        self.sent.update(s.part for s in done)
        return PartStats(
            first_rejected=first_bad, parts=np.array([s.part for s in done], dtype=np.int64),
            counts=np.array([[s.rows_read, s.rows, s.rejected, int(s.complete),
                              -1 if s.newest is None else s.newest] for s in done],
                            dtype=np.int64),
            moments=np.array([[s.moments.count, s.moments.mean, s.moments.m2] for s in done],
                             dtype=np.float64).reshape(len(done), 3, self.dense))

    def clear(self) -> None:
        self.todo.clear()
