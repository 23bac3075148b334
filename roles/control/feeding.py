"""Control's part in feeding the data (``[cluster] feeders``).

Every feeder loads the job's data (the split, the dense transform and the merging are those of
the whole data, as with one feeder) and reports its row counts; they must agree. Control then
cuts the training and the eval rows into one contiguous slice per feeder and publishes the
SliceMap (standing) before the first EpochStart: each feeder feeds only its slices, and a
feeder given no slice waits for one. Batch ids carry the slice, so they stay unique.

A pass is done when the reports of every slice are in: EpochTrained (samples, loss and how
many rows were trained once, more than once, not at all) and EvalReport (labels and scores,
joined here into the epoch's AUC and logloss).

A feeder that dies (misses heartbeats) while others live has its slices handed to the live
feeder with the fewest: the new SliceMap carries, per slice, where the lost feeder had got to
in the training pass (from its last FeederProgress: every seq below ``low`` and those in
``above`` acknowledged, with their samples and loss), and the new owner feeds the rest of the
pass under the same batch ids. Batches acknowledged after that report are fed again: the
shards refuse their second embedding update (same batch ids, counted in the summary's
``duplicates_refused.embedding_updates``) while the workers' dense networks train them twice;
the new owner's row counts see each row once. An eval pass is scored again from its start.

When no other feeder lives (one feeder, the default), control waits ``recovery_timeout_s`` for
the feeder to be started again instead (not in sync mode round, whose rounds count one
feeder's batches). The new process resumes from its ack log (``roles.algorithms.ack_log``)
exactly: once it has loaded the data, control publishes FeederBack; every worker sends it
again its latest acks and the batches the dead process granted it (Holding), and only then
does the feeder grant and send, so that no batch is lost and none is trained twice.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from roles.algorithms.batching import slice_ranges
from roles.algorithms.membership import ALIVE, Members
from roles.algorithms.metrics import auc, logloss
from roles.control.commands import Commands, ProgressClock
from roles.job.rundir import MetricsLog
from roles.job.settings import Job
from roles.protocol.datapath import FeederProgress, SliceMap
from roles.protocol.lifecycle import EpochTrained, EvalReport, FeederBack
from zbus.codec import ProtocolError
from zbus.endpoints import node_index

log = logging.getLogger(__name__)
DATA_COUNTS = ("samples_in_data", "eval_samples", "rows_read", "rejected_rows", "dropped_rows",
               "merged_rows")
ROW_COUNTS = ("rows", "rows_once", "rows_repeated", "rows_missed")


def info_count(info: dict, key: str) -> int:
    value = info.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ProtocolError("bad_field", f"Ready info {key!r} must be a count, got {value!r}")
    return value


@dataclass
class FeedingState:
    generation: int = 0                            # feeder restarts so far
    down: list[str] = field(default_factory=list)  # feeders waited for


@dataclass(frozen=True)
class EpochFigures:
    """The training pass of one epoch, from every slice's report."""

    samples: int
    loss: float | None
    seconds: float
    rows: dict[str, int]


