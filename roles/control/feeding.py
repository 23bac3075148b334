"""Control's part in feeding the data (``[cluster] feeders``).

The data is cut into parts (``roles.data.index``). Feeder 0 indexes it and tells control
(DataIndex); once every node is ready, control assigns the parts to the feeders, consecutive
parts of about as many rows to each, training and eval parts alike, and publishes the PartMap
(standing). Each feeder summarises its training parts (PartStats); when every training part's
summary is in, control merges them into the dense transform and the newest time (DataStats,
standing: ``roles.data.stats``) and the first epoch can start. Batch ids carry the part, so
they stay unique.

A pass is done when the reports of every part are in: EpochTrained (samples, loss and how many
samples were trained once, more than once, not at all; what the pass made of the rows) and
EvalReport (score histograms, added up here into the epoch's AUC and logloss). The data's
figures in the summary (rows read, rejected, dropped, merged) are those of the first epoch's
training pass and of the first evaluation.

A feeder that dies (misses heartbeats) while others live has its parts handed to the live
feeder with the fewest: the new PartMap carries, per part, where the lost feeder had got to in
the training pass (from its last FeederProgress: every batch number below ``low`` and those in
``above`` acknowledged, with their samples and loss), and the new owner feeds the rest of the
pass under the same batch ids. Batches acknowledged after that report are fed again: the
shards refuse their second embedding update (same batch ids, counted in the summary's
``duplicates_refused.embedding_updates``) while the workers' dense networks train them twice.
An eval pass is scored again from its start.

When no other feeder lives (one feeder, the default), control waits ``recovery_timeout_s`` for
the feeder to be started again instead (not in sync mode round, whose rounds count one
feeder's batches). The new process resumes from its ack log (``roles.algorithms.feeding.ack_log``)
exactly: once it is ready, control publishes FeederBack; every worker sends it again its
latest acks and the batches the dead process granted it (Holding), and only then does the
feeder grant and send, so that no batch is lost and none is trained twice.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from roles.algorithms.control.membership import ALIVE, Members
from roles.algorithms.feeding.parts import assign_parts, estimated_files
from roles.algorithms.shared.grouped import GroupScores
from roles.algorithms.shared.metrics import TaskScores
from roles.control.commands import Commands, ProgressClock
from roles.data.stats import Moments
from roles.job.rundir import MetricsLog
from roles.job.settings import Job
from roles.job.summary import PartsFigures
from roles.protocol.datapath import DataIndex, DataStats, FeederProgress, PartMap, PartStats
from roles.protocol.lifecycle import EpochTrained, EvalReport, FeederBack
from zbus.codec import ProtocolError
from zbus.endpoints import node_index

log = logging.getLogger(__name__)
ROW_COUNTS = ("rows", "rows_once", "rows_repeated", "rows_missed")


@dataclass
class FeedingState:
    generation: int = 0                            # feeder restarts so far
    down: list[str] = field(default_factory=list)  # feeders waited for


@dataclass(frozen=True)
class EpochFigures:
    """The training pass of one epoch, from every part's report."""

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
        self.index: DataIndex | None = None
        self.data: dict = {}               # the data's figures, for the status and summary
        self.part_map: PartMap | None = None
        self.summaries: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # part -> counts, moments
        self.first_rejected = ""
        self.epoch_reports: dict[int, EpochTrained] = {}  # part -> the report covering it
        self.eval_reports: dict[int, EvalReport] = {}
        self.reported: dict[str, FeederProgress] = {}   # each feeder's latest progress
        self.lost: list[dict] = []
        self.down: dict[str, float] = {}   # feeder -> since when, waiting for its restart
        self.recoveries: list[dict] = []
        self.generation = 0
        self.rows_counted: list[dict] = []

    # -- start ------------------------------------------------------------------------------
    def indexed(self, m: DataIndex) -> None:
        """Feeder 0's index of the data."""
        if self.index is not None:
            return
        self.index = m
        train = m.parts[m.parts[:, 6] == 0]
        evaluation = m.parts[m.parts[:, 6] == 1]
        self.data = {"samples_in_data": m.n_train, "training_rows": m.n_train,
                     "rows_estimated": bool(estimated_files(m)),
                     "eval_samples": int(evaluation[:, 3].sum()), "rows_read": None,
                     "rejected_rows": None, "dropped_rows": None, "merged_rows": None,
                     "parts": len(m.parts), "training_parts": len(train),
                     "oracle_aucs": [None if a < 0 else a for a in m.oracle_aucs]}

    def training_feeders(self) -> set[str] | None:
        """The feeders that own a training part (None before the part map): only they count
        keys for placement's windows."""
        m = self.part_map
        if m is None:
            return None
        return {f"feeder-{int(f)}" for f in np.unique(m.owners[m.parts[:, 6] == 0])}

    def assign_parts(self) -> None:
        """Consecutive parts of about as many rows to each feeder, training and eval alike."""
        m = self.index
        assert m is not None, "the index comes first"
        n = self.job.cluster.feeders
        owners = np.zeros(len(m.parts), dtype=np.int32)
        for is_eval in (0, 1):
            rows = np.flatnonzero(m.parts[:, 6] == is_eval)
            owners[rows] = assign_parts(m.parts[rows, 3].tolist(), n)
        self.part_map = PartMap(version=0, n_train=m.n_train, resume={}, body=m.body,
                                parts=m.parts, owners=owners)
        self.metrics.write("parts", version=0, parts=len(m.parts),
                           per_feeder=np.bincount(owners, minlength=n).tolist())
        self.commands.publish(self.part_map, "parts")

    def stats_in(self, m: PartStats, now: float) -> DataStats | str | None:
        """A feeder's statistics of training parts; once every training part's are in, the
        data's statistics (published), or why the job cannot go on."""
        self.progress.touch(now)
        for i, part in enumerate(m.parts.tolist()):
            self.summaries[part] = (m.counts[i].copy(), m.moments[i].copy())
        if m.first_rejected and not self.first_rejected:
            self.first_rejected = m.first_rejected
        if self.part_map is None or self.commands.get("stats") is not None:
            return None
        if len(self.summaries) < int((self.part_map.parts[:, 6] == 0).sum()):
            return None
        counts = np.array([self.summaries[p][0] for p in sorted(self.summaries)])
        read, rejected = int(counts[:, 0].sum()), int(counts[:, 2].sum())
        limit = self.job.data.max_rejected_fraction
        if read and rejected > limit * read:
            return (f"{rejected} of the first {read} rows read rejected, more than "
                    f"max_rejected_fraction = {limit}; does the schema match the data? "
                    f"First: {self.first_rejected} (the rows are in rejected.tsv)")
        dense = len(self.job.dense_fields)
        moments = Moments.empty(dense)
        for p in sorted(self.summaries):
            c, mean, m2 = self.summaries[p][1]
            moments = moments.merge(Moments(c, mean, m2))
        transform = moments.transform(self.job.data.log1p)
        newest = int(counts[:, 4].max()) if len(counts) else -1
        stats = DataStats(log1p=transform.log1p, newest=newest, rows_read=read,
                          rejected=rejected, mean=transform.mean, std=transform.std)
        self.metrics.write("data_stats", rows_read=read, rejected=rejected, newest=newest,
                           complete=int(counts[:, 3].sum()), parts=len(counts))
        self.commands.publish(stats, "stats")
        return stats

    def new_epoch(self) -> None:
        self.epoch_reports, self.eval_reports = {}, {}

    # -- reports ----------------------------------------------------------------------------
    def progressed(self, node_id: str, m: FeederProgress) -> None:
        self.reported[node_id] = m

    def _collected(self, store: dict, m: EpochTrained | EvalReport,
                   now: float) -> list | None:
        """File a feeder's report of a pass under its parts; once every part of the pass (its
        training or its eval parts) has one, the distinct reports (and the store emptied),
        else None."""
        for part in m.parts:
            store[part] = m
        self.progress.touch(now)
        if self.part_map is None:
            return None
        wanted = int((self.part_map.parts[:, 6] == int(isinstance(m, EvalReport))).sum())
        if len(store) < wanted:
            return None
        reports = list({id(r): r for r in store.values()}.values())
        store.clear()
        return reports

    def trained(self, m: EpochTrained, now: float) -> EpochFigures | None:
        """A feeder's report of the training pass under way; the epoch's figures once every
        part has reported."""
        reports = self._collected(self.epoch_reports, m, now)
        if reports is None:
            return None
        weight_sum = sum(r.weight_sum for r in reports)
        rows = {k: sum(getattr(r, k) for r in reports) for k in ROW_COUNTS}
        self.rows_counted.append({"epoch": m.epoch, **rows})
        if self.data.get("rows_read") is None:  # the first training pass read every row
            for key, figure in (("rows_read", "rows_read"), ("rejected_rows", "rejected"),
                                ("dropped_rows", "dropped"), ("merged_rows", "merged")):
                self.data[key] = sum(getattr(r, figure) for r in reports)
            self.data["samples_in_data"] = rows["rows"]  # the samples an epoch trains
            self.data["training_rows"] = self.data["rows_read"]   # counted now, if estimated
            self.data["rows_estimated"] = False
        return EpochFigures(samples=sum(r.samples for r in reports),
                            loss=sum(r.loss_sum for r in reports) / weight_sum
                            if weight_sum else None,
                            seconds=round(max(r.seconds for r in reports), 3), rows=rows)

    def evaluated(self, m: EvalReport, now: float
                  ) -> tuple[TaskScores, GroupScores | None] | None:
        """A feeder's scores of the eval pass; every task's, added up, once every part's are
        in, and the GAUC's rows of every feeder (with ``[metrics] group_by``)."""
        tasks = len(self.job.tasks)
        if len(m.loss_sums) != tasks:   # (before it counts: nothing of it is kept)
            raise ProtocolError("inconsistent", f"scores of {len(m.loss_sums)} task(s) for a "
                                                f"job of {tasks}")
        reports = self._collected(self.eval_reports, m, now)
        if reports is None:
            return None
        scores = TaskScores(tasks)
        grouped = GroupScores(tasks, 0) if self.job.metrics.group_by else None
        for r in reports:
            scores.merge(TaskScores.of(r.counts, r.loss_sums, r.prob_sums, r.scored))
            if grouped is not None:
                grouped.merge(GroupScores.of(tasks, 0, r.group_level, r.groups, r.group_labels,
                                             r.group_probs))
        if not self.data.get("eval_counted"):
            self.data["eval_counted"] = True
            self.data["eval_samples"] = scores.rows
            self.data["rows_read"] = (self.data.get("rows_read") or 0) + \
                sum(r.rows_read for r in reports)
            self.data["rejected_rows"] = (self.data.get("rejected_rows") or 0) + \
                sum(r.rejected for r in reports)
        return scores, grouped

    # -- a lost feeder ----------------------------------------------------------------------
    def feeder_lost(self, node_id: str, reason: str, now: float, *, epoch: int, phase: str,
                    restarts: bool) -> bool:
        """Hand a lost feeder's parts to a live one, or, when none is left and the sync mode
        ``restarts`` feeders, wait for it to be started again; False when the job cannot go
        on without it."""
        lost = node_index(node_id)
        live = [n.index for n in self.members.nodes.values()
                if n.role == "feeder" and n.status == ALIVE and n.index != lost]
        m = self.part_map
        # a stream job's part stays its feeder's: the broker holds what it had not
        # acknowledged, for it (or the feeders left) to read again
        alone = not live or self.job.streaming
        if m is None or (alone and not restarts):
            return False
        self.members.fail(node_id, now, reason)
        if alone:
            log.warning("%s; waiting up to %.0f s for it to restart from its ack log", reason,
                        self.job.train.recovery_timeout_s)
            self.feeder_down(node_id, now, epoch=epoch, phase=phase)
            return True
        owners = m.owners.copy()
        moved = [int(p) for p in np.flatnonzero(owners == lost)]
        resume = {}
        for p in moved:
            heir = min(live, key=lambda f: (int((owners == f).sum()), f))
            owners[p] = heir
            resume[str(p)] = self.resume_point(node_id, p, epoch, phase)
        self.part_map = PartMap(version=m.version + 1, n_train=m.n_train, resume=resume,
                                body=m.body, parts=m.parts, owners=owners)
        record = {"feeder": node_id, "reason": reason, "parts": moved,
                  "to": [int(owners[p]) for p in moved], "epoch": epoch, "phase": phase,
                  "acked_batches": {s: r["low"] + len(r["above"]) for s, r in resume.items()}}
        self.lost.append(record)
        self.metrics.write("feeder_lost", **record)
        log.warning("%s; its part(s) %s go to feeder(s) %s", reason, moved, record["to"])
        self.commands.publish(self.part_map, "parts")
        return True

    def resume_point(self, node_id: str, part: int, epoch: int, phase: str) -> dict:
        """Where the training pass of ``epoch`` stands for a lost feeder's part."""
        reported = part in self.epoch_reports or phase != "training"
        point = {"epoch": epoch, "phase": phase, "reported": reported, "low": 0,
                 "above": [], "samples": 0, "loss_sum": 0.0, "weight_sum": 0.0}
        last = self.reported.get(node_id)
        progress = last.of(part) if last is not None and last.epoch == epoch else None
        if progress is not None:
            point.update(progress, epoch=epoch)
        return point

    def feeder_down(self, node_id: str, now: float, *, epoch: int, phase: str) -> None:
        if node_id not in self.down:
            self.down[node_id] = now
            self.metrics.write("feeder_down", node=node_id, epoch=epoch, phase=phase)

    def feeder_back(self, node_id: str, now: float, *, epoch: int, phase: str) -> None:
        """A restarted feeder is ready: the workers tell it what they hold."""
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
    def summary(self) -> PartsFigures | None:
        m = self.part_map
        if m is None:
            return None
        return {"version": m.version, "parts": len(m.parts),
                "per_feeder": np.bincount(m.owners, minlength=self.job.cluster.feeders)
                .tolist(), "owners": m.owners.tolist(), "feeders_lost": self.lost,
                "feeder_recoveries": self.recoveries, "rows_per_epoch": self.rows_counted}

    def to_state(self) -> FeedingState:
        return FeedingState(self.generation, sorted(self.down))

    def from_state(self, s: FeedingState, now: float) -> None:
        """A resumed control: the feeders still down are timed again from now; the parts and
        the statistics come back with the standing commands."""
        self.generation = s.generation
        self.down = dict.fromkeys(s.down, now)
        parts = self.commands.get("parts")
        self.part_map = parts if isinstance(parts, PartMap) else None

