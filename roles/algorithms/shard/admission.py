"""Admission (``[embeddings] min_count``): a key gets a row of its own only once it has been
seen often enough; until then it shares its field's default row (pure; a shard feeds it).

``CountMinSketch``: ``depth`` rows of ``width`` saturating 8-bit counters (width a power of
two; ``depth × width`` bytes, the memory stated by ``sketch_mb``). A key's estimate is the
smallest of its ``depth`` counters: never below its true count since the last ageing, above it
only by collisions. Counts are added with the *conservative update*: each of the key's
counters is raised only as far as the new estimate (estimate + count), which keeps the
collisions' excess much smaller than plain increments. **Ageing**: after every ``width``
sightings added, every counter is halved (a right shift). Without it the counters only grow:
in a long job every slot would sooner or later be pushed to ``min_count`` by collisions and
every key admitted; with it the sketch holds about ``width`` to ``2 × width`` sightings at any
time, so collisions add a bounded excess (about one sighting per counter at most), and what
counts is a key's recent frequency: it must be seen ``min_count`` times within roughly the
last ``width`` sightings of keys without a row. With expiry on, the counters are also halved
once per expiry horizon (``expire_batches`` batches of the shard, ``expire_s`` seconds): a key
must then earn its row within about the time it would keep it unseen. Without that, the
sketch's memory would span a number of sightings, not a stretch of the data: in a job shorter
than that, the keys admitted would be those seen ``min_count`` times since the start, a set
that grows with the data, and so would the rows held; an expired key would come straight back
on its next sighting. Halving costs one pass over the counters (``depth × width`` bytes).

``Admission``: maps one batch's keys to rows (``map_batch``). A key with a row keeps it; a key
without one gets a row when its estimate plus its occurrences in this batch reach
``min_count`` (so ``min_count = 1``, the default, admits every key on first sight and no sketch
is made); any other key maps to its field's default row (the field of its first occurrence,
from the grid's bounds: ``roles.job.fields``).
Several keys on one default row make the batch's rows not distinct, so the rows are deduped
and the look-up answer carries each row once: the worker's backward sums the gradients of
every occurrence (``index_add_``) and Adagrad applies one summed gradient to the row, as to any
row. The sightings of the keys mapped to a default row are added to the sketch only when the
batch's gradients are applied (``trained``): an eval batch (no gradients) and a batch sent
twice (its second gradients are refused) never count. A key's sightings in batches still in
flight therefore count a few batches late.

An evaluation batch (``map_eval``) makes no row: a key without one scores with its field's
default row (admission on) or its deterministic initial row (off), as the exported model
scores an unknown key (``zbus-predict``). So evaluating neither grows the tables nor puts
untrained rows into the export.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from roles.algorithms.shard.embedding_table import EmbeddingTable
from roles.algorithms.shard.key_groups import KeyGrouper, KeyGroups
from roles.data.keyspace import splitmix64
from roles.job.fields import field_of
from zbus.codec import ProtocolError

DEPTH = 4
MAX_COUNT = 255
_SEEDS = np.array([0x8F1BBCDC, 0x6ED9EBA1, 0x5A827999, 0xCA62C1D6], dtype=np.uint64)


def sketch_width(sketch_mb: float, depth: int = DEPTH) -> int:
    """Counters per row: the largest power of two with depth x width bytes <= sketch_mb MiB."""
    budget = max(1, int(sketch_mb * (1 << 20)) // depth)
    return 1 << (budget.bit_length() - 1)


class CountMinSketch:
    def __init__(self, width: int, depth: int = DEPTH):
        if width < 1 or width & (width - 1) or not 1 <= depth <= len(_SEEDS):
            raise ValueError("width must be a power of two and depth 1..4")
        self.width, self.depth = width, depth
        self.counts = np.zeros((depth, width), dtype=np.uint8)
        self.added = 0          # sightings added since the last halving
        self.halvings = 0

    @property
    def nbytes(self) -> int:
        return self.counts.nbytes

    def _cells(self, keys: np.ndarray) -> np.ndarray:
        """Each key's counter in each row: [depth, keys] flat indexes into ``counts``."""
        k = np.ascontiguousarray(keys, dtype=np.int64).view(np.uint64)
        mask = np.uint64(self.width - 1)
        cells = np.empty((self.depth, len(k)), dtype=np.int64)
        for d in range(self.depth):
            cells[d] = (splitmix64(k ^ _SEEDS[d]) & mask).astype(np.int64) + d * self.width
        return cells

    def estimate(self, keys: np.ndarray) -> np.ndarray:
        """Each key's estimated sightings (int64)."""
        if not len(keys):
            return np.zeros(0, dtype=np.int64)
        least: np.ndarray = self.counts.reshape(-1)[self._cells(keys)].min(axis=0)
        return least.astype(np.int64)

    def add(self, keys: np.ndarray, counts: np.ndarray) -> None:
        """Add ``counts`` sightings of distinct ``keys`` (conservative update), then halve
        every counter if ``width`` sightings were added since the last halving."""
        if not len(keys):
            return
        flat = self.counts.reshape(-1)
        cells = self._cells(keys)
        counts = np.asarray(counts, dtype=np.int64)
        target = np.minimum(flat[cells].min(axis=0).astype(np.int64) + counts, MAX_COUNT)
        # raise each counter to at least its key's new estimate (the largest wins when keys
        # share a counter)
        np.maximum.at(flat, cells.reshape(-1),
                      np.broadcast_to(target, cells.shape).reshape(-1).astype(np.uint8))
        self.added += int(counts.sum())
        while self.added >= self.width:
            self.halve()
            self.added -= self.width

    def halve(self) -> None:
        self.counts >>= 1
        self.halvings += 1


