"""From a part's rows to batches, in bounded memory and in an order that can be replayed.

Each chunk of rows is made into samples: keys hashed (``hashing``) into the job's slots
(``roles.job.fields``: one slot per single-valued field, ``max_len`` per list field, its newest
ids left-aligned and ``PAD`` after them; each field's ids hashed with its table's name, so a
table shared by several fields gives one id one key), dense values transformed
with the training statistics (``transforms``), and, for training, weighted (time decay,
merging within the chunk, dropping: ``weighting``). A training pass over a part then goes
through a shuffle buffer of ``[data] shuffle_buffer`` samples: once it is full, each batch is
``batch_size`` samples drawn from it at random, and the part's last samples leave in a random
order at its end. The buffer's randomness is seeded by (seed, epoch, part), so the same part in
the same epoch gives the same batches in the same order, whichever feeder reads it and however
often (a restarted feeder replays a part to the batch it had got to; batch ids are (epoch,
part, batch number)). With ``batch_by_label`` every batch holds samples of one label, drawn
from that label's samples in the buffer. Evaluation passes keep file order and weight 1.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace

import numpy as np

from roles.data.compiled import AVAILABLE
from roles.data.hashing import derived_keys, hash_into, hash_lists
from roles.data.readers import RawBlock
from roles.data.transforms import DenseTransform
from roles.data.weighting import negatives_kept, weigh
from roles.job.fields import FieldLayout
from roles.job.settings import DECAY_UNITS, Job


@dataclass(frozen=True)
class Samples:
    keys: np.ndarray      # int64 [n, slots] (roles.job.fields)
    dense: np.ndarray     # float32 [n, dense]
    labels: np.ndarray    # float32 [n]; [n, tasks] with several labels (NaN: masked)
    weights: np.ndarray   # float32 [n]

    def __len__(self) -> int:
        return len(self.labels)

    def take(self, rows: np.ndarray | slice) -> Samples:
        return Samples(self.keys[rows], self.dense[rows], self.labels[rows], self.weights[rows])

    @classmethod
    def empty(cls, slots: int, dense: int) -> Samples:
        return cls(np.zeros((0, slots), np.int64), np.zeros((0, dense), np.float32),
                   np.zeros(0, np.float32), np.zeros(0, np.float32))

    @classmethod
    def join(cls, parts: list[Samples]) -> Samples:
        return cls(*(np.concatenate([getattr(p, k) for p in parts])
                     for k in ("keys", "dense", "labels", "weights")))


@dataclass(frozen=True)
class Weighting:
    base: float
    unit_s: int
    drop_below: float
    merge: bool
    newest: int | None   # the training data's newest time bucket
    negative_rate: float = 1.0   # the share of negatives kept ([data] negative_rate)
    seed: int = 0


@dataclass
class Tally:
    """What a pass made of its rows."""

    rows_read: int = 0
    rejected: int = 0
    dropped: int = 0
    merged: int = 0
    samples: int = 0

    def add(self, other: Tally) -> None:
        for k in ("rows_read", "rejected", "dropped", "merged", "samples"):
            setattr(self, k, getattr(self, k) + getattr(other, k))


def slot_keys(layout: FieldLayout, block: RawBlock, compiled: bool = AVAILABLE) -> np.ndarray:
    """int64 [rows, slots]: a single-valued field's key in its slot, a list field's newest
    ``max_len`` keys in its slots (``PAD`` after them), each hashed with its table's
    name (block.sparse holds the data fields in the layout's order; the derived fields' keys
    are made from theirs: ``hashing.derived_keys``); ``compiled``: plain text
    columns in one compiled pass each (``hashing.plain_keys_into``), the same keys. Made slot
    by slot, each slot's keys contiguous, then transposed once (written into the rows' layout
    directly, each slot's keys a strided write: 0.2 against 0.06 us a Criteo row)."""
    by_slot = np.empty((layout.slots, len(block)), dtype=np.int64)
    for f in range(layout.data_fields):
        table = layout.tables[f]
        if layout.is_list(f):
            by_slot[layout.slot_range(f)] = hash_lists(table, block.sparse[f],
                                                       layout.widths[f], compiled).T
        else:
            hash_into(table, block.sparse[f], by_slot[layout.slot_range(f).start], compiled)
    for f in range(layout.data_fields, len(layout.fields)):   # weights per id: from the keys
        by_slot[layout.slot_range(f)] = derived_keys(
            layout.tables[f], [by_slot[layout.slot_range(s)] for s in layout.sources[f]])
    return np.ascontiguousarray(by_slot.T)


