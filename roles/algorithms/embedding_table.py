"""A shard's embedding table: rows keyed by 64-bit ids, created on first sight, trained with
sparse Adagrad. Every operation works on whole arrays of keys (no per-key Python loop).

``KeyIndex`` is an open-addressing hash map int64 key -> row, linear probing, kept at most half
full; a probe loop runs once per probe *distance* over all keys still probing, so a batch of
thousands of keys costs a handful of numpy passes. Rows are appended, never moved, so a row
number stays valid for the life of the table.

A new key's row is a pure function of (key, seed): uniform in [-init, init], the same on any
shard, after any restart, in any order of arrival.

For incremental checkpoints the table marks the rows it changes (``dirty``: created, trained,
taken over) until ``clear_dirty``; ``renumbered`` says the rows were compacted since (a
handover), so that the next checkpoint must hold the whole table.
"""

from __future__ import annotations

import numpy as np

from roles.data.hashing import splitmix64

MAX_LOAD = 0.5


class KeyIndex:
    def __init__(self, capacity: int = 1024):
        size = 1 << max(4, int(capacity - 1).bit_length())
        self._keys = np.zeros(size, dtype=np.int64)
        self._rows = np.full(size, -1, dtype=np.int64)   # -1: empty slot
        self._count = 0

    def __len__(self) -> int:
        return self._count

    @property
    def capacity(self) -> int:
        return len(self._rows)

    def _home(self, keys: np.ndarray) -> np.ndarray:
        return (splitmix64(keys.view(np.uint64)) & np.uint64(self.capacity - 1)).astype(np.int64)

    def find(self, keys: np.ndarray) -> np.ndarray:
        """Row of each key, -1 where the key is absent."""
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        out = np.full(len(keys), -1, dtype=np.int64)
        pos = self._home(keys)
        active = np.arange(len(keys))
        mask = self.capacity - 1
        while active.size:
            p = pos[active]
            rows = self._rows[p]
            hit = (rows >= 0) & (self._keys[p] == keys[active])
            out[active[hit]] = rows[hit]
            probing = (rows >= 0) & ~hit
            active = active[probing]
            pos[active] = (p[probing] + 1) & mask
        return out

    def insert(self, keys: np.ndarray, rows: np.ndarray) -> None:
        """Add distinct keys that are not in the index yet."""
        if not len(keys):
            return
        if (self._count + len(keys)) > MAX_LOAD * self.capacity:
            self._grow(self._count + len(keys))
        self._place(np.asarray(keys, dtype=np.int64), np.asarray(rows, dtype=np.int64))
        self._count += len(keys)

    def _place(self, keys: np.ndarray, rows: np.ndarray) -> None:
        pos = self._home(keys)
        active = np.arange(len(keys))
        mask = self.capacity - 1
        while active.size:
            p = pos[active]
            free = self._rows[p] < 0
            # among keys that reached the same free slot, the first takes it
            slots, first = np.unique(p[free], return_index=True)
            winners = active[free][first]
            self._keys[slots] = keys[winners]
            self._rows[slots] = rows[winners]
            placed = np.zeros(len(keys), dtype=bool)
            placed[winners] = True
            moving = active[~free]
            pos[moving] = (pos[moving] + 1) & mask
            active = active[~placed[active]]

    def _grow(self, needed: int) -> None:
        occupied = self._rows >= 0
        keys, rows = self._keys[occupied], self._rows[occupied]
        size = self.capacity
        while needed > MAX_LOAD * size:
            size *= 2
        self._keys = np.zeros(size, dtype=np.int64)
        self._rows = np.full(size, -1, dtype=np.int64)
        self._place(keys, rows)

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        occupied = self._rows >= 0
        return self._keys[occupied].copy(), self._rows[occupied].copy()


def initial_rows(keys: np.ndarray, dim: int, scale: float, seed: int) -> np.ndarray:
    """Deterministic initial rows: uniform in [-scale, scale] from a hash of (key, seed, j)."""
    base = splitmix64(keys.view(np.uint64) ^ splitmix64(np.array([seed], dtype=np.uint64)))
    with np.errstate(over="ignore"):
        bits = splitmix64(base[:, None] + np.arange(1, dim + 1, dtype=np.uint64)[None, :])
    unit = (bits >> np.uint64(40)).astype(np.float64) / float(1 << 24)   # [0, 1)
    return ((2.0 * unit - 1.0) * scale).astype(np.float32)


