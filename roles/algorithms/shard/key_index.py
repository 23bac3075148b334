"""``KeyIndex``: an open-addressing hash map int64 key -> row number, linear probing, for a
shard's embedding table. Every operation works on whole arrays of keys: a probe loop runs once
per probe *distance* over all keys still probing, so a batch of thousands of keys costs a
handful of numpy passes (compiled: one loop, ``kernels``).

Layout. A slot holds only a row number (int32; ``EMPTY``, ``TOMBSTONE`` below zero); the key
lives once per *row*, in ``row_keys`` (int64), which the table reads too (the key of a live
row). A probe reads the slot, then the key of the slot's row: two random reads, as with a key
beside the row in each slot, but a slot is 4 bytes, not 16. At the loads below (3/16 to 1/2
of the slots live) that is 8 to 21 bytes of index a key, not 32 to 85 (a shard of 3.85M keys:
34 MB against 134). Row numbers are below 2**31 (a shard with that many rows would hold 275 GB
of float32 state at dimension 16).

Deletion leaves a *tombstone* in the key's slot (a probe walks over it, an insert may reuse
it). Live entries plus tombstones are kept at most ``MAX_LOAD`` of the slots: when an insert
would pass that, the index is rebuilt (every live key placed again, tombstones gone) at the
smallest power-of-two size that leaves it at most ``REBUILD_LOAD`` full. So between two
rebuilds at least an eighth of the slots is filled or deleted, and a rebuild's cost, one pass
over the slots, is paid at most once per ``capacity / 8`` inserts. An insert reuses the
tombstones on its probe path, so under churn (as many keys dropped as added) the index keeps
its size: like the table's rows, it stays at the size of the most keys it held at once.
(Backward-shift deletion would need no rebuild but moves entries one key at a time: it does not
vectorise.)

``live_slots``/``delete_slots`` let a sweep walk the slots in chunks and delete what it finds
without probing; a slot number is valid until the next insert (which may rebuild).
"""

from __future__ import annotations

import numpy as np

from roles.algorithms.shard import kernels
from roles.algorithms.shard.kernels import EMPTY, TOMBSTONE
from roles.data.keyspace import splitmix64

MAX_ROWS = np.iinfo(np.int32).max   # row numbers are below this (a slot is an int32)
MAX_LOAD = 0.5        # live + tombstones, of the slots
REBUILD_LOAD = 0.375  # live, of the slots, right after a rebuild
MIN_SLOTS = 16


def _size_for(needed: int) -> int:
    size = MIN_SLOTS
    while needed > REBUILD_LOAD * size:
        size *= 2
    return size


