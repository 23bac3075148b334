"""A feeder's share of the data (pure; no sockets): control's SliceMap (``roles.control.feeding``),
the slices it gives this feeder, and their plans for a pass. A slice handed over from a lost
feeder resumes where that feeder had got to (the SliceMap's ``resume``)."""

from __future__ import annotations

import numpy as np

from roles.algorithms.batching import Plan, SliceProgress
from roles.job.settings import TrainConfig
from roles.protocol.datapath import SliceMap
from zbus.codec import ProtocolError


class FeederSlices:
    def __init__(self, index: int, train: TrainConfig):
        self.index = index
        self.train = train
        self.map: SliceMap | None = None

    def take(self, m: SliceMap, rows: tuple[int, int] | None) -> list[int]:
        """Control's new map (``rows``: the training and eval rows this feeder loaded, None
        before it has); the slices it newly gives this feeder (none with the first map)."""
        if rows is not None and (m.train[-1][1], m.eval[-1][1]) != rows:
            raise ProtocolError("inconsistent", f"slices of {m.train[-1][1]} training and "
                                                f"{m.eval[-1][1]} eval rows; this feeder "
                                                f"loaded {rows[0]} and {rows[1]}")
        before = None if self.map is None else self.mine()
        self.map = m
        return [] if before is None else [i for i in self.mine() if i not in before]

    @property
    def current(self) -> SliceMap:
        assert self.map is not None, "no SliceMap yet"
        return self.map

    def mine(self) -> list[int]:
        return [i for i, owner in enumerate(self.current.owners) if owner == self.index]

    def describe(self, slices: list[int]) -> str:
        m = self.current
        return ", ".join(f"{i} (training rows {m.train[i][0]}..{m.train[i][1]}, eval rows "
                         f"{m.eval[i][0]}..{m.eval[i][1]})" for i in slices) or "none"

    def resumable(self, slice_: int, epoch: int) -> bool:
        """A lost feeder's slice whose training pass of ``epoch`` it had not reported."""
        r = self.current.resume.get(str(slice_))
        return isinstance(r, dict) and r.get("epoch") == epoch and r.get("reported") is not True

    def scoring(self, slice_: int) -> bool:
        """A lost feeder's slice that it was scoring."""
        return bool(self.current.resume.get(str(slice_), {}).get("phase") == "evaluating")

    def training_plan(self, slice_: int, epoch: int, labels: np.ndarray,
                      logged: SliceProgress | None = None) -> tuple[Plan, SliceProgress]:
        """The slice's plan for the epoch and where it starts from: where this feeder's
        previous process had got to (``logged``, from its ack log), or a lost feeder had."""
        t = self.train
        plan = Plan.training(epoch, slice_, np.arange(*self.current.train[slice_]),
                             t.batch_size, t.shuffle, t.seed,
                             labels if t.batch_by_label else None)
        progress = logged or SliceProgress(epoch)
        if not progress.low and not progress.above and self.resumable(slice_, epoch):
            r = self.current.resume[str(slice_)]
            progress.low, progress.above = r["low"], set(r["above"])
            progress.samples, progress.loss_sum, progress.weight_sum = (
                int(r["samples"]), float(r["loss_sum"]), float(r["weight_sum"]))
        return plan, progress

    def eval_plan(self, slice_: int, epoch: int, n_train: int) -> Plan:
        return Plan.evaluation(epoch, slice_, n_train + np.arange(*self.current.eval[slice_]),
                               self.train.batch_size)
