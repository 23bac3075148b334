"""Control's part in feeding the data (``[cluster] feeders``), mixed into Control.

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
in the training pass (from its last heartbeat: every seq below ``low`` and those in ``above``
acknowledged, with their samples and loss), and the
new owner feeds the rest of the pass under the same batch ids. Batches acknowledged after that
heartbeat are fed again: the shards refuse their second embedding update (same batch ids,
counted in the summary's ``duplicates_refused.embedding_updates``) while the workers' dense
networks train them twice; the new owner's row counts see each row once. An eval pass is
scored again from its start.

When no other feeder lives (one feeder, the default), control waits ``recovery_timeout_s`` for
the feeder to be started again instead (not in sync mode round, whose rounds count one
feeder's batches). The new process resumes from its ack log (``roles.algorithms.ack_log``) exactly:
once it has loaded the data, control publishes FeederBack; every worker sends it again its latest
acks and the batches the dead process granted it (Holding), and only then does the feeder
grant and send, so that no batch is lost and none is trained twice.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from roles.algorithms.batching import slice_ranges
from roles.algorithms.membership import ALIVE
from roles.algorithms.metrics import auc, logloss
from roles.protocol.datapath import SliceMap
from roles.protocol.lifecycle import EpochTrained, EvalReport, FeederBack
from zbus.codec import ProtocolError

log = logging.getLogger(__name__)
DATA_COUNTS = ("samples_in_data", "eval_samples", "rows_read", "rejected_rows", "dropped_rows",
               "merged_rows")


def info_count(info: dict, key: str) -> int:
    value = info.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ProtocolError("bad_field", f"Ready info {key!r} must be a count, got {value!r}")
    return value


class FeedingKeeping:
    def init_feeding(self) -> None:
        self.slice_map: SliceMap | None = None
        self.epoch_reports: dict[int, EpochTrained] = {}  # slice -> the report covering it
        self.eval_reports: dict[int, EvalReport] = {}
        self.feeders_lost: list[dict] = []
        self.feeders_down: dict[str, float] = {}  # feeder -> since when, waiting for restart
        self.feeder_recoveries: list[dict] = []
        self.feeder_generation = 0
        self.rows_counted: list[dict] = []

    def feeder_ready(self, node_id: str, info: dict) -> None:
        figures = {k: info_count(info, k) for k in DATA_COUNTS}
        oracle = info.get("oracle_auc")
        figures["oracle_auc"] = oracle if isinstance(oracle, float) else None
        if not self.data:
            self.data = figures
            return
        split = ("samples_in_data", "eval_samples")
        if any(figures[k] != self.data[k] for k in split):
            self.fail(f"{node_id} loaded {figures['samples_in_data']} training and "
                      f"{figures['eval_samples']} eval rows, another feeder "
                      f"{self.data['samples_in_data']} and {self.data['eval_samples']}: every "
                      "feeder must read the same data (same job file and data files)")

    def assign_slices(self) -> None:
        """One contiguous slice of the training and of the eval rows per feeder."""
        n = self.job.cluster.feeders
        train = slice_ranges(self.data["samples_in_data"], n)
        held_out = slice_ranges(self.data["eval_samples"], n)
        self.slice_map = SliceMap(version=0, train=train, eval=held_out,
                                  owners=list(range(n)), resume={})
        self.metrics.write("slices", version=0, train=train, eval=held_out,
                           owners=self.slice_map.owners)
        self.publish(self.slice_map, "slices")

    def slices_summary(self) -> dict | None:
        m = self.slice_map
        if m is None:
            return None
        return {"version": m.version, "train": m.train, "eval": m.eval, "owners": m.owners,
                "feeders_lost": self.feeders_lost, "feeder_recoveries": self.feeder_recoveries,
                "rows_per_epoch": self.rows_counted}

    # -- reports -----------------------------------------------------------------------------
    def collected(self, store: dict, phase: str, m: EpochTrained | EvalReport) -> list | None:
        """File a feeder's report of a pass under its slices; once every slice has one, the
        distinct reports (and the store emptied), else None."""
        if self.phase != phase or m.epoch != self.epoch:
            return None
        for s in m.slices:
            store[s] = m
        self.last_progress = time.monotonic()
        if len(store) < len(self.slice_map.owners):
            return None
        reports = list({id(r): r for r in store.values()}.values())
        store.clear()
        return reports

    def handle_epoch_trained(self, m: EpochTrained) -> None:
        reports = self.collected(self.epoch_reports, "training", m)
        if reports is None:
            return
        samples = sum(r.samples for r in reports)
        loss_sum = sum(r.loss_sum for r in reports)
        weight_sum = sum(r.weight_sum for r in reports)
        rows = {k: sum(getattr(r, k) for r in reports)
                for k in ("rows", "rows_once", "rows_repeated", "rows_missed")}
        self.rows_counted.append({"epoch": m.epoch, **rows})
        self.epochs.append({"epoch": m.epoch, "train_samples": samples,
                            "train_loss": loss_sum / weight_sum if weight_sum else None,
                            "train_s": round(max(r.seconds for r in reports), 3), **rows})
        self.phase = "syncing"
        self.sync_for_eval()

    def handle_eval(self, m: EvalReport) -> None:
        reports = self.collected(self.eval_reports, "evaluating", m)
        if reports is None:
            return
        labels = np.concatenate([r.labels for r in reports])
        preds = np.concatenate([r.preds for r in reports])
        self.epoch_evaluated(m.epoch, auc(labels, preds), logloss(labels, preds), len(labels))

    # -- a lost feeder -----------------------------------------------------------------------
    def feeder_lost(self, node_id: str, reason: str) -> bool:
        """Hand a lost feeder's slices to a live one, or, when none is left, wait for it to be
        started again; False when the job cannot go on without it."""
        lost = int(node_id.rsplit("-", 1)[1])
        live = [n.index for n in self.members.nodes.values()
                if n.role == "feeder" and n.status == ALIVE and n.index != lost]
        m = self.slice_map
        if m is None or (not live and self.job.train.sync == "round"):
            return False
        if not live:
            log.warning("%s; waiting up to %.0f s for it to restart from its ack log", reason,
                        self.job.train.recovery_timeout_s)
            self.members.fail(node_id, time.monotonic(), reason)
            self.feeder_down(node_id)
            return True
        self.members.fail(node_id, time.monotonic(), reason)
        owners = list(m.owners)
        moved = [s for s, owner in enumerate(owners) if owner == lost]
        progress = self.members.nodes[node_id].counters.get("slices")
        progress = progress if isinstance(progress, dict) else {}
        resume = {}
        for s in moved:
            heir = min(live, key=lambda f: (owners.count(f), f))
            owners[s] = heir
            resume[str(s)] = self.resume_point(s, progress.get(str(s)))
        self.slice_map = SliceMap(version=m.version + 1, train=m.train, eval=m.eval,
                                  owners=owners, resume=resume)
        record = {"feeder": node_id, "reason": reason, "slices": moved,
                  "to": [owners[s] for s in moved], "epoch": self.epoch, "phase": self.phase,
                  "acked_batches": {s: r["low"] + len(r["above"]) for s, r in resume.items()}}
        self.feeders_lost.append(record)
        self.metrics.write("feeder_lost", **record)
        log.warning("%s; its slice(s) %s go to feeder(s) %s", reason, moved,
                    [owners[s] for s in moved])
        self.publish(self.slice_map, "slices")
        return True

    def feeder_down(self, node_id: str) -> None:
        if node_id not in self.feeders_down:
            self.feeders_down[node_id] = time.monotonic()
            self.metrics.write("feeder_down", node=node_id, epoch=self.epoch, phase=self.phase)

    def feeder_back(self, node_id: str) -> None:
        """A restarted feeder has loaded the data: the workers tell it what they hold."""
        lost_at = self.feeders_down.pop(node_id)
        self.feeder_generation += 1
        record = {"feeder": node_id, "down_s": round(time.monotonic() - lost_at, 3),
                  "epoch": self.epoch, "phase": self.phase}
        self.feeder_recoveries.append(record)
        self.metrics.write("feeder_back", **record)
        log.warning("%s is back after %.1f s: the workers send it what they hold", node_id,
                    record["down_s"])
        index = int(node_id.rsplit("-", 1)[1])
        self.publish(FeederBack(feeder=index, generation=self.feeder_generation),
                     f"feeder_back-{index}")

    def resume_point(self, slice_: int, progress: dict | None) -> dict:
        """Where the training pass of the current epoch stands for a lost feeder's slice."""
        reported = slice_ in self.epoch_reports or self.phase != "training"
        point = {"epoch": self.epoch, "phase": self.phase, "reported": reported, "low": 0,
                 "above": [], "samples": 0, "loss_sum": 0.0, "weight_sum": 0.0}
        if isinstance(progress, dict) and progress.get("epoch") == self.epoch:
            low, above = progress.get("low"), progress.get("above")
            if isinstance(low, int) and isinstance(above, list) \
                    and all(isinstance(a, int) for a in above):
                point["low"], point["above"] = low, above
            for key in ("samples", "loss_sum", "weight_sum"):
                if isinstance(progress.get(key), (int, float)):
                    point[key] = progress[key]
        return point
