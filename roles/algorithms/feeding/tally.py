"""What a feeder's acknowledged batches add up to (pure; no sockets).

Over the job: batches, samples, loss and weight sums (the console's loss curve) and samples per
worker; a feeder restarted on its ack log (``roles.algorithms.feeding.ack_log``) starts from there.
Over the training pass under way: its samples and loss (the EpochTrained report), how often each
batch's samples were trained (counted per batch: a part's batches hold each of its samples
once), what the stream made of the rows (read, rejected, dropped, merged), and per part how far
the pass has got (PartProgress; the FeederProgress control hears with every heartbeat, and
hands a lost feeder's part on from). Over an evaluation pass: its scores, as a histogram per task
(``roles.algorithms.shared.metrics.TaskScores``), so the memory does not grow with the data.
"""

from __future__ import annotations

from array import array
from collections import Counter
from typing import Any

import numpy as np

from roles.algorithms.feeding.ledger import PartProgress
from roles.algorithms.feeding.passes import Pass
from roles.algorithms.shared.grouped import GroupScores
from roles.algorithms.shared.metrics import TaskScores
from roles.data.stream import Tally
from roles.job.fields import FieldLayout
from roles.protocol.datapath import FeederProgress, split_batch_id
from roles.protocol.lifecycle import EpochTrained, EvalReport

PASS_WINDOW = 1 << 16   # batches of a part kept one by one; older ones are in the totals


def _rows_of(sizes: np.ndarray, acks: np.ndarray) -> Counter[str]:
    sizes = sizes.astype(np.int64)
    return Counter({"rows": int(sizes.sum()), "rows_once": int(sizes[acks == 1].sum()),
                    "rows_repeated": int(sizes[acks > 1].sum()),
                    "rows_missed": int(sizes[acks == 0].sum())})


class PassBatches:
    """Per part of a training pass: each batch's samples and how often it was acknowledged
    (a batch acknowledged before, by a previous process, counts once); 5 bytes a batch, for
    the newest ``window`` to twice that of each part. A batch further behind its part's
    newest is settled (a feeder has at most a few thousand batches in flight), so its counts
    are folded into the totals: a stream's one pass of weeks keeps at most 640 KB a part
    (it kept 5 bytes for every batch of the pass, 84 MB a day at 200 batches a second)."""

    def __init__(self, window: int = PASS_WINDOW) -> None:
        self.window = window
        self.sizes: dict[int, array[int]] = {}
        self.acks: dict[int, bytearray] = {}
        self.first: dict[int, int] = {}   # part -> the seq of its first batch kept
        self.folded: Counter[str] = Counter()
        self.folded_count = 0

    def _at(self, part: int, seq: int) -> tuple[array[int], bytearray, int] | None:
        """The part's arrays and ``seq``'s place in them, grown to hold it (None: folded)."""
        sizes = self.sizes.setdefault(part, array("i"))
        acks = self.acks.setdefault(part, bytearray())
        first = self.first.setdefault(part, 0)
        at = seq - first
        if at < 0:
            return None
        if at >= 2 * self.window:   # fold what lies a window behind ``seq``
            drop = at - self.window + 1
            kept = min(drop, len(sizes))
            folding = np.array(sizes[:kept], dtype=np.int32)   # (a copy: sizes shrinks)
            self.folded += _rows_of(folding, np.frombuffer(bytes(acks[:kept]), dtype=np.uint8))
            self.folded_count += int(np.count_nonzero(folding))   # (numbers never made:
            #                                                       a restart's gap, a jump)
            del sizes[:kept]
            del acks[:kept]
            self.first[part] = first = first + drop
            at = seq - first
        if len(sizes) <= at:
            sizes.extend([0] * (at + 1 - len(sizes)))
            acks.extend(bytes(at + 1 - len(acks)))
        return sizes, acks, at

    def made(self, part: int, seq: int, samples: int, before: bool) -> None:
        got = self._at(part, seq)
        if got is None:
            return
        sizes, acks, at = got
        sizes[at] = samples
        if before:
            acks[at] = min(255, acks[at] + 1)

    def acked(self, part: int, seq: int) -> None:
        got = self._at(part, seq)
        if got is not None:
            _, acks, at = got
            acks[at] = min(255, acks[at] + 1)

    @property
    def count(self) -> int:
        """Batches made (a batch has samples: a number skipped, as a restarted stream
        feeder skips its dead process's in-flight numbers, is none)."""
        return self.folded_count + sum(int(np.count_nonzero(np.frombuffer(v, dtype=np.int32)))
                                       for v in self.sizes.values())

    def rows(self) -> dict[str, int]:
        total = Counter({"rows": 0, "rows_once": 0, "rows_repeated": 0, "rows_missed": 0})
        total.update(self.folded)
        for p in self.sizes:
            total.update(_rows_of(np.frombuffer(self.sizes[p], dtype=np.int32),
                                  np.frombuffer(bytes(self.acks[p]), dtype=np.uint8)))
        return dict(total)


