"""A shard's work per allocation window, kept until control has recorded it (pure; no sockets).

The capacity predictor learns from every window's work on every shard
(``roles.algorithms.control.capacity``): for each operation, the key-value pairs and the CPU
seconds. A shard adds up its work per window (the window a batch's keys came in,
``BatchKeys.window``) and reports a window once it is *finished*: control has said that the window
is closed (every feeder has sent its batches of it and their counts) and no batch of it that the
shard holds still expects gradients. Finished windows go to control with each heartbeat
(``WindowWork``, at most ``MAX_WINDOWS_REPORTED`` at a time, oldest first) until control answers
that it has recorded them (``WorkRecorded``), however many windows close between two heartbeats.

Work for a window that control has recorded already (a batch sent again after its window was
reported) is counted as late and left out. A window that control says is closed but whose
batches this shard is only now working through (it lags behind the feeders) is not late: its
work is kept and reported like any other. At most ``kept`` windows are kept (control gone for
long): beyond that the oldest are dropped, and counted; the windows recorded are remembered
as far back as ``kept`` recorded windows.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from roles.protocol.placement import (
    MAX_WINDOWS_REPORTED,
    WORK_FIGURES,
    WORK_SLOTS,
    WindowWork,
    WorkRecorded,
)

WINDOWS_KEPT = 4096


class WindowLedger:
    def __init__(self, kept: int = WINDOWS_KEPT):
        self.kept = kept
        self.figures: dict[int, list[float]] = {}   # window -> WORK_SLOTS figures
        self.closed = -1            # control: every window up to this one is closed
        self.done: set[int] = set()  # windows control recorded (the newest ``kept`` of them)
        self.done_below = -1        # ... and every window up to this one
        self.late_pairs = 0
        self.dropped = 0            # windows dropped unreported (more than ``kept``)
        self.recorded = 0           # windows control has recorded

    def add(self, window: int, op: str, pairs: int, seconds: float) -> None:
        """Work of ``op`` (lookup or update) on a batch of ``window``."""
        figures = self.figures.get(window)
        if figures is None:
            if window <= self.done_below or window in self.done:  # a batch sent again
                self.late_pairs += pairs
                return
            figures = self.figures[window] = [0.0] * WORK_FIGURES
            while len(self.figures) > self.kept:
                del self.figures[min(self.figures)]
                self.dropped += 1
        pairs_at, seconds_at = WORK_SLOTS[op]
        figures[pairs_at] += pairs
        figures[seconds_at] += seconds

    def report(self, held: Counter[int]) -> WindowWork | None:
        """The finished windows (``held``: batches held per window that still expect
        gradients); None when there is none."""
        done = sorted(w for w in self.figures if w <= self.closed and not held.get(w))
        done = done[:MAX_WINDOWS_REPORTED]
        if not done and not self.figures:
            return None
        return WindowWork(late_pairs=self.late_pairs, windows=np.array(done, dtype=np.int64),
                          figures=np.array([self.figures[w] for w in done],
                                           dtype=np.float64).reshape(-1, WORK_FIGURES))

    def answered(self, msg: WorkRecorded) -> None:
        """Control recorded these windows (forget them), and says which are closed."""
        self.closed = max(self.closed, msg.closed)
        for w in msg.windows.tolist():
            if self.figures.pop(w, None) is not None:
                self.recorded += 1
            self.done.add(w)
        if len(self.done) > self.kept:  # forget the oldest: one sort, not a min() per window
            ordered = sorted(self.done)
            self.done_below = max(self.done_below, ordered[-self.kept - 1])
            self.done = set(ordered[-self.kept:])

    def counters(self) -> dict[str, int]:
        return {"windows_unrecorded": len(self.figures), "windows_recorded": self.recorded,
                "windows_dropped": self.dropped, "windows_late_pairs": self.late_pairs}