@dataclass(frozen=True)
class Parsed:
    """A block as read and hashed, before the statistics are known: its rows without their text
    columns (``raw``: labels, dense values as read, timestamps, rows read and rejected) and
    their keys (``slot_keys``). What a feeder holds of a part between passes
    (``roles.data.held_parts``) and the preloaded reference while it takes the statistics."""

    raw: RawBlock
    keys: np.ndarray   # int64 [rows, slots]

    @staticmethod
    def row_bytes(slots: int, dense: int, tasks: int = 1, weight: bool = False) -> int:
        """About what a row holds (``freeze`` counts it exactly): a key a slot, a dense value
        as read (float64), a label a task, a timestamp, a weight."""
        return 8 * (slots + dense) + 4 * tasks + 8 + 8 * weight

    @classmethod
    def of(cls, layout: FieldLayout, block: RawBlock) -> Parsed:
        return cls(replace(block, sparse=[]), slot_keys(layout, block))

    def freeze(self) -> int:
        """Made read-only (held for later passes, it must not change); its bytes."""
        arrays = [self.keys, self.raw.labels, self.raw.dense]
        for more in (self.raw.timestamps, self.raw.weights):
            if more is not None:
                arrays.append(more)
        for a in arrays:
            a.flags.writeable = False
        return sum(a.nbytes for a in arrays) + sum(100 + len(r.text) for r in self.raw.rejected)


class Preparer:
    """Chunks of rows to samples, their keys laid out as ``layout`` says."""

    def __init__(self, layout: FieldLayout, transform: DenseTransform,
                 weighting: Weighting | None):
        self.layout, self.transform, self.weighting = layout, transform, weighting

    @classmethod
    def for_job(cls, job: Job, transform: DenseTransform, newest: int | None) -> Preparer:
        """``job``'s preparation of rows once the training data's statistics are known: the
        dense ``transform``, and the newest timestamp (None: none) that time decay counts
        from (``[data]`` decay, drop and merge settings)."""
        d = job.data
        unit = DECAY_UNITS[d.decay_unit]
        return cls(job.layout(), transform,
                   Weighting(d.decay_base, unit, d.drop_below, d.merge,
                             None if newest is None else newest // unit, d.negative_rate,
                             job.train.seed))

    def keys(self, block: RawBlock) -> np.ndarray:
        """The block's keys in the layout's slots (``slot_keys``)."""
        return slot_keys(self.layout, block)

    def __call__(self, block: RawBlock, train: bool, tally: Tally,
                 keys: np.ndarray | None = None) -> Samples:
        """The block's samples; ``keys``: its keys as ``slot_keys`` made them already (the
        preloaded reference hashes a block while the statistics are not known yet)."""
        tally.rows_read += block.rows_read
        tally.rejected += len(block.rejected)
        keys = self.keys(block) if keys is None else keys
        dense = self.transform.apply(block.dense)
        labels = block.labels.astype(np.float32)
        w = self.weighting
        if not train or w is None:
            samples = Samples(keys, dense, labels, np.ones(len(labels), dtype=np.float32))
        else:
            stamps, own = block.timestamps, block.weights
            if w.negative_rate < 1.0:   # the negatives not kept go before anything else
                kept = np.flatnonzero(negatives_kept(keys, labels, w.negative_rate, w.seed,
                                                     dense, stamps))
                tally.dropped += len(labels) - len(kept)
                keys, dense, labels = keys[kept], dense[kept], labels[kept]
                stamps = None if stamps is None else stamps[kept]
                own = None if own is None else own[kept]
            got = weigh(keys, dense, labels, stamps, base=w.base, unit_s=w.unit_s,
                        drop_below=w.drop_below, merge=w.merge, newest=w.newest,
                        row_weights=own)
            tally.dropped += got.dropped
            tally.merged += got.merged
            samples = Samples(keys, dense, labels, np.ones(len(labels), np.float32)).take(
                got.rows)
            samples = Samples(samples.keys, samples.dense, samples.labels, got.weights)
        tally.samples += len(samples)
        return samples

    def parsed(self, block: Parsed, train: bool, tally: Tally) -> Samples:
        """A parsed block's samples (as ``__call__`` makes them of its block)."""
        return self(block.raw, train, tally, block.keys)


