"""A shard's embedding table: rows keyed by 64-bit ids, trained with sparse Adagrad, that can
be kept bounded (expiry, eviction: ``roles.algorithms.expiry``; admission:
``roles.algorithms.admission``). Every operation works on whole arrays of keys (no per-key
Python loop); the key -> row map is a ``KeyIndex`` (``roles.algorithms.key_index``).

Rows. ``weights`` and ``accum`` (Adagrad's sum of squared gradients) have one row per row
number below ``size``. Rows ``[0, defaults)`` are the *default rows*, one per sparse field
(admission maps a key it has not admitted yet to its field's default row); they start at zero,
are trained like any row, have no key and never expire. Every other row below ``size`` is live
(a key maps to it) or free. A dropped key's row (expired, evicted) goes on a free list and is
reused for a new key; rows are never renumbered while the table serves, so a row number a held
batch keeps stays valid — except by ``release`` (a placement handover), which compacts the rows.

A new key's row is a pure function of (key, seed): uniform in [-init, init], the same on any
shard, after any restart, in any order of arrival (also when it comes back after expiry).

Recency. ``clock`` counts the batches whose keys the shard looked up (the shard advances it);
``last_seen[row]`` is the clock of the row's latest look-up (or creation), which expiry and
eviction go by.

What a checkpoint (or an export, or a handover) needs:

- ``live()``: the live keys and their row numbers (free and default rows excluded);
  ``weights[rows]`` and ``accum[rows]`` are their state. ``accept(keys, weights, accum)`` loads
  them back (a restore, a handover).
- ``default_state()`` / ``restore_defaults(weights, accum)``: the default rows' state.
- ``mark()`` then ``dropped_since_mark()``: the keys removed from the table (expired, evicted
  or handed over) since the latest ``mark()``, so an incremental checkpoint can say which keys
  disappeared since the previous one. Nothing is recorded before the first ``mark()`` (memory
  must not grow in a job that never calls it). A key dropped and then created again since the
  mark is in both ``dropped_since_mark()`` and ``live()``: apply the drops first.
- Rows change in ``create`` (new keys: a new initial row in a new or reused row number),
  ``adagrad`` (trained), ``accept`` and ``release`` (which renumbers every row).
"""

from __future__ import annotations

import numpy as np

from roles.algorithms.key_index import KeyIndex
from roles.data.hashing import splitmix64


def initial_rows(keys: np.ndarray, dim: int, scale: float, seed: int) -> np.ndarray:
    """Deterministic initial rows: uniform in [-scale, scale] from a hash of (key, seed, j)."""
    base = splitmix64(keys.view(np.uint64) ^ splitmix64(np.array([seed], dtype=np.uint64)))
    with np.errstate(over="ignore"):
        bits = splitmix64(base[:, None] + np.arange(1, dim + 1, dtype=np.uint64)[None, :])
    unit = (bits >> np.uint64(40)).astype(np.float64) / float(1 << 24)   # [0, 1)
    return ((2.0 * unit - 1.0) * scale).astype(np.float32)


