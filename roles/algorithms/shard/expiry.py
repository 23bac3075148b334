"""Expiry and eviction (``[embeddings] expire_batches``, ``expire_s``, ``max_rows_per_shard``):
what keeps a shard's table bounded when the data's keys are not (pure; the shard calls
``tick`` from its loop with the clock and the rows its held batches use).

**Expiry.** A key whose row was not looked up for ``expire_batches`` of the shard's batches, or
for ``expire_s`` seconds, is dropped and its row freed for a new key. Rows are dropped by
*passes* over the table's rows (its last-seen clocks, a contiguous array, by row number), one
started every ``expire_batches / 8`` batches or ``expire_s / 8`` seconds, each done in pieces
of ``rows / 16`` rows (at least ``MIN_PIECE``, at most ``MAX_PIECE``; a piece ends early after
``MAX_DROPS`` dropped rows), one piece per tick: one tick's work is bounded, and a row is
dropped at most about an eighth of the horizon late (more when a pass has very many to drop). A
pass drops the rows last seen before the clock ``before`` it fixes when it starts:
``table.clock - expire_batches + 1`` (not in the latest ``expire_batches`` batches), and for
``expire_s`` the clock at the newest *time mark* at least ``expire_s`` old. Time marks
(clock, monotonic time) are taken every ``expire_s / 32`` seconds and only the ones the horizon
needs are kept (about 33): a row's time is its clock, so no per-row time is stored, and a row
expires at most ``expire_s / 32`` late by time. A mark taken when no batch came since the
previous one advances the clock by one, so that on an idle shard the rows of the last batch
expire too (``expire_batches`` then also counts those marks: at most 32 per ``expire_s``).

**Eviction.** When the table holds more than ``max_rows_per_shard`` keys, the least recently
seen are dropped down to ``EVICT_MARGIN`` below the cap: the clock below which that many rows
lie is read from a sample of ``SAMPLE`` rows' last-seen clocks, and a pass (as expiry's, in
pieces) drops the rows seen before it; a pass under way is restarted with the higher bound.
So eviction comes in batches (one per ``cap / 16`` new keys), never costs more than a piece
per tick, and the cap can be passed by the keys admitted while its pass runs (a few ticks).
A sample's error moves the figure by a few tenths of a percent of the cap; rows last seen in
the same batch go together.

**Held batches.** A row that a held batch uses must not be dropped (its number would be given
to another key while the batch's gradients are on their way). When a pass starts, and when
eviction raises one, every held row is *touched* (counted as seen now), so it is newer than
anything the pass drops; rows looked up later are newer still. If held rows alone exceed the
cap, eviction stops short and waits for the table to grow by the margin again.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable

import numpy as np

from roles.algorithms.shard.embedding_table import EmbeddingTable

SWEEP_PASSES = 8        # passes per horizon
PIECES = 16             # a pass in this many ticks, when the pieces' bounds allow
MIN_PIECE = 1 << 16     # rows a tick walks at least ...
MAX_PIECE = 1 << 20     # ... and at most
MAX_DROPS = 1 << 15     # rows a tick drops at most
TIME_MARKS = 32         # time marks per expire_s
EVICT_MARGIN = 1 / 16
SAMPLE = 1 << 16        # rows whose last-seen clocks set an eviction's bound


class Expiry:
    def __init__(self, expire_batches: int, expire_s: float, max_rows: int, now: float,
                 seed: int = 0):
        self.after_batches, self.after_s, self.cap = expire_batches, expire_s, max_rows
        self.marks: deque[tuple[int, float]] = deque([(0, now)])
        self.cursor = -1          # next row of the pass under way; -1: none
        self.expire_before = 0    # the pass drops rows last seen before these clocks: as
        self.evict_before = 0     # expired, and (the rest) as evicted
        self.next_clock = max(1, expire_batches // SWEEP_PASSES)
        self.next_time = now + expire_s / SWEEP_PASSES
        self.evict_above = max_rows
        self.rng = np.random.default_rng(seed)
        self.expired = 0
        self.evicted = 0
        self.sweeps = 0           # passes completed
        self.evictions = 0        # eviction bounds set

    @property
    def expiring(self) -> bool:
        return bool(self.after_batches or self.after_s)

    def tick(self, table: EmbeddingTable, now: float,
             held: Callable[[], Iterable[np.ndarray]]) -> None:
        """The upkeep due now: a time mark, a pass started, a piece of it. ``held`` gives the
        row numbers of every batch the shard holds."""
        if self.after_s:
            self._mark(table, now)
        if self.cap and len(table) > self.evict_above:
            self._evict(table, held)
        if self.cursor < 0 and self.expiring and self._due(table.clock, now):
            self._start(table, now, held)
        if self.cursor >= 0:
            self._piece(table)

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
        self.expire_before, self.evict_before, self.cursor = before, 0, table.defaults

    def _piece(self, table: EmbeddingTable) -> None:
        span = table.size - table.defaults
        piece = max(MIN_PIECE, min(MAX_PIECE, -(-span // PIECES)))
        before = max(self.expire_before, self.evict_before)
        rows = table.rows_seen_before(self.cursor, self.cursor + piece, before)
        if len(rows) > MAX_DROPS:   # the deletions are the dearer part: a bounded number
            rows = rows[:MAX_DROPS]
            piece = int(rows[-1]) + 1 - self.cursor
        if len(rows):
            expired = int(np.count_nonzero(table.last_seen[rows] < self.expire_before))
            self.expired += expired
            self.evicted += len(rows) - expired
            table.drop_rows(rows)
        self.cursor += piece
        if self.cursor >= table.size:
            self.cursor = -1
            self.sweeps += 1
            if self.evict_before:
                margin = max(1, int(self.cap * EVICT_MARGIN))
                self.evict_above = self.cap if len(table) <= self.cap else \
                    len(table) + margin
                self.expire_before = self.evict_before = 0

    # -- eviction -----------------------------------------------------------------------------
    def _evict(self, table: EmbeddingTable, held: Callable[[], Iterable[np.ndarray]]) -> None:
        """Start (or raise) a pass that drops the least recently seen rows down to the margin
        below the cap."""
        margin = max(1, int(self.cap * EVICT_MARGIN))
        excess = len(table) - (self.cap - margin)
        _touch_held(table, held)
        bound = table.clock_quantile(excess / len(table), SAMPLE, self.rng) + 1
        bound = min(bound, table.clock)    # never the rows of the latest batch
        self.evict_above = 1 << 62         # until this pass is over
        if bound <= max(self.evict_before, self.expire_before if self.cursor >= 0 else 0):
            self.evict_above = len(table) + margin   # nothing more to drop: wait to grow
            return
        self.evict_before = bound
        self.evictions += 1
        if self.cursor < 0:
            self.expire_before = 0
        self.cursor = table.defaults       # (re)start the pass with the higher bound

    def restore_counts(self, counts: dict[str, int]) -> None:
        """Go on from a checkpoint's counts."""
        for name in ("expired", "evicted", "sweeps", "evictions"):
            setattr(self, name, int(counts.get(name, 0)))

    def counters(self) -> dict[str, int]:
        return {"expired": self.expired, "evicted": self.evicted, "sweeps": self.sweeps,
                "evictions": self.evictions}


def _touch_held(table: EmbeddingTable, held: Callable[[], Iterable[np.ndarray]]) -> None:
    rows = list(held())
    if rows:
        table.touch(np.concatenate(rows))