class EmbeddingTable:
    def __init__(self, dim: int, init_scale: float, lr: float, seed: int = 0,
                 eps: float = 1e-10, capacity: int = 1024):
        self.dim, self.init_scale, self.lr, self.seed, self.eps = dim, init_scale, lr, seed, eps
        self.index = KeyIndex(capacity)
        self.weights = np.empty((capacity, dim), dtype=np.float32)
        self.accum = np.empty((capacity, dim), dtype=np.float32)   # Adagrad sum of g^2
        self.dirty = np.zeros(capacity, dtype=bool)  # changed since the last checkpoint
        self.renumbered = False
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def rows_for(self, keys: np.ndarray) -> np.ndarray:
        """Row numbers of distinct keys, creating the rows of keys seen for the first time."""
        rows = self.index.find(keys)
        new = rows < 0
        if new.any():
            fresh = keys[new]
            rows[new] = np.arange(self.size, self.size + len(fresh))
            self._reserve(self.size + len(fresh))
            self.weights[self.size:self.size + len(fresh)] = initial_rows(
                fresh, self.dim, self.init_scale, self.seed)
            self.accum[self.size:self.size + len(fresh)] = 0.0
            self.dirty[self.size:self.size + len(fresh)] = True
            self.index.insert(fresh, rows[new])
            self.size += len(fresh)
        return rows

    def _reserve(self, needed: int) -> None:
        if needed <= len(self.weights):
            return
        size = max(needed, 2 * len(self.weights))
        for name in ("weights", "accum"):
            old = getattr(self, name)
            grown = np.empty((size, self.dim), dtype=np.float32)
            grown[:self.size] = old[:self.size]
            setattr(self, name, grown)
        dirty = np.zeros(size, dtype=bool)
        dirty[:self.size] = self.dirty[:self.size]
        self.dirty = dirty

    def adagrad(self, rows: np.ndarray, grads: np.ndarray) -> None:
        """One sparse Adagrad step on distinct rows: acc += g^2; w -= lr * g / (sqrt(acc)+eps)."""
        acc = self.accum[rows] + grads * grads
        self.accum[rows] = acc
        self.weights[rows] -= self.lr * grads / (np.sqrt(acc) + self.eps)
        self.dirty[rows] = True

    def accept(self, keys: np.ndarray, weights: np.ndarray, accum: np.ndarray) -> None:
        """Take over distinct keys' rows and Adagrad state from another shard (a handover);
        a key already here is overwritten."""
        if len(keys):
            rows = self.rows_for(np.asarray(keys, dtype=np.int64))
            self.weights[rows] = weights
            self.accum[rows] = accum
            self.dirty[rows] = True

    def release(self, leaving: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Remove the keys whose rows are marked in ``leaving`` (bool per row); return their
        keys, rows and Adagrad state. The remaining rows are renumbered (compacted), so no row
        number taken before stays valid."""
        keys, rows = self.index.items()
        gone = leaving[rows]
        out = (keys[gone], self.weights[rows[gone]].copy(), self.accum[rows[gone]].copy())
        stay_keys, stay_rows = keys[~gone], rows[~gone]
        order = np.argsort(stay_rows)
        stay_keys, stay_rows = stay_keys[order], stay_rows[order]
        n = len(stay_rows)
        self.weights[:n] = self.weights[stay_rows]
        self.accum[:n] = self.accum[stay_rows]
        self.index = KeyIndex(max(1024, 2 * n))
        self.index.insert(stay_keys, np.arange(n, dtype=np.int64))
        self.size = n
        self.renumbered = True
        return out

    def clear_dirty(self) -> None:
        """A checkpoint took the table as it is: nothing has changed since."""
        self.dirty[:self.size] = False
        self.renumbered = False

    def key_of_row(self) -> tuple[np.ndarray, np.ndarray]:
        """The key of each row below ``size`` and whether the row holds one."""
        keys, rows = self.index.items()
        by_row = np.zeros(self.size, dtype=np.int64)
        live = np.zeros(self.size, dtype=bool)
        by_row[rows] = keys
        live[rows] = True
        return by_row, live