@dataclass
class BatchRows:
    """One batch's keys mapped to rows: ``rows`` distinct, ``inverse`` the index into rows of
    each key occurrence, ``pending`` the keys mapped to a default row and their occurrences
    (None when every key had a row), for ``Admission.trained``."""

    rows: np.ndarray
    inverse: np.ndarray
    pending: tuple[np.ndarray, np.ndarray] | None = None
    fresh: tuple[np.ndarray, np.ndarray] | None = None   # evaluation: keys without a row,
    # as (indices into rows, their initial rows); those rows hold a stand-in (see ``peek``)


class Admission:
    def __init__(self, min_count: int, sketch_mb: float, fields: int, age_batches: int = 0,
                 age_s: float = 0.0, now: float = 0.0):
        self.min_count = min_count
        self.fields = fields
        self.sketch = CountMinSketch(sketch_width(sketch_mb)) if min_count > 1 else None
        self.age_batches, self.age_s = age_batches, age_s   # the expiry horizon, if any
        self.aged_clock, self.aged_time = 0, now   # the last halvings per horizon
        self.grouper = KeyGrouper()
        self.admitted = 0      # keys given a row by a look-up
        self.rejected = 0      # key occurrences mapped to a default row
        self.rejected_keys = 0  # distinct keys per batch mapped to a default row, summed

    @property
    def defaults(self) -> int:
        """Default rows the table needs (one per field when admission is on)."""
        return self.fields if self.sketch is not None else 0

    def _advance(self, table: EmbeddingTable) -> None:
        """One more batch looked up: the table's clock, and the sketch's ageing with it."""
        table.clock += 1
        if self.age_batches and table.clock - self.aged_clock >= self.age_batches:
            self.aged_clock = table.clock
            self.age()

    def _check_fields(self, table: EmbeddingTable, bounds: list[int]) -> None:
        fields = len(bounds) - 1
        if fields > self.fields or fields > table.defaults:
            raise ProtocolError("bad_fields", f"a batch of {fields} fields for a table of "
                                              f"{min(self.fields, table.defaults)}")

    def _grouped(self, table: EmbeddingTable, keys: np.ndarray, bounds: list[int]) -> KeyGroups:
        """One more batch: the clock advanced and its keys grouped; with admission on, its
        fields checked and the keys without a row counted (first occurrence, occurrences)."""
        self._advance(table)
        counted = self.sketch is not None
        if counted:
            self._check_fields(table, bounds)
        return self.grouper.group(table, keys, counted)

    def map_eval(self, table: EmbeddingTable, keys: np.ndarray, positions: np.ndarray,
                 bounds: list[int]) -> BatchRows:
        """Rows for an evaluation batch's keys, making none: a key without a row scores as the
        exported model would score it (``zbus-predict``): with admission its field's default
        row, else its deterministic initial row (``fresh``). The clock advances as for
        ``map_batch``."""
        g = self._grouped(table, keys, bounds)
        known, absent = len(g.found), len(g.missing)
        rows = np.concatenate([g.found, np.zeros(absent, dtype=np.int64)])
        if not absent:
            return BatchRows(rows, g.inverse.astype(np.int32))
        if self.sketch is None:   # a stand-in row (row 0 is always valid), replaced by fresh
            fresh = (np.arange(known, known + absent), table.initial(g.missing))
            return BatchRows(rows, g.inverse.astype(np.int32), fresh=fresh)
        rows[known:] = field_of(positions[g.first], bounds)   # its default row
        table.touch(rows[known:])
        return BatchRows(rows, g.inverse.astype(np.int32))

    def map_batch(self, table: EmbeddingTable, keys: np.ndarray, positions: np.ndarray,
                  bounds: list[int]) -> BatchRows:
        """Rows for one training batch's keys (``positions`` in its grid, whose fields' runs
        begin at ``bounds``); the table's clock advances by one batch."""
        g = self._grouped(table, keys, bounds)
        known, missing = len(g.found), g.missing
        if not len(missing):
            return BatchRows(g.found, g.inverse.astype(np.int32))
        if self.sketch is None:
            rows = np.concatenate([g.found, table.create(missing)])
            self.admitted += len(missing)
            return BatchRows(rows, g.inverse.astype(np.int32))
        rows = np.concatenate([g.found, np.empty(len(missing), dtype=np.int64)])
        ok = self.sketch.estimate(missing) + g.counts >= self.min_count
        admit, reject = np.flatnonzero(ok), np.flatnonzero(~ok)
        if admit.size:
            rows[known + admit] = table.create(missing[admit])
            self.admitted += len(admit)
        if not reject.size:
            return BatchRows(rows, g.inverse.astype(np.int32))
        rows[known + reject] = field_of(positions[g.first[reject]], bounds)  # its default row
        self.rejected += int(g.counts[reject].sum())
        self.rejected_keys += len(reject)
        table.touch(rows[known + reject])
        # several keys on one default row: each row once
        rows, again = np.unique(rows, return_inverse=True)
        return BatchRows(rows, again.reshape(-1)[g.inverse].astype(np.int32),
                         (missing[reject], g.counts[reject]))

    def tick(self, now: float) -> None:
        """Halve the counters once per ``age_s`` seconds (with ``expire_s``)."""
        if self.age_s and now - self.aged_time >= self.age_s:
            self.aged_time = now
            self.age()

    def age(self) -> None:
        """One horizon has passed: halve every counter."""
        if self.sketch is not None:
            self.sketch.halve()

    def trained(self, pending: tuple[np.ndarray, np.ndarray] | None) -> None:
        """A batch's gradients were applied: count the sightings of its keys that had no row."""
        if pending is not None and self.sketch is not None:
            self.sketch.add(*pending)

    def restore_counts(self, counts: dict[str, int]) -> None:
        """Go on from a checkpoint's counts (the sketch itself is not kept: it starts empty)."""
        self.admitted = int(counts.get("admitted", 0))
        self.rejected = int(counts.get("rejected", 0))
        self.rejected_keys = int(counts.get("rejected_keys", 0))

    def counters(self) -> dict[str, int]:
        s = self.sketch
        return {"admitted": self.admitted, "rejected": self.rejected,
                "rejected_keys": self.rejected_keys,
                "sketch_bytes": s.nbytes if s is not None else 0,
                "sketch_halvings": s.halvings if s is not None else 0}