class Feeding:
    def __init__(self, job: Job, members: Members, commands: Commands, metrics: MetricsLog,
                 progress: ProgressClock):
        self.job = job
        self.members = members
        self.commands = commands
        self.metrics = metrics
        self.progress = progress
        self.data: dict = {}
        self.slice_map: SliceMap | None = None
        self.epoch_reports: dict[int, EpochTrained] = {}  # slice -> the report covering it
        self.eval_reports: dict[int, EvalReport] = {}
        self.reported: dict[str, FeederProgress] = {}   # each feeder's latest progress
        self.lost: list[dict] = []
        self.down: dict[str, float] = {}   # feeder -> since when, waiting for its restart
        self.recoveries: list[dict] = []
        self.generation = 0
        self.rows_counted: list[dict] = []

    # -- start ------------------------------------------------------------------------------
    def ready(self, node_id: str, info: dict) -> str | None:
        """A feeder loaded the data: its counts, or why the job cannot go on."""
        figures = {k: info_count(info, k) for k in DATA_COUNTS}
        oracle = info.get("oracle_auc")
        figures["oracle_auc"] = oracle if isinstance(oracle, float) else None
        if not self.data:
            self.data = figures
            return None
        if any(figures[k] != self.data[k] for k in ("samples_in_data", "eval_samples")):
            return (f"{node_id} loaded {figures['samples_in_data']} training and "
                    f"{figures['eval_samples']} eval rows, another feeder "
                    f"{self.data['samples_in_data']} and {self.data['eval_samples']}: every "
                    "feeder must read the same data (same job file and data files)")
        return None

    def assign_slices(self) -> None:
        """One contiguous slice of the training and of the eval rows per feeder."""
        n = self.job.cluster.feeders
        train = slice_ranges(self.data["samples_in_data"], n)
        held_out = slice_ranges(self.data["eval_samples"], n)
        self.slice_map = SliceMap(version=0, train=train, eval=held_out,
                                  owners=list(range(n)), resume={})
        self.metrics.write("slices", version=0, train=train, eval=held_out,
                           owners=self.slice_map.owners)
        self.commands.publish(self.slice_map, "slices")

    def new_epoch(self) -> None:
        self.epoch_reports, self.eval_reports = {}, {}

    # -- reports ----------------------------------------------------------------------------
    def progressed(self, node_id: str, m: FeederProgress) -> None:
        self.reported[node_id] = m

    def _collected(self, store: dict, m: EpochTrained | EvalReport,
                   now: float) -> list | None:
        """File a feeder's report of a pass under its slices; once every slice has one, the
        distinct reports (and the store emptied), else None."""
        for s in m.slices:
            store[s] = m
        self.progress.touch(now)
        if self.slice_map is None or len(store) < len(self.slice_map.owners):
            return None
        reports = list({id(r): r for r in store.values()}.values())
        store.clear()
        return reports

    def trained(self, m: EpochTrained, now: float) -> EpochFigures | None:
        """A feeder's report of the training pass under way; the epoch's figures once every
        slice has reported."""
        reports = self._collected(self.epoch_reports, m, now)
        if reports is None:
            return None
        weight_sum = sum(r.weight_sum for r in reports)
        rows = {k: sum(getattr(r, k) for r in reports) for k in ROW_COUNTS}
        self.rows_counted.append({"epoch": m.epoch, **rows})
        return EpochFigures(samples=sum(r.samples for r in reports),
                            loss=sum(r.loss_sum for r in reports) / weight_sum
                            if weight_sum else None,
                            seconds=round(max(r.seconds for r in reports), 3), rows=rows)

    def evaluated(self, m: EvalReport, now: float) -> tuple[float, float, int] | None:
        """A feeder's scores of the eval pass; (AUC, logloss, samples) once every slice's are
        in."""
        reports = self._collected(self.eval_reports, m, now)
        if reports is None:
            return None
        labels = np.concatenate([r.labels for r in reports])
        preds = np.concatenate([r.preds for r in reports])
        return auc(labels, preds), logloss(labels, preds), len(labels)

    # -- a lost feeder ----------------------------------------------------------------------
    def feeder_lost(self, node_id: str, reason: str, now: float, *, epoch: int, phase: str,
                    restarts: bool) -> bool:
        """Hand a lost feeder's slices to a live one, or, when none is left and the sync mode
        ``restarts`` feeders, wait for it to be started again; False when the job cannot go
        on without it."""
        lost = node_index(node_id)
        live = [n.index for n in self.members.nodes.values()
                if n.role == "feeder" and n.status == ALIVE and n.index != lost]
        m = self.slice_map
        if m is None or (not live and not restarts):
            return False
        self.members.fail(node_id, now, reason)
        if not live:
            log.warning("%s; waiting up to %.0f s for it to restart from its ack log", reason,
                        self.job.train.recovery_timeout_s)
            self.feeder_down(node_id, now, epoch=epoch, phase=phase)
            return True
        owners = list(m.owners)
        moved = [s for s, owner in enumerate(owners) if owner == lost]
        resume = {}
        for s in moved:
            heir = min(live, key=lambda f: (owners.count(f), f))
            owners[s] = heir
            resume[str(s)] = self.resume_point(node_id, s, epoch, phase)
        self.slice_map = SliceMap(version=m.version + 1, train=m.train, eval=m.eval,
                                  owners=owners, resume=resume)
        record = {"feeder": node_id, "reason": reason, "slices": moved,
                  "to": [owners[s] for s in moved], "epoch": epoch, "phase": phase,
                  "acked_batches": {s: r["low"] + len(r["above"]) for s, r in resume.items()}}
        self.lost.append(record)
        self.metrics.write("feeder_lost", **record)
        log.warning("%s; its slice(s) %s go to feeder(s) %s", reason, moved,
                    [owners[s] for s in moved])
        self.commands.publish(self.slice_map, "slices")
        return True

    def resume_point(self, node_id: str, slice_: int, epoch: int, phase: str) -> dict:
        """Where the training pass of ``epoch`` stands for a lost feeder's slice."""
        reported = slice_ in self.epoch_reports or phase != "training"
        point = {"epoch": epoch, "phase": phase, "reported": reported, "low": 0,
                 "above": [], "samples": 0, "loss_sum": 0.0, "weight_sum": 0.0}
        last = self.reported.get(node_id)
        progress = last.of(slice_) if last is not None and last.epoch == epoch else None
        if progress is not None:
            point.update(progress, epoch=epoch)
        return point

    def feeder_down(self, node_id: str, now: float, *, epoch: int, phase: str) -> None:
        if node_id not in self.down:
            self.down[node_id] = now
            self.metrics.write("feeder_down", node=node_id, epoch=epoch, phase=phase)

    def feeder_back(self, node_id: str, now: float, *, epoch: int, phase: str) -> None:
        """A restarted feeder has loaded the data: the workers tell it what they hold."""
        lost_at = self.down.pop(node_id)
        self.generation += 1
        record = {"feeder": node_id, "down_s": round(now - lost_at, 3), "epoch": epoch,
                  "phase": phase}
        self.recoveries.append(record)
        self.metrics.write("feeder_back", **record)
        log.warning("%s is back after %.1f s: the workers send it what they hold", node_id,
                    record["down_s"])
        index = node_index(node_id)
        self.commands.publish(FeederBack(feeder=index, generation=self.generation),
                              f"feeder_back-{index}")

    # -- what the summary and a resumed control see -------------------------------------------
    def summary(self) -> dict | None:
        m = self.slice_map
        if m is None:
            return None
        return {"version": m.version, "train": m.train, "eval": m.eval, "owners": m.owners,
                "feeders_lost": self.lost, "feeder_recoveries": self.recoveries,
                "rows_per_epoch": self.rows_counted}

    def to_state(self) -> FeedingState:
        return FeedingState(self.generation, sorted(self.down))

    def from_state(self, s: FeedingState, now: float) -> None:
        """A resumed control: the feeders still down are timed again from now; the slices
        come back with the standing commands."""
        self.generation = s.generation
        self.down = dict.fromkeys(s.down, now)
        slices = self.commands.get("slices")
        self.slice_map = slices if isinstance(slices, SliceMap) else None
