"""The streams of a feeder's parts (``roles.algorithms.feeding.passes.PartStream``): each reads
its part when its turn comes (``roles.data.source``), writes the rows it rejects the first time
(``roles.data.rejected``) and makes batches (``roles.data.stream``): for training through the
shuffle buffer seeded by (seed, epoch, part), for evaluation in file order; a part held from an
earlier pass (``roles.data.held_parts``) is prepared from memory. All of it runs on
the process's reader thread (``roles.data.read_ahead``), ``batches_ahead`` batches ahead of
each open part's next: reading, parsing, preparing (keys hashed, dense features transformed,
``tally`` counted), filling the shuffle buffer and cutting batches. The feeder's loop only
takes made batches, routes their keys and sends: done on the loop, a block's preparing and a
new part's first fill of its shuffle buffer held it for tens to hundreds of milliseconds, during
which no take was granted and the workers waited."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from roles.algorithms.feeding.ledger import PartProgress
from roles.algorithms.feeding.passes import Made, PartStream
from roles.data.held_parts import HeldParts
from roles.data.index import Part
from roles.data.read_ahead import Reader
from roles.data.readers import RawBlock
from roles.data.rejected import RejectedRows
from roles.data.source import DataSource
from roles.data.stream import (
    Parsed,
    Preparer,
    Samples,
    Tally,
    ordered_batches,
    shuffled_batches,
)
from roles.job.settings import Job

ROWS_AHEAD = 16_384   # made ahead per open part, in batches of about this many rows in all


def batches_ahead(batch_size: int) -> int:
    """Batches made ahead per open part: about ``ROWS_AHEAD`` rows, at least 2. The open parts
    are read in turn, so they need their next blocks at about the same time; the reader makes
    them one after the other (some 100 ms each on a busy 2-core machine), and the batches
    ahead must last that long (16 of 1,024 per part, four parts: about 0.7 s at 90 batches/s);
    each costs the feeder memory."""
    return max(2, -(-ROWS_AHEAD // batch_size))


class PartStreams:
    """``held``: the parts kept in memory between passes (None: every pass reads its parts from
    their files)."""

    def __init__(self, job: Job, source: DataSource, rejected: RejectedRows | None = None,
                 held: HeldParts | None = None):
        self.job, self.source, self.rejected, self.held = job, source, rejected, held
        self.layout = job.layout()
        self.reader = Reader()
        self.closing = False

    def close(self) -> None:
        self.closing = True   # a part being held ahead stops at its next block
        self.reader.close()

    def blocks(self, part: Part) -> Iterator[RawBlock]:
        blocks = self.reader.ahead(self.source.blocks(part))
        return blocks if self.rejected is None else self.rejected.watch(part.number, blocks)

    def parsed(self, part: Part) -> Iterator[Parsed]:
        """The part's blocks as read and parsed (their rejected rows written the first time
        the part is read whole), or as held from an earlier pass."""
        def read() -> Iterator[Parsed]:
            blocks = self.source.blocks(part)
            if self.rejected is not None:
                blocks = self.rejected.watch(part.number, blocks)
            for block in blocks:
                made = [Parsed.of(self.layout, block)]
                del block       # the text's columns are not held while the rows are used
                yield made.pop()
        return read() if self.held is None else self.held.read(part.number, part.rows, read())

    def prepared(self, part: Part, prepare: Preparer, tally: Tally,
                 train: bool) -> Iterator[Samples]:
        """The part's blocks as samples, made as they are iterated: on the reader thread."""
        for block in self.parsed(part):
            made = [prepare.parsed(block, train, tally)]
            del block
            yield made.pop()   # (popped: not held here while the samples are used)

    def hold_ahead(self, parts: list[Part]) -> int:
        """Read and hold these parts now, on the reader thread, before a pass needs them (the
        first epoch's first parts while the statistics are taken: their first batches then
        wait only for preparing and shuffling); those that would not fit are left to their
        passes. How many were queued."""
        if self.held is None:
            return 0
        queued = [p for p in parts if self.held.fits(p.number, p.rows)]
        for part in queued:
            self.reader.submit(self._hold, part)
        return len(queued)

    def _hold(self, part: Part) -> None:
        for _ in self.parsed(part):
            if self.closing:
                return

    def training(self, part: Part, epoch: int, done: PartProgress | None, prepare: Preparer,
                 tally: Tally, made: Made) -> PartStream:
        t, d = self.job.train, self.job.data

        def batches() -> Iterator[Samples]:
            share = max(t.batch_size, d.shuffle_buffer // d.parts_open)
            return self.reader.ahead(shuffled_batches(
                self.prepared(part, prepare, tally, True),
                buffer_rows=share if t.shuffle else t.batch_size, batch_size=t.batch_size,
                seed=t.seed, epoch=epoch, part=part.number, by_label=t.batch_by_label),
                batches_ahead(t.batch_size))

        return PartStream(part.number, batches, done, made)

    def evaluation(self, part: Part, prepare: Preparer, tally: Tally) -> PartStream:
        def batches() -> Iterator[Samples]:
            size = self.job.train.eval_batch
            return self.reader.ahead(ordered_batches(
                self.prepared(part, prepare, tally, False), size), batches_ahead(size))

        return PartStream(part.number, batches, None, lambda *_: None)

    def order(self, parts: list[int], epoch: int) -> list[int]:
        """A feeder's training parts in this epoch's order (a new random one each epoch)."""
        t = self.job.train
        if not t.shuffle:
            return list(parts)
        return [int(n) for n in np.random.default_rng([t.seed, epoch]).permutation(parts)]
