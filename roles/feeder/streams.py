"""The streams of a feeder's parts (``roles.algorithms.feeding.passes.PartStream``): each reads
its part when its turn comes (``roles.data.source``), writes the rows it rejects the first time
(``roles.data.rejected``) and makes batches (``roles.data.stream``): for training through the
shuffle buffer seeded by (seed, epoch, part), for evaluation in file order. Each part's next
block is read ahead on the process's reader thread (``roles.data.read_ahead``)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from roles.algorithms.feeding.ledger import PartProgress
from roles.algorithms.feeding.passes import Made, PartStream
from roles.data.index import Part
from roles.data.read_ahead import Reader
from roles.data.readers import RawBlock
from roles.data.rejected import RejectedRows
from roles.data.source import DataSource
from roles.data.stream import Preparer, Samples, Tally, eval_batches, training_batches
from roles.job.settings import Job


class PartStreams:
    def __init__(self, job: Job, source: DataSource, rejected: RejectedRows | None = None):
        self.job, self.source, self.rejected = job, source, rejected
        self.reader = Reader()

    def close(self) -> None:
        self.reader.close()

    def blocks(self, part: Part) -> Iterator[RawBlock]:
        blocks = self.reader.ahead(self.source.blocks(part))
        return blocks if self.rejected is None else self.rejected.watch(part.number, blocks)

    def training(self, part: Part, epoch: int, done: PartProgress | None, prepare: Preparer,
                 tally: Tally, made: Made) -> PartStream:
        t, d = self.job.train, self.job.data

        def batches() -> Iterator[Samples]:
            blocks = self.blocks(part)
            share = max(t.batch_size, d.shuffle_buffer // d.parts_open)
            return training_batches(blocks, prepare, tally,
                                    buffer_rows=share if t.shuffle else t.batch_size,
                                    batch_size=t.batch_size, seed=t.seed, epoch=epoch,
                                    part=part.number, by_label=t.batch_by_label)

        return PartStream(part.number, batches, done, made)

    def evaluation(self, part: Part, prepare: Preparer, tally: Tally) -> PartStream:
        def batches() -> Iterator[Samples]:
            blocks = self.blocks(part)
            return eval_batches(blocks, prepare, tally, self.job.train.eval_batch)

        return PartStream(part.number, batches, None, lambda *_: None)

    def order(self, parts: list[int], epoch: int) -> list[int]:
        """A feeder's training parts in this epoch's order (a new random one each epoch)."""
        t = self.job.train
        if not t.shuffle:
            return list(parts)
        return [int(n) for n in np.random.default_rng([t.seed, epoch]).permutation(parts)]
