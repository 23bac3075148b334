"""Progressive validation of a stream job (test-then-train): each event is scored by the model
as it is when the event comes, before the event is trained on; those scores, in the order
events are trained, give the job's lifetime AUC and log loss and those of each window of
``window_events`` events (``[stream] window_events``). A window holds exactly that many events
(a batch that crosses a boundary is split there); at most ``keep`` closed windows are held
(the newest), each with the event times it spans.

Bounded memory: two score histograms (``ScoreHistogram``, the closed windows' and the open
window's; the lifetime's is their sum, made when read) and the windows kept, whatever the
length of the stream. Each event is added to one histogram only (a stream feeder adds every
event it trains: ``scripts/bench_metrics.py``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from roles.algorithms.shared.metrics import ScoreHistogram, TaskScores


@dataclass(frozen=True)
class Window:
    index: int          # 0 for the first window of the job
    events: int
    auc: float
    logloss: float
    positives: int
    first_time_s: float  # event times, the window's oldest and newest
    last_time_s: float

    def as_dict(self) -> dict[str, float | int]:
        return {"window": self.index, "events": self.events, "auc": self.auc,
                "logloss": self.logloss, "positives": self.positives,
                "first_time_s": self.first_time_s, "last_time_s": self.last_time_s}


class Progressive:
    def __init__(self, window_events: int = 10_000, keep: int = 1000):
        if window_events < 1:
            raise ValueError(f"[stream] window_events must be at least 1, got {window_events}")
        self.window_events, self.keep = window_events, keep
        self.before = ScoreHistogram()   # every closed window's scores
        self.open = ScoreHistogram()
        self.open_times = (np.inf, -np.inf)
        self.windows: deque[Window] = deque(maxlen=keep)
        self.closed = 0   # windows closed since the start (more than ``keep`` may have been)

    @property
    def events(self) -> int:
        return self.before.samples + self.open.samples

    @property
    def lifetime(self) -> ScoreHistogram:
        """Every event's scores (a new histogram: the closed windows' and the open one's)."""
        every = ScoreHistogram(self.before.counts + self.open.counts, self.before.loss_sum,
                               self.before.prob_sum)
        every.loss_sum += self.open.loss_sum
        every.prob_sum += self.open.prob_sum
        return every

    def add(self, labels: np.ndarray, probs: np.ndarray,
            times: np.ndarray | None = None) -> list[Window]:
        """Scores of events just trained, in the order trained: the windows they closed."""
        labels = np.asarray(labels, dtype=np.float64).ravel()
        probs = np.asarray(probs, dtype=np.float64).ravel()
        times = np.zeros(len(labels)) if times is None else \
            np.asarray(times, dtype=np.float64).ravel()
        closed = []
        at = 0
        while at < len(labels):
            room = self.window_events - self.open.samples
            part = slice(at, min(len(labels), at + room))
            self.open.add(labels[part], probs[part])
            if part.stop > part.start:
                t = times[part]
                self.open_times = (min(self.open_times[0], float(t.min())),
                                   max(self.open_times[1], float(t.max())))
            at = part.stop
            if self.open.samples == self.window_events:
                closed.append(self._close())
        return closed

    def _close(self) -> Window:
        w = Window(self.closed, self.open.samples, self.open.auc(), self.open.logloss(),
                   int(self.open.counts[1].sum()), *self.open_times)
        self.windows.append(w)
        self.closed += 1
        self.before.merge(self.open)
        self.open = ScoreHistogram()
        self.open_times = (np.inf, -np.inf)
        return w

    def summary(self) -> dict[str, object]:
        """``progressive_auc``, ``progressive_logloss`` (lifetime), ``events_scored``,
        ``windows`` (those kept, oldest first) and ``windows_closed``."""
        every = self.lifetime
        return {"progressive_auc": every.auc(), "progressive_logloss": every.logloss(),
                "events_scored": self.events, "windows_closed": self.closed,
                "windows": [w.as_dict() for w in self.windows]}


class StreamProgress:
    """A stream job's progressive validation of ``tasks`` labels: the first label's windows
    and lifetime (``first``: the job's ``progressive_auc``, its windows and the console's
    chart), and with several labels every label's lifetime figures (``each``: AUC, log loss,
    NE, calibration) and windows (``by_task``; the first's is ``first``), each over the events
    that have that label; a missing label (NaN) masks its task for the event."""

    def __init__(self, tasks: int, window_events: int):
        self.first = Progressive(window_events)
        self.each = TaskScores(tasks) if tasks > 1 else None
        self.by_task = [self.first, *(Progressive(window_events) for _ in range(tasks - 1))]

    def add(self, labels: np.ndarray, probs: np.ndarray, times: np.ndarray) -> None:
        """The scores of a batch's events (``[n]``, or ``[n, tasks]`` flattened or not)."""
        if self.each is None:
            self.first.add(labels, probs, times)
            return
        tasks = self.each.tasks
        labels = np.asarray(labels, dtype=np.float32).reshape(-1, tasks)
        probs = np.asarray(probs, dtype=np.float32).reshape(-1, tasks)
        times = np.asarray(times, dtype=np.float64)
        for t, progressive in enumerate(self.by_task):
            present = ~np.isnan(labels[:, t])
            progressive.add(labels[present, t], probs[present, t], times[present])
        self.each.add(labels, probs)

    def task_windows(self) -> list[list[dict[str, float | int]]]:
        """With several labels, each one's closed windows (kept), in the tasks' order; none
        with one label (its windows are ``first``'s)."""
        if self.each is None:
            return []
        return [[w.as_dict() for w in p.windows] for p in self.by_task]

    def tasks(self, names: list[str]) -> dict[str, dict[str, float]]:
        """Each label's lifetime figures by name (one label: the first's)."""
        if self.each is None:
            return {names[0]: self.first.lifetime.figures()}
        return self.each.figures(names)
