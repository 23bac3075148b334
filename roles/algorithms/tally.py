"""What a feeder's acknowledged batches add up to (pure; no sockets).

Over the job: batches, samples, loss and weight sums (the console's loss curve) and samples per
worker; a feeder restarted on its ack log (``roles.algorithms.ack_log``) starts from there. Over
the training pass under way: its samples and loss (the EpochTrained report), how often each
training row was trained, and per slice how far the pass has got (SliceProgress; the
FeederProgress control hears with every heartbeat, and hands a lost feeder's slice on from).
Over an evaluation pass: the scores of its rows (the EvalReport).
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from roles.algorithms.batching import Pass, Plan, SliceProgress
from roles.protocol.datapath import FeederProgress, split_batch_id
from roles.protocol.lifecycle import EpochTrained, EvalReport


class FeederTally:
    def __init__(self, n_train: int = 0) -> None:
        self.n_train = n_train          # training rows come first in the data, then eval rows
        self.batches_acked = 0          # training and eval, over the job
        self.samples_acked = 0          # training, over the job
        self.train_loss_sum = 0.0
        self.train_weight_sum = 0.0
        self.acked_by: Counter[str] = Counter()
        self.epoch = -1                 # the epoch of the training pass (and its progress)
        self.epoch_samples = 0
        self.loss_sum = 0.0
        self.weight_sum = 0.0
        self.row_acks = np.zeros(0, dtype=np.uint16)  # per training row: acks in this epoch
        self.progress: dict[int, SliceProgress] = {}
        self.preds = np.zeros(0, dtype=np.float32)   # per eval row: its score in this pass

    def restore(self, records: np.ndarray, samples_by_worker: dict[str, int]) -> None:
        """The job-wide figures of a feeder's previous process, from its ack log records."""
        self.batches_acked = len(records)
        self.samples_acked = int(records["samples"].sum())
        self.train_loss_sum = float(records["loss_sum"].sum())
        self.train_weight_sum = float(records["weight_sum"].sum())
        self.acked_by.update(samples_by_worker)

    def new_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.row_acks = np.zeros(self.n_train, dtype=np.uint16)
        self.progress = {}

    def new_pass(self) -> None:
        self.loss_sum = self.weight_sum = 0.0
        self.epoch_samples = 0

    def slice_planned(self, plan: Plan, progress: SliceProgress) -> int | None:
        """The slice's pass starts from ``progress`` (what was acknowledged before, by this
        feeder's previous process or by a lost feeder): its batches are skipped and counted.
        Returns how many there are (None: the pass starts afresh)."""
        self.progress[plan.slice] = progress
        if not (progress.low or progress.above):
            return None
        plan.resume(progress.low, sorted(progress.above))
        self.epoch_samples += progress.samples
        self.loss_sum += progress.loss_sum
        self.weight_sum += progress.weight_sum
        done = [i for i in range(plan.batches) if progress.done(i)]
        for i in done:
            self.row_acks[plan.batch_rows(i)] += 1
        return len(done)

    def new_evaluation(self, eval_rows: int) -> None:
        self.preds = np.full(eval_rows, np.nan, dtype=np.float32)

    def eval_acked(self, rows: np.ndarray, preds: np.ndarray) -> None:
        self.batches_acked += 1
        self.preds[rows - self.n_train] = preds

    def train_acked(self, worker: str, batch_id: int, rows: np.ndarray, samples: int,
                    loss_sum: float, weight_sum: float) -> None:
        self.batches_acked += 1
        self.loss_sum += loss_sum
        self.weight_sum += weight_sum
        self.train_loss_sum += loss_sum
        self.train_weight_sum += weight_sum
        self.epoch_samples += samples
        self.samples_acked += samples
        self.acked_by[worker] += samples
        if len(self.row_acks):
            self.row_acks[rows] += 1
        _, slice_, seq = split_batch_id(batch_id)
        progress = self.progress.get(slice_)
        if progress is not None:
            progress.acked(seq, samples, loss_sum, weight_sum)

    def epoch_trained(self, pass_: Pass, seconds: float) -> EpochTrained:
        """The report of a finished training pass."""
        counts = self.row_acks[pass_.rows()]
        return EpochTrained(
            epoch=pass_.epoch, samples=self.epoch_samples, batches=pass_.batches,
            loss_sum=self.loss_sum, weight_sum=self.weight_sum, seconds=seconds,
            slices=[p.slice for p in pass_.plans], rows=len(counts),
            rows_once=int((counts == 1).sum()), rows_repeated=int((counts > 1).sum()),
            rows_missed=int((counts == 0).sum()))

    def eval_report(self, pass_: Pass, labels: np.ndarray) -> EvalReport:
        """The scores of a finished evaluation pass (``labels``: the data's)."""
        rows = pass_.rows() - self.n_train
        return EvalReport(epoch=pass_.epoch, slices=[p.slice for p in pass_.plans],
                          labels=labels[self.n_train + rows], preds=self.preds[rows])

    def progress_report(self) -> FeederProgress:
        """How far the training pass has got on each slice, for control."""
        slices = sorted(self.progress)
        ps = [self.progress[s] for s in slices]
        return FeederProgress(
            epoch=self.epoch, batches_acked=self.batches_acked, slices=slices,
            low=[int(p.low) for p in ps], above=[sorted(int(a) for a in p.above) for p in ps],
            samples=[int(p.samples) for p in ps], loss_sum=[float(p.loss_sum) for p in ps],
            weight_sum=[float(p.weight_sum) for p in ps])

    def counters(self) -> dict[str, object]:
        return {"batches_acked": self.batches_acked, "samples_acked": self.samples_acked,
                "epoch_samples": self.epoch_samples, "train_loss_sum": self.train_loss_sum,
                "train_weight_sum": self.train_weight_sum, "acked_by": dict(self.acked_by)}
