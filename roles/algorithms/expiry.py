"""Expiry and eviction (``[embeddings] expire_batches``, ``expire_s``, ``max_rows_per_shard``):
what keeps a shard's table bounded when the data's keys are not (pure; the shard calls
``tick`` from its loop with the clock and the rows its held batches use).

**Expiry.** A key whose row was not looked up for ``expire_batches`` of the shard's batches, or
for ``expire_s`` seconds, is dropped and its row freed for a new key. Rows are dropped by
*sweeps*: a pass over the index's slots, started every ``expire_batches / 8`` batches or
``expire_s / 8`` seconds, done in at most ``SWEEP_CHUNKS`` pieces (one per tick, each at least
``MIN_CHUNK`` slots), so one tick's work is bounded (a sixteenth of the index, or less) and a
row is dropped at most about an eighth of the horizon late. A pass drops the rows last seen
before the clock ``before`` it fixes when it starts: ``table.clock - expire_batches + 1`` (not
in the latest ``expire_batches`` batches), and for
``expire_s`` the clock at the newest *time mark* at least ``expire_s`` old. Time marks
(clock, monotonic time) are taken every ``expire_s / 32`` seconds and only the ones the horizon
needs are kept (about 33): a row's time is its clock, so no per-row time is stored, and a row
expires at most ``expire_s / 32`` late by time. A mark taken when no batch came since the
previous one advances the clock by one, so that on an idle shard the rows of the last batch
expire too (``expire_batches`` then also counts those marks: at most 32 per ``expire_s``).

**Eviction.** When the table holds more than ``max_rows_per_shard`` keys, the least recently
seen are dropped down to ``EVICT_MARGIN`` below the cap (one pass over the index and an
``argpartition`` of the last-seen clocks: a batch of evictions every ``cap / 16`` new keys, not
one per key). Between ticks the table may pass the cap by the keys of the batches of one tick.

**Held batches.** A row that a held batch uses must not be dropped (its number would be given
to another key while the batch's gradients are on their way). When a pass starts, and before
an eviction, every held row is *touched* (counted as seen now), so it is newer than anything
the pass or the eviction drops; rows looked up later are newer still. If held rows alone
exceed the cap, eviction stops short and waits for the table to grow by the margin again.

A sweep that meets an index rebuild (a big insert) goes on from its slot number in the new
layout: a key may be visited twice or missed by that pass, never dropped wrongly (the test is
its last-seen clock).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable

import numpy as np

from roles.algorithms.embedding_table import EmbeddingTable

SWEEP_PASSES = 8      # passes per horizon
SWEEP_CHUNKS = 16     # a pass in at most this many ticks
MIN_CHUNK = 1 << 16   # slots a tick sweeps at least
TIME_MARKS = 32       # time marks per expire_s
EVICT_MARGIN = 1 / 16


class Expiry:
    def __init__(self, expire_batches: int, expire_s: float, max_rows: int, now: float):
        self.after_batches, self.after_s, self.cap = expire_batches, expire_s, max_rows
        self.marks: deque[tuple[int, float]] = deque([(0, now)])
        self.cursor = -1          # next slot of the pass under way; -1: none
        self.before = 0           # that pass drops the rows last seen before this clock
        self.next_clock = max(1, expire_batches // SWEEP_PASSES)
        self.next_time = now + expire_s / SWEEP_PASSES
        self.evict_above = max_rows
        self.expired = 0
        self.evicted = 0
        self.sweeps = 0           # passes completed
        self.evictions = 0        # batches of evictions

    @property
    def expiring(self) -> bool:
        return bool(self.after_batches or self.after_s)

    def tick(self, table: EmbeddingTable, now: float,
             held: Callable[[], Iterable[np.ndarray]]) -> None:
        """The upkeep due now: a time mark, an eviction, a piece of a sweep. ``held`` gives
        the row numbers of every batch the shard holds."""
        if self.after_s:
            self._mark(table, now)
        if self.cap and len(table) > self.evict_above:
            self._evict(table, held)
        if not self.expiring:
            return
        if self.cursor < 0:
            if not self._due(table.clock, now):
                return
            self._start(table, now, held)
            if self.cursor < 0:
                return
        self._sweep(table)

    # -- expiry -------------------------------------------------------------------------------
    def _mark(self, table: EmbeddingTable, now: float) -> None:
        last_clock, last_time = self.marks[-1]
        if now - last_time >= self.after_s / TIME_MARKS:
            if table.clock == last_clock:
                table.clock += 1      # idle: rows seen before this mark must be older than it
            self.marks.append((table.clock, now))
        while len(self.marks) >= 2 and self.marks[1][1] <= now - self.after_s:
            self.marks.popleft()

    def _time_before(self, now: float) -> int:
        clock, at = self.marks[0]
        return clock if at <= now - self.after_s else 0

    def _due(self, clock: int, now: float) -> bool:
        return bool((self.after_batches and clock >= self.next_clock)
                    or (self.after_s and now >= self.next_time))

    def _start(self, table: EmbeddingTable, now: float,
               held: Callable[[], Iterable[np.ndarray]]) -> None:
        self.next_clock = table.clock + max(1, self.after_batches // SWEEP_PASSES)
        self.next_time = now + self.after_s / SWEEP_PASSES
        before = 0
        if self.after_batches:   # not seen in the last after_batches batches
            before = table.clock - self.after_batches + 1
        if self.after_s:
            before = max(before, self._time_before(now))
        if before <= 0 or not len(table):
            return
        _touch_held(table, held)
        self.before, self.cursor = before, 0

    def _sweep(self, table: EmbeddingTable) -> None:
        slots = table.index.capacity
        chunk = max(MIN_CHUNK, -(-slots // SWEEP_CHUNKS))
        at, keys, rows = table.index.live_slots(self.cursor, self.cursor + chunk)
        old = table.last_seen[rows] < self.before
        table.drop_slots(at[old], keys[old], rows[old])
        self.expired += int(old.sum())
        self.cursor += chunk
        if self.cursor >= table.index.capacity:
            self.cursor = -1
            self.sweeps += 1

    # -- eviction -----------------------------------------------------------------------------
    def _evict(self, table: EmbeddingTable, held: Callable[[], Iterable[np.ndarray]]) -> None:
        margin = max(1, int(self.cap * EVICT_MARGIN))
        _touch_held(table, held)
        slots, keys, rows = table.least_recent(len(table) - (self.cap - margin))
        table.drop_slots(slots, keys, rows)
        self.evicted += len(slots)
        self.evictions += 1
        self.evict_above = max(self.cap, len(table) + margin)

    def counters(self) -> dict[str, int]:
        return {"expired": self.expired, "evicted": self.evicted, "sweeps": self.sweeps,
                "evictions": self.evictions}


def _touch_held(table: EmbeddingTable, held: Callable[[], Iterable[np.ndarray]]) -> None:
    rows = list(held())
    if rows:
        table.touch(np.concatenate(rows))