class FeederTally:
    def __init__(self, tasks: int = 1, group_rows: int = 0,
                 group_missing: int | None = None) -> None:
        """``group_rows``: the rows held for the GAUC ([metrics] group_by; 0: none);
        ``group_missing``: the key of its missing value (rows of no group)."""
        self.tasks, self.group_rows, self.group_missing = tasks, group_rows, group_missing
        self.batches_acked = 0          # training and eval, over the job
        self.samples_acked = 0          # training, over the job
        self.train_loss_sum = 0.0
        self.train_weight_sum = 0.0
        self.acked_by: Counter[str] = Counter()
        self.epoch = -1                 # the epoch of the training pass (and its progress)
        self.epoch_samples = 0
        self.loss_sum = 0.0
        self.weight_sum = 0.0
        self.progress: dict[int, PartProgress] = {}
        self.batches = PassBatches()
        self.data = Tally()             # what the pass's streams made of the rows
        self.adopted: list[Tally] = []  # those of streams begun before the pass, their own
        self.scores = TaskScores(tasks)
        self.grouped = self._grouped()

    def _grouped(self) -> GroupScores | None:
        return GroupScores(self.tasks, self.group_rows, missing=self.group_missing) \
            if self.group_rows else None

    def restore(self, done: dict[str, Any]) -> None:
        """The job-wide figures of a feeder's previous process (``AckLog.restart``)."""
        self.batches_acked = int(done["batches"])
        self.samples_acked = int(done["samples"])
        self.train_loss_sum = float(done["loss_sum"])
        self.train_weight_sum = float(done["weight_sum"])
        self.acked_by.update(done["acked_by"])

    def new_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.progress = {}

    def new_pass(self) -> None:
        self.loss_sum = self.weight_sum = 0.0
        self.epoch_samples = 0
        self.batches = PassBatches()
        self.data = Tally()
        self.adopted = []

    def part_planned(self, part: int, progress: PartProgress) -> int | None:
        """The part's pass starts from ``progress`` (what was acknowledged before, by this
        feeder's previous process or by a lost feeder): its samples and loss count. Returns
        how many batches that is (None: the pass starts afresh)."""
        self.progress[part] = progress
        if not (progress.low or progress.above):
            return None
        self.epoch_samples += progress.samples
        self.loss_sum += progress.loss_sum
        self.weight_sum += progress.weight_sum
        return progress.low + len(progress.above)

    def new_evaluation(self) -> None:
        self.scores = TaskScores(self.tasks)
        self.grouped = self._grouped()
        self.data = Tally()
        self.adopted = []

    def adopt(self, tally: Tally) -> None:
        """A stream begun before the pass (``Passes.warm``) counts its rows in ``tally``."""
        self.adopted.append(tally)

    def made_of_rows(self) -> Tally:
        """What the pass's streams made of the rows so far (they count on the reader thread:
        exact once they are read to their end)."""
        total = Tally()
        for t in (self.data, *self.adopted):
            total.add(t)
        return total

    def eval_acked(self, labels: np.ndarray, preds: np.ndarray,
                   groups: np.ndarray | None = None) -> None:
        """An eval batch's scores; ``groups``: each row's group (with the GAUC)."""
        self.batches_acked += 1
        self.scores.add(labels, preds)
        if self.grouped is not None and groups is not None:
            self.grouped.add(groups, labels, preds)

    def train_acked(self, worker: str, batch_id: int, samples: int, loss_sum: float,
                    weight_sum: float) -> None:
        self.batches_acked += 1
        self.loss_sum += loss_sum
        self.weight_sum += weight_sum
        self.train_loss_sum += loss_sum
        self.train_weight_sum += weight_sum
        self.epoch_samples += samples
        self.samples_acked += samples
        self.acked_by[worker] += samples
        _, part, seq = split_batch_id(batch_id)
        self.batches.acked(part, seq)
        progress = self.progress.get(part)
        if progress is not None:
            progress.acked(seq, samples, loss_sum, weight_sum)

    def epoch_trained(self, pass_: Pass, seconds: float) -> EpochTrained:
        """The report of a finished training pass."""
        rows = self.batches.rows()
        d = self.made_of_rows()
        return EpochTrained(
            epoch=pass_.epoch, samples=self.epoch_samples,
            batches=self.batches.count, loss_sum=self.loss_sum,
            weight_sum=self.weight_sum, seconds=seconds, parts=pass_.parts, **rows,
            rows_read=d.rows_read, rejected=d.rejected, dropped=d.dropped, merged=d.merged)

    def eval_report(self, pass_: Pass) -> EvalReport:
        """The scores of a finished evaluation pass."""
        d = self.made_of_rows()
        g = self.grouped
        groups, labels, probs = g.rows() if g is not None else \
            (np.zeros(0, np.int64), np.zeros(0, np.float32), np.zeros(0, np.float32))
        return EvalReport(epoch=pass_.epoch, parts=pass_.parts, rows_read=d.rows_read,
                          rejected=d.rejected, scored=self.scores.rows,
                          counts=self.scores.counts(),
                          loss_sums=self.scores.loss_sums(), prob_sums=self.scores.prob_sums(),
                          group_level=0 if g is None else g.level, groups=groups,
                          group_labels=labels.reshape(-1), group_probs=probs.reshape(-1))

    def progress_report(self) -> FeederProgress:
        """How far the training pass has got on each part, for control."""
        parts = sorted(self.progress)
        ps = [self.progress[s] for s in parts]
        return FeederProgress(
            epoch=self.epoch, batches_acked=self.batches_acked, parts=parts,
            low=[int(p.low) for p in ps], above=[sorted(int(a) for a in p.above) for p in ps],
            samples=[int(p.samples) for p in ps], loss_sum=[float(p.loss_sum) for p in ps],
            weight_sum=[float(p.weight_sum) for p in ps])

    def counters(self) -> dict[str, object]:
        return {"batches_acked": self.batches_acked, "samples_acked": self.samples_acked,
                "epoch_samples": self.epoch_samples, "train_loss_sum": self.train_loss_sum,
                "train_weight_sum": self.train_weight_sum, "acked_by": dict(self.acked_by),
                "rows_read": self.made_of_rows().rows_read}


class ListTally:
    """The ids the list fields of the batches a feeder sent held: per field, ids in all and
    samples whose list was full (``max_len`` ids: older ones may have been dropped), for the
    summary's per-field figures. Counters are flat numbers (``ids:<field>``, ``full:<field>``,
    ``list_samples``), so control adds every feeder's up."""

    def __init__(self, layout: FieldLayout):
        self.fields = [(name, layout.widths[f]) for f, name in enumerate(layout.fields)
                       if layout.is_list(f)]
        self.ids = np.zeros(len(self.fields), dtype=np.int64)
        self.full = np.zeros(len(self.fields), dtype=np.int64)
        self.samples = 0

    def add(self, lengths: np.ndarray) -> None:
        if not self.fields:
            return
        self.ids += lengths.sum(axis=0, dtype=np.int64)
        self.full += (lengths == np.array([w for _, w in self.fields])).sum(axis=0)
        self.samples += len(lengths)

    def counters(self) -> dict[str, int]:
        if not self.fields:
            return {}
        out = {"list_samples": self.samples}
        for (name, _), ids, full in zip(self.fields, self.ids, self.full, strict=True):
            out[f"ids:{name}"], out[f"full:{name}"] = int(ids), int(full)
        return out
