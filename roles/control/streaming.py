"""Control's part in a stream job (``StreamCourse``, docs/streams.md): when its one training pass
ends (``[train] until_events`` trained, by the feeders' progress reports, or ``until_s`` past
since training began: ``StreamEnd`` to the feeders, standing), and the stream's figures for the
summary from the feeders' scores (``StreamScores``: their lifetime histograms add up to the
job's progressive AUC and log loss) and their last counters.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np

from roles.algorithms.shared.metrics import ScoreHistogram, TaskScores
from roles.control.commands import Commands
from roles.job.settings import Job
from roles.job.summary import StreamFigures
from roles.protocol.datapath import FeederProgress
from roles.protocol.stream import StreamEnd, StreamScores

log = logging.getLogger(__name__)


class StreamCourse:
    def __init__(self, job: Job, commands: Commands):
        self.job, self.commands = job, commands
        self.began: float | None = None   # training began (monotonic)
        self.ended_by = ""
        self.scores: dict[str, StreamScores] = {}

    def trained_events(self, reported: dict[str, FeederProgress], epoch: int) -> int:
        return sum(sum(m.samples) for m in reported.values() if m.epoch == epoch)

    def tick(self, now: float, training: bool, epoch: int,
             reported: dict[str, FeederProgress]) -> None:
        """While the pass trains: end it once its limit is reached."""
        if not self.job.streaming or not training or self.ended_by:
            return
        if self.began is None:
            self.began = now
        t = self.job.train
        trained = self.trained_events(reported, epoch)
        if t.until_events and trained >= t.until_events:
            self.end(epoch, f"{trained} events trained ([train] until_events = "
                            f"{t.until_events})")
        elif t.until_s and now - self.began >= t.until_s:
            self.end(epoch, f"{now - self.began:.0f} s of training ([train] until_s = "
                            f"{t.until_s:g})")

    def end(self, epoch: int, reason: str) -> None:
        self.ended_by = reason
        log.info("the stream's pass ends: %s", reason)
        self.commands.publish(StreamEnd(epoch=epoch, reason=reason), "stream_end")

    def scored(self, node_id: str, m: StreamScores) -> None:
        self.scores[node_id] = m

    def summary(self, rows_repeated: int, feeder_restarted: bool) -> StreamFigures | None:
        """The stream's figures (None for a job that read files); ``rows_repeated``: the
        events of batches acknowledged more than once (the pass's report); after a feeder's
        restart the events trained twice are not known (docs/streams.md, exactly once)."""
        if not self.job.streaming:
            return None
        lifetime = ScoreHistogram()
        windows = []
        task_windows: dict[str, list[dict[str, Any]]] = {name: [] for name in self.job.tasks}
        each: TaskScores | None = None   # several labels: each one's lifetime
        for node_id, m in sorted(self.scores.items()):
            lifetime.merge(ScoreHistogram(m.histogram_counts(), m.loss_sum))
            windows += [{"feeder": node_id, **w} for w in m.windows]
            for name, closed in zip(self.job.tasks, m.task_windows, strict=False):
                task_windows[name] += [{"feeder": node_id, **w} for w in closed]
            got = m.task_histograms()
            if got is not None:
                counts, loss_sums, prob_sums = got
                theirs = TaskScores.of(counts, np.array(loss_sums), np.array(prob_sums))
                if each is None:
                    each = theirs
                else:
                    each.merge(theirs)
        scores = list(self.scores.values())
        # every feeder's, or the lag is not known (a feeder that never reported its end)
        known = len(scores) == self.job.cluster.feeders and all(
            m.lag_messages >= 0 for m in scores)
        return StreamFigures(
            events_read=sum(m.events_read for m in scores),
            events_trained=sum(m.events_trained for m in scores),
            events_trained_twice=None if feeder_restarted else rows_repeated,
            events_rejected=sum(m.events_rejected for m in scores),
            messages_acked=sum(m.messages_acked for m in scores),
            lag_events=sum(m.lag_events for m in scores) if known else None,
            lag_messages=sum(m.lag_messages for m in scores) if known else None,
            lag_s=max(m.lag_s for m in scores) if known else None,
            progressive_auc=_finite(lifetime.auc()) if lifetime.samples else None,
            progressive_logloss=_finite(lifetime.logloss()) if lifetime.samples else None,
            windows=windows, ended_by=self.ended_by,
            task_windows=task_windows if len(self.job.tasks) > 1 else None,
            tasks=None if each is None else {
                name: {k: _finite(v) for k, v in figures.items()}
                for name, figures in each.figures(self.job.tasks).items()},
            join=_added([m.join for m in scores]) if self.job.stream.labels.topic else None)


def _added(counts: list[dict]) -> dict[str, int]:
    """The feeders' join counts, added up key by key."""
    out: dict[str, int] = {}
    for c in counts:
        for k, v in c.items():
            if isinstance(v, int):
                out[k] = out.get(k, 0) + v
    return out


def _finite(x: float) -> float | None:
    """None for an AUC of one class only (NaN)."""
    return float(x) if math.isfinite(x) else None