class EmbeddingTable:
    def __init__(self, dim: int, init_scale: float, lr: float, seed: int = 0,
                 eps: float = 1e-10, capacity: int = 1024, defaults: int = 0):
        self.dim, self.init_scale, self.lr, self.seed, self.eps = dim, init_scale, lr, seed, eps
        self.defaults = defaults
        self.index = KeyIndex(capacity)
        capacity = max(capacity, defaults, 1)
        self.weights = np.zeros((capacity, dim), dtype=np.float32)
        self.accum = np.zeros((capacity, dim), dtype=np.float32)   # Adagrad sum of g^2
        self.last_seen = np.zeros(capacity, dtype=np.int64)
        self.size = defaults          # row numbers in use: defaults, live and free
        self._free = np.empty(0, dtype=np.int64)   # a stack of free row numbers
        self._free_count = 0
        self.clock = 0
        self.created = 0              # keys given a row, ever
        self._dropped: list[np.ndarray] | None = None   # since the mark; None: not recording

    def __len__(self) -> int:
        """Live keys (default and free rows not counted)."""
        return len(self.index)

    @property
    def free_rows(self) -> int:
        return self._free_count

    @property
    def nbytes(self) -> int:
        """Memory the table's arrays hold (allocated, not only used)."""
        return (self.weights.nbytes + self.accum.nbytes + self.last_seen.nbytes
                + self._free.nbytes + self.index.nbytes)

    # -- look-ups -----------------------------------------------------------------------------
    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """Row of each key (-1: no row); the rows found count as seen now."""
        rows = self.index.find(keys)
        self.last_seen[rows[rows >= 0]] = self.clock
        return rows

    def create(self, keys: np.ndarray) -> np.ndarray:
        """Rows for distinct keys that have none: free row numbers first, then new ones; each
        starts from its key's initial row and no Adagrad state."""
        n = len(keys)
        reused = min(n, self._free_count)
        rows = np.empty(n, dtype=np.int64)
        rows[:reused] = self._free[self._free_count - reused:self._free_count]
        self._free_count -= reused
        fresh = n - reused
        self._reserve(self.size + fresh)
        rows[reused:] = np.arange(self.size, self.size + fresh)
        self.size += fresh
        self.weights[rows] = initial_rows(np.asarray(keys, dtype=np.int64), self.dim,
                                          self.init_scale, self.seed)
        self.accum[rows] = 0.0
        self.last_seen[rows] = self.clock
        self.index.insert(keys, rows)
        self.created += n
        return rows

    def rows_for(self, keys: np.ndarray) -> np.ndarray:
        """Row numbers of distinct keys, creating the rows of keys that have none."""
        rows = self.lookup(keys)
        new = rows < 0
        if new.any():
            rows[new] = self.create(keys[new])
        return rows

    def touch(self, rows: np.ndarray) -> None:
        """These rows count as seen now (a batch still holds them)."""
        self.last_seen[rows] = self.clock

    def _reserve(self, needed: int) -> None:
        if needed <= len(self.weights):
            return
        size = max(needed, 2 * len(self.weights))
        for name in ("weights", "accum", "last_seen"):
            old = getattr(self, name)
            grown = np.zeros((size, *old.shape[1:]), dtype=old.dtype)
            grown[:self.size] = old[:self.size]
            setattr(self, name, grown)

    def adagrad(self, rows: np.ndarray, grads: np.ndarray) -> None:
        """One sparse Adagrad step on distinct rows: acc += g^2; w -= lr * g / (sqrt(acc)+eps)."""
        acc = self.accum[rows] + grads * grads
        self.accum[rows] = acc
        self.weights[rows] -= self.lr * grads / (np.sqrt(acc) + self.eps)

    # -- dropping keys ------------------------------------------------------------------------
    def live(self) -> tuple[np.ndarray, np.ndarray]:
        """The live keys and their row numbers."""
        return self.index.items()

    def drop_slots(self, slots: np.ndarray, keys: np.ndarray, rows: np.ndarray) -> None:
        """Remove the keys in these index slots (``KeyIndex.live_slots``); their rows are
        freed for new keys."""
        if not len(slots):
            return
        self.index.delete_slots(slots)
        self._free_rows(rows)
        if self._dropped is not None:
            self._dropped.append(keys.copy())

    def drop(self, keys: np.ndarray) -> int:
        """Remove distinct keys (absent ones are ignored); how many were here."""
        rows = self.index.delete(np.asarray(keys, dtype=np.int64))
        here = rows >= 0
        self._free_rows(rows[here])
        if self._dropped is not None:
            self._dropped.append(np.asarray(keys, dtype=np.int64)[here])
        return int(here.sum())

    def _free_rows(self, rows: np.ndarray) -> None:
        needed = self._free_count + len(rows)
        if needed > len(self._free):
            grown = np.empty(max(needed, 2 * len(self._free), 1024), dtype=np.int64)
            grown[:self._free_count] = self._free[:self._free_count]
            self._free = grown
        self._free[self._free_count:needed] = rows
        self._free_count = needed

    def idle_rows(self, before: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every live entry last seen before clock ``before``: (slots, keys, rows)."""
        slots, keys, rows = self.index.live_slots(0, self.index.capacity)
        old = self.last_seen[rows] < before
        return slots[old], keys[old], rows[old]

    def least_recent(self, count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Up to ``count`` live entries seen least recently, none seen at the current clock:
        (slots, keys, rows)."""
        slots, keys, rows = self.idle_rows(self.clock)
        if count < len(rows):
            pick = np.argpartition(self.last_seen[rows], count - 1)[:count]
            slots, keys, rows = slots[pick], keys[pick], rows[pick]
        return slots, keys, rows

    def mark(self) -> None:
        """From now on record the keys dropped (``dropped_since_mark``), forgetting earlier
        ones."""
        self._dropped = []

    def dropped_since_mark(self) -> np.ndarray:
        """The distinct keys dropped since the latest ``mark()`` (none before the first)."""
        if not self._dropped:
            return np.empty(0, dtype=np.int64)
        return np.unique(np.concatenate(self._dropped))

    # -- default rows -------------------------------------------------------------------------
    def default_state(self) -> tuple[np.ndarray, np.ndarray]:
        """The default rows' weights and Adagrad state (copies)."""
        d = self.defaults
        return self.weights[:d].copy(), self.accum[:d].copy()

    def restore_defaults(self, weights: np.ndarray, accum: np.ndarray) -> None:
        n = min(self.defaults, len(weights))
        self.weights[:n] = weights[:n]
        self.accum[:n] = accum[:n]

    # -- moving rows between shards -----------------------------------------------------------
    def accept(self, keys: np.ndarray, weights: np.ndarray, accum: np.ndarray) -> None:
        """Take over distinct keys' rows and Adagrad state (a handover from another shard, a
        restore); a key already here is overwritten."""
        if len(keys):
            rows = self.rows_for(np.asarray(keys, dtype=np.int64))
            self.weights[rows] = weights
            self.accum[rows] = accum

    def release(self, leaving: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Remove the keys whose rows are marked in ``leaving`` (bool per row); return their
        keys, rows and Adagrad state. The remaining rows are renumbered (compacted after the
        default rows, free rows gone), so no row number taken before stays valid."""
        keys, rows = self.index.items()
        gone = leaving[rows]
        out = (keys[gone], self.weights[rows[gone]].copy(), self.accum[rows[gone]].copy())
        if self._dropped is not None:
            self._dropped.append(keys[gone])
        stay_keys, stay_rows = keys[~gone], rows[~gone]
        order = np.argsort(stay_rows)
        stay_keys, stay_rows = stay_keys[order], stay_rows[order]
        d, n = self.defaults, len(stay_rows)
        self.weights[d:d + n] = self.weights[stay_rows]
        self.accum[d:d + n] = self.accum[stay_rows]
        self.last_seen[d:d + n] = self.last_seen[stay_rows]
        self.index = KeyIndex(max(1024, 2 * n))
        self.index.insert(stay_keys, np.arange(d, d + n, dtype=np.int64))
        self.size = d + n
        self._free_count = 0
        return out