class ShuffleBuffer:
    """Holds up to ``capacity`` samples (and one chunk more while it is filled); ``take`` draws a
    batch of them at random (of one label with ``by_label``); the rows left fill the holes, so
    nothing is copied but the batch and as many rows."""

    def __init__(self, capacity: int, batch_size: int, rng: np.random.Generator,
                 by_label: bool):
        self.capacity = max(capacity, batch_size)
        if by_label:
            self.capacity = max(self.capacity, 4 * batch_size)
        self.batch_size, self.rng, self.by_label = batch_size, rng, by_label
        self.rows: Samples | None = None   # storage; the first ``n`` rows are held
        self.n = 0

    def __len__(self) -> int:
        return self.n

    def add(self, samples: Samples) -> None:
        need = self.n + len(samples)
        if self.rows is None or need > len(self.rows):
            size = max(need, self.capacity + len(samples))
            grown = Samples(np.empty((size, samples.keys.shape[1]), np.int64),
                            np.empty((size, samples.dense.shape[1]), np.float32),
                            np.empty((size, *samples.labels.shape[1:]), np.float32),
                            np.empty(size, np.float32))
            if self.rows is not None:
                for k in ("keys", "dense", "labels", "weights"):
                    getattr(grown, k)[:self.n] = getattr(self.rows, k)[:self.n]
            self.rows = grown
        for k in ("keys", "dense", "labels", "weights"):
            getattr(self.rows, k)[self.n:need] = getattr(samples, k)
        self.n = need

    def full(self) -> bool:
        return self.n >= self.capacity

    def _remove(self, picked: np.ndarray) -> Samples:
        rows = self.rows
        assert rows is not None
        batch = rows.take(picked)
        k, n = len(picked), self.n
        holes = picked[picked < n - k]
        kept = np.ones(k, dtype=bool)   # the last k rows not picked fill the holes, in order
        kept[picked[picked >= n - k] - (n - k)] = False   # (np.isin: a sort, 0.5 ms a batch)
        movers = np.flatnonzero(kept) + (n - k)
        for name in ("keys", "dense", "labels", "weights"):
            a = getattr(rows, name)
            a[holes] = a[movers]
        self.n = n - k
        return batch

    def take(self) -> Samples:
        rows = self.rows
        assert rows is not None
        if not self.by_label:
            return self._remove(self.rng.choice(self.n, self.batch_size, replace=False))
        labels = rows.labels[:self.n]
        values, counts = np.unique(labels, return_counts=True)
        enough = counts >= self.batch_size
        choices = values[enough] if enough.any() else values
        weights = counts[enough] if enough.any() else counts
        label = self.rng.choice(choices, p=weights / weights.sum())
        mine = np.flatnonzero(labels == label)
        return self._remove(self.rng.choice(mine, min(self.batch_size, len(mine)),
                                            replace=False))

    def drain(self) -> Iterator[Samples]:
        """The rest, in a random order (of one label per batch with ``by_label``)."""
        if self.rows is None or not self.n:
            return
        held = self.rows.take(slice(0, self.n))
        self.rows, self.n = None, 0
        order = self.rng.permutation(len(held))
        if not self.by_label:
            for lo in range(0, len(order), self.batch_size):
                yield held.take(order[lo:lo + self.batch_size])
            return
        batches, keys = [], []
        for value in np.unique(held.labels):
            mine = order[held.labels[order] == value]
            n = -(-len(mine) // self.batch_size)
            batches += [mine[i * self.batch_size:(i + 1) * self.batch_size] for i in range(n)]
            keys += [(i + 0.5) / n for i in range(n)]
        for i in np.argsort(np.asarray(keys), kind="stable"):
            yield held.take(batches[i])


def shuffled_batches(chunks: Iterable[Samples], *, buffer_rows: int, batch_size: int,
                     seed: int, epoch: int, part: int, by_label: bool) -> Iterator[Samples]:
    """The batches of one part's training pass in one epoch, in their replayable order, from
    the part's prepared blocks."""
    buffer = ShuffleBuffer(buffer_rows, batch_size,
                           np.random.default_rng([seed, epoch, part]), by_label)
    for samples in chunks:
        buffer.add(samples)
        del samples   # in the buffer now: not held twice while its batches are drawn
        while buffer.full():
            yield buffer.take()
    yield from buffer.drain()


def training_batches(blocks: Iterable[RawBlock], prepare: Preparer, tally: Tally, *,
                     buffer_rows: int, batch_size: int, seed: int, epoch: int, part: int,
                     by_label: bool) -> Iterator[Samples]:
    """``shuffled_batches`` of the blocks, each prepared when it is needed."""
    return shuffled_batches((prepare(block, True, tally) for block in blocks),
                            buffer_rows=buffer_rows, batch_size=batch_size, seed=seed,
                            epoch=epoch, part=part, by_label=by_label)


def eval_batches(blocks: Iterable[RawBlock], prepare: Preparer, tally: Tally,
                 batch_size: int) -> Iterator[Samples]:
    """``ordered_batches`` of the blocks, each prepared when it is needed."""
    return ordered_batches((prepare(block, False, tally) for block in blocks), batch_size)


def ordered_batches(chunks: Iterable[Samples], batch_size: int) -> Iterator[Samples]:
    """A part's rows in file order, ``batch_size`` at a time, from its prepared blocks."""
    rest: Samples | None = None
    for samples in chunks:
        rest = samples if rest is None else Samples.join([rest, samples])
        whole = len(rest) // batch_size * batch_size
        for lo in range(0, whole, batch_size):
            yield rest.take(slice(lo, lo + batch_size))
        rest = rest.take(slice(whole, None))
    if rest is not None and len(rest):
        yield rest