class KeyIndex:
    def __init__(self, capacity: int = 1024, compiled: bool = kernels.COMPILED):
        """``compiled``: probe and insert with the compiled loops (``kernels``), else with
        the numpy passes below (the same results; the suite runs both)."""
        self._loops = kernels.loops() if compiled else None
        size = 1 << max(4, int(capacity - 1).bit_length())
        self._slot_rows = np.full(size, EMPTY, dtype=np.int32)        # each slot's row
        self._row_keys = np.zeros(max(capacity, 1), dtype=np.int64)   # each row's key
        self._count = 0       # live keys
        self._tombstones = 0
        self.rebuilds = 0

    def __len__(self) -> int:
        return self._count

    @property
    def capacity(self) -> int:
        """Slots (a power of two)."""
        return len(self._slot_rows)

    @property
    def tombstones(self) -> int:
        return self._tombstones

    @property
    def nbytes(self) -> int:
        return self._slot_rows.nbytes + self._row_keys.nbytes

    def reserve_rows(self, rows: int) -> None:
        """Room for the keys of row numbers below ``rows`` (the table calls it as it grows;
        an insert past the end grows the keys itself, doubling)."""
        if rows > len(self._row_keys):
            grown = np.zeros(rows, dtype=np.int64)
            grown[:len(self._row_keys)] = self._row_keys
            self._row_keys = grown

    def keys_of(self, rows: np.ndarray | slice) -> np.ndarray:
        """The key of each row (live rows; a freed row still shows the key it last held)."""
        return self._row_keys[rows]

    def _home(self, keys: np.ndarray) -> np.ndarray:
        return (splitmix64(keys.view(np.uint64)) & np.uint64(self.capacity - 1)).astype(np.int64)

    def _probe(self, keys: np.ndarray, slots: bool) -> np.ndarray:
        """Each key's row (``slots``: its slot), -1 where the key is absent. The first probe, at
        every key's home, works on whole arrays (no gather through a list of the keys still
        probing: on a Criteo batch most keys are found there, and the gathers cost as much as
        the probe); later probes on the few keys still walking."""
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        if self._loops is not None:
            return self._loops.probe(self._slot_rows, self._row_keys, keys, slots)
        found = np.full(len(keys), -1, dtype=np.int64)
        pos = self._home(keys)
        rows = self._slot_rows[pos]
        hit = (rows >= 0) & (self._row_keys[np.maximum(rows, 0)] == keys)
        found[hit] = (pos if slots else rows)[hit]
        active = np.flatnonzero((rows != EMPTY) & ~hit)   # tombstones are walked over
        pos = pos[active]
        mask = self.capacity - 1
        while active.size:
            pos = (pos + 1) & mask
            rows = self._slot_rows[pos]
            hit = (rows >= 0) & (self._row_keys[np.maximum(rows, 0)] == keys[active])
            found[active[hit]] = (pos if slots else rows)[hit]
            walking = (rows != EMPTY) & ~hit
            active, pos = active[walking], pos[walking]
        return found

    def _slots(self, keys: np.ndarray) -> np.ndarray:
        """Slot of each key, -1 where the key is absent."""
        return self._probe(keys, slots=True)

    def find(self, keys: np.ndarray) -> np.ndarray:
        """Row of each key, -1 where the key is absent."""
        return self._probe(keys, slots=False)

    def insert(self, keys: np.ndarray, rows: np.ndarray) -> None:
        """Add distinct keys that are not in the index yet."""
        if not len(keys):
            return
        rows = np.asarray(rows, dtype=np.int64)
        top, bottom = int(rows.max()), int(rows.min())
        if top >= MAX_ROWS or bottom < 0:
            raise ValueError(f"a key index holds row numbers in [0, {MAX_ROWS}); got "
                             f"{top if top >= MAX_ROWS else bottom}")
        if top >= len(self._row_keys):
            self.reserve_rows(max(top + 1, 2 * len(self._row_keys)))
        if self._count + self._tombstones + len(keys) > MAX_LOAD * self.capacity:
            self._rebuild(self._count + len(keys))
        self._place(np.asarray(keys, dtype=np.int64), rows)
        self._count += len(keys)

    def _place(self, keys: np.ndarray, rows: np.ndarray) -> None:
        """Put distinct absent keys in the first free slot (empty, or a tombstone) of their
        probe paths. Keys that reach the same free slot in one round settle it without a
        sort: each writes a code of its own there (below ``TOMBSTONE``), the one whose code
        stayed takes the slot, the others walk on. (Compiled: one key after another, each in
        the first free slot of its path.)"""
        if self._loops is not None:
            self._tombstones -= self._loops.place(self._slot_rows, self._row_keys,
                                                  np.ascontiguousarray(keys, dtype=np.int64),
                                                  np.ascontiguousarray(rows, dtype=np.int64))
            return
        pos = self._home(keys)
        todo = np.arange(len(keys))
        mask = self.capacity - 1
        while todo.size:
            before = self._slot_rows[pos]
            free = np.flatnonzero(before < 0)
            if free.size:
                slots = pos[free]
                codes = np.arange(TOMBSTONE - 1, TOMBSTONE - 1 - free.size, -1, dtype=np.int32)
                self._slot_rows[slots] = codes
                won = free[self._slot_rows[slots] == codes]
                taken, winners = pos[won], todo[won]
                self._tombstones -= int(np.count_nonzero(before[won] == TOMBSTONE))
                self._slot_rows[taken] = rows[winners]
                self._row_keys[rows[winners]] = keys[winners]
                walking = np.ones(todo.size, dtype=bool)
                walking[won] = False
                todo, pos = todo[walking], pos[walking]
            pos = (pos + 1) & mask

    def _rebuild(self, needed: int) -> None:
        keys, rows = self.items()
        size = _size_for(needed)
        self._slot_rows = np.full(size, EMPTY, dtype=np.int32)
        self._tombstones = 0
        self.rebuilds += 1
        self._place(keys, rows)

    def delete(self, keys: np.ndarray) -> np.ndarray:
        """Remove distinct keys; the row each had (-1 where it was absent)."""
        slots = self._slots(keys)
        found = slots >= 0
        rows = np.full(len(slots), -1, dtype=np.int64)
        rows[found] = self._slot_rows[slots[found]]
        self.delete_slots(slots[found])
        return rows

    def delete_slots(self, slots: np.ndarray) -> None:
        """Remove the live entries in these distinct slots."""
        self._slot_rows[slots] = TOMBSTONE
        self._count -= len(slots)
        self._tombstones += len(slots)

    def live_slots(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The live entries among slots [start, stop): their slots, keys and rows."""
        rows = self._slot_rows[start:stop]
        at = np.flatnonzero(rows >= 0)
        rows = rows[at].astype(np.int64)
        return at + start, self._row_keys[rows], rows

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """The live keys and their rows (int64 copies), in slot order."""
        rows = self._slot_rows[self._slot_rows >= 0].astype(np.int64)
        return self._row_keys[rows], rows
