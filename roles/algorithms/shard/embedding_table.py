"""A shard's embedding table: rows keyed by 64-bit ids, trained with sparse Adagrad, that can
be kept bounded (expiry, eviction: ``roles.algorithms.shard.expiry``; admission:
``roles.algorithms.shard.admission``). Every operation works on whole arrays of keys (no per-key
Python loop); the key -> row map is a ``KeyIndex`` (``roles.algorithms.shard.key_index``).

Rows. ``weights`` and ``accum`` (Adagrad's sum of squared gradients: one per value, or one per
row with ``rowwise``, ``accum`` then [rows, 1]) have one row per row number below ``size``. Rows
``[0, defaults)`` are the *default rows*, one per sparse field (admission maps a key it has not
admitted yet to its field's default row); they start at zero, are trained like any row, have no
key and never expire. Every other row below ``size`` is live (a key maps to it) or free. A
dropped key's row (expired, evicted) goes on a free list and is reused for a new key; rows are
never renumbered while the table serves, so a row number a held batch keeps stays valid — except
by ``release`` (a placement handover), which compacts the rows.

A new key's row is a pure function of (key, seed): uniform in [-init, init], the same on any
shard, after any restart, in any order of arrival (also when it comes back after expiry).

Recency. ``clock`` counts the batches whose keys the shard looked up (the shard advances it);
``last_seen[row]`` is the clock of the row's latest look-up (or creation), which expiry and
eviction go by (``FREE`` for a row that holds no key); a live row's key is the index's
(``index.keys_of``: the index keeps one key per row, its slots only row numbers).
Expiry and eviction walk these two contiguous arrays by row number (``rows_seen_before``),
not the index's slots, and probe the index only for the keys they drop.

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
- ``dirty``: the rows changed since ``clear_dirty()`` — by ``create`` (new keys: a new initial
  row in a new or reused row number), ``adagrad`` (trained, default rows too) and ``accept``;
  ``renumbered`` says ``release`` compacted the rows since (a handover), so that the next
  checkpoint must hold the whole table. ``key_of_row()``: each row's key and whether it is
  live.

What serving processes need (``roles.protocol.serving``), once ``follow()`` was called:
``changes()``, the live keys changed (created, trained, accepted) and the keys dropped since
the previous ``changes()``, with their current rows. It lists each row an operation touched
once (a mark per row: no scan of the table, no sort), so its cost follows the updates, not the
table's size; ``since_snapshot()`` is the same since the latest ``clear_dirty``/``mark``
(a checkpoint), for a serving process that starts late.
"""

from __future__ import annotations

import numpy as np

from roles.algorithms.shard import kernels
from roles.algorithms.shard.growing import GrowingRows
from roles.algorithms.shard.key_index import KeyIndex
from roles.data.keyspace import splitmix64


def initial_rows(keys: np.ndarray, dim: int, scale: float, seed: int) -> np.ndarray:
    """Deterministic initial rows: uniform in [-scale, scale] from a hash of (key, seed, j)."""
    base = splitmix64(keys.view(np.uint64) ^ splitmix64(np.array([seed], dtype=np.uint64)))
    with np.errstate(over="ignore"):
        bits = splitmix64(base[:, None] + np.arange(1, dim + 1, dtype=np.uint64)[None, :])
    unit = (bits >> np.uint64(40)).astype(np.float64) / float(1 << 24)   # [0, 1)
    return ((2.0 * unit - 1.0) * scale).astype(np.float32)


FREE = np.iinfo(np.int64).max   # the last-seen clock of a row that holds no key


class EmbeddingTable:
    def __init__(self, dim: int, init_scale: float, lr: float, seed: int = 0,
                 eps: float = 1e-10, capacity: int = 1024, defaults: int = 0,
                 compiled: bool = kernels.COMPILED, rowwise: bool = False):
        """``compiled``: Adagrad, the initial rows and the key index run as compiled loops
        (``kernels``; the same bits), else in numpy. ``rowwise``: row-wise Adagrad (one sum
        of squared gradients per row, the mean over its values: ``[train]
        embedding_optimizer``)."""
        self.dim, self.init_scale, self.lr, self.seed, self.eps = dim, init_scale, lr, seed, eps
        self.rowwise = rowwise
        self._loops = kernels.loops() if compiled else None
        self._seed_mix = splitmix64(np.array([seed], dtype=np.uint64))[0]
        self.defaults = defaults
        self.index = KeyIndex(capacity, compiled)
        capacity = max(capacity, defaults, 1)
        self.index.reserve_rows(capacity)
        # the rows' arrays grow in place (roles.algorithms.shard.growing): no second copy;
        # so no caller may hold weights, accum, last_seen or dirty across a call that adds rows
        self._grown = {"weights": GrowingRows(capacity, (dim,), np.float32),
                       # Adagrad's sum of g^2, per value or per row
                       "accum": GrowingRows(capacity, (1 if rowwise else dim,), np.float32),
                       "last_seen": GrowingRows(capacity, (), np.int64, fill=FREE),
                       "dirty": GrowingRows(capacity, (), bool)}  # changed since a checkpoint
        self.weights = self._grown["weights"].array
        self.accum = self._grown["accum"].array
        self.last_seen = self._grown["last_seen"].array
        self.dirty = self._grown["dirty"].array
        self.size = defaults          # row numbers in use: defaults, live and free
        self._free = np.empty(0, dtype=np.int64)   # a stack of free row numbers
        self._free_count = 0
        self.clock = 0
        self.created = 0              # keys given a row, ever
        self._dropped: list[np.ndarray] | None = None   # since the mark; None: not recording
        self.renumbered = False
        self._changed: list[np.ndarray] | None = None  # rows touched since changes(); None: off
        self._marked = np.zeros(0, dtype=bool)  # in _changed already (a row each once followed)
        self._gone: list[np.ndarray] = []              # keys dropped since changes()

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
                + self.dirty.nbytes + self._marked.nbytes + self._free.nbytes
                + self.index.nbytes)

    # -- look-ups -----------------------------------------------------------------------------
    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """Row of each key (-1: no row); the rows found count as seen now."""
        rows = self.index.find(keys)
        self.last_seen[rows[rows >= 0]] = self.clock
        return rows

    def create(self, keys: np.ndarray) -> np.ndarray:
        """Rows for distinct keys that have none: free row numbers first, then new ones; each
        starts from its key's initial row and no Adagrad state."""
        keys = np.asarray(keys, dtype=np.int64)
        n = len(keys)
        reused = min(n, self._free_count)
        rows = np.empty(n, dtype=np.int64)
        rows[:reused] = self._free[self._free_count - reused:self._free_count]
        self._free_count -= reused
        fresh = n - reused
        self._reserve(self.size + fresh)
        rows[reused:] = np.arange(self.size, self.size + fresh)
        self.size += fresh
        self.weights[rows] = self.initial(keys)
        self.accum[rows] = 0.0
        self.last_seen[rows] = self.clock
        self.dirty[rows] = True
        self._touched(rows)
        self.index.insert(keys, rows)
        self.created += n
        return rows

    def initial(self, keys: np.ndarray) -> np.ndarray:
        """The rows ``create`` would give these keys: [n, dim], before any training."""
        if self._loops is not None:
            out = np.empty((len(keys), self.dim), dtype=np.float32)
            self._loops.initial(np.ascontiguousarray(keys, dtype=np.int64), self._seed_mix,
                                float(self.init_scale), out)
            return out
        return initial_rows(np.ascontiguousarray(keys, dtype=np.int64), self.dim,
                            self.init_scale, self.seed)

    def rows_for(self, keys: np.ndarray) -> np.ndarray:
        """Row numbers of distinct keys, creating the rows of keys that have none."""
        rows = self.lookup(keys)
        new = rows < 0
        if new.any():
            rows[new] = self.create(keys[new])
        return rows

    def touch(self, rows: np.ndarray) -> None:
        """These rows (live or default) count as seen now (a batch still holds them)."""
        self.last_seen[rows] = self.clock

    def _reserve(self, needed: int) -> None:
        if needed <= len(self.weights):
            return
        size = max(needed, 2 * len(self.weights))
        for name, rows in self._grown.items():
            setattr(self, name, None)   # (its only view: the mapping grows in place)
            try:
                setattr(self, name, rows.grow(size))
            except BufferError:   # a view of it held elsewhere: the table as it was
                for back, kept in self._grown.items():
                    setattr(self, back, kept.array)
                raise
        self.index.reserve_rows(size)
        if self._changed is not None:   # rows followed for serving: a byte a row, copied
            marked = np.zeros(size, dtype=bool)
            marked[:self.size] = self._marked[:self.size]
            self._marked = marked

    def adagrad(self, rows: np.ndarray, grads: np.ndarray,
                widths: np.ndarray | None = None) -> None:
        """One sparse Adagrad step on distinct rows: acc += g^2; w -= lr * g / (sqrt(acc)+eps).
        (The same arithmetic in the same order as the formula, with two temporaries in place
        of six: half the time of the plain expression. Compiled: one loop, the same bits.)
        Row-wise: acc += the mean of the row's g^2 over its table's width (summed value by
        value, in order), one per row. ``widths`` (float32, one per row): each row's table's
        width where tables are narrower than the rows (a narrower table's extra values get no
        gradient, and a mean over them would step it as if its gradients were smaller);
        None: every row's table is the rows' width."""
        means = None   # row-wise: what each row's sum of g^2 is divided by
        if self.rowwise:
            means = np.full(len(rows), self.dim, np.float32) if widths is None \
                else np.ascontiguousarray(widths, np.float32)
        if self._loops is not None:
            rows = np.ascontiguousarray(rows, np.int64)
            grads = np.ascontiguousarray(grads, np.float32)
            lr, eps = np.float32(self.lr), np.float32(self.eps)
            if means is not None:
                self._loops.rowwise_adagrad(self.weights, self.accum, rows, grads, lr, eps,
                                            means)
            else:
                self._loops.adagrad(self.weights, self.accum, rows, grads, lr, eps)
        elif means is not None:
            self._rowwise_numpy(rows, grads, means)
        else:
            self._adagrad_numpy(rows, grads)
        self.dirty[rows] = True
        self._touched(rows)

    def _rowwise_numpy(self, rows: np.ndarray, grads: np.ndarray, widths: np.ndarray) -> None:
        grads = np.asarray(grads, dtype=np.float32)
        total = grads[:, 0] * grads[:, 0]
        for j in range(1, self.dim):   # value by value, as the compiled loop sums
            total += grads[:, j] * grads[:, j]
        acc = self.accum[rows, 0] + total / widths
        self.accum[rows, 0] = acc
        scale = np.sqrt(acc)
        scale += np.float32(self.eps)
        step = grads * np.float32(self.lr)
        step /= scale[:, None]
        self.weights[rows] = np.take(self.weights, rows, axis=0) - step

    def _adagrad_numpy(self, rows: np.ndarray, grads: np.ndarray) -> None:
        acc = np.take(self.accum, rows, axis=0)
        step = np.multiply(grads, grads)
        acc += step
        self.accum[rows] = acc
        np.sqrt(acc, out=acc)
        acc += self.eps
        np.multiply(grads, self.lr, out=step)
        step /= acc
        w = np.take(self.weights, rows, axis=0)
        w -= step
        self.weights[rows] = w

    # -- dropping keys ------------------------------------------------------------------------
    def live(self) -> tuple[np.ndarray, np.ndarray]:
        """The live keys and their row numbers."""
        return self.index.items()

    def drop_rows(self, rows: np.ndarray) -> None:
        """Remove the keys of these distinct live rows; the rows are freed for new keys."""
        if not len(rows):
            return
        keys = self.index.keys_of(rows)
        self.index.delete(keys)
        self._free_rows(rows)
        if self._dropped is not None:
            self._dropped.append(keys)
        if self._changed is not None:
            self._gone.append(keys)

    def drop(self, keys: np.ndarray) -> int:
        """Remove distinct keys (absent ones are ignored); how many were here."""
        rows = self.index.find(np.asarray(keys, dtype=np.int64))
        self.drop_rows(rows[rows >= 0])
        return int((rows >= 0).sum())

    def _free_rows(self, rows: np.ndarray) -> None:
        self.last_seen[rows] = FREE
        needed = self._free_count + len(rows)
        if needed > len(self._free):
            grown = np.empty(max(needed, 2 * len(self._free), 1024), dtype=np.int64)
            grown[:self._free_count] = self._free[:self._free_count]
            self._free = grown
        self._free[self._free_count:needed] = rows
        self._free_count = needed

    def rows_seen_before(self, start: int, stop: int, before: int) -> np.ndarray:
        """The live rows among [start, stop) (default rows excluded) last seen before clock
        ``before``."""
        start = max(start, self.defaults)
        stop = min(stop, self.size)
        if start >= stop:
            return np.zeros(0, dtype=np.int64)
        return np.flatnonzero(self.last_seen[start:stop] < before) + start

    def clock_quantile(self, fraction: float, sample: int,
                       rng: np.random.Generator) -> int:
        """About the last-seen clock below which ``fraction`` of the live rows lie (from a
        sample of ``sample`` rows, or every row of a smaller table)."""
        span = self.size - self.defaults
        if span <= 0:
            return 0
        if span <= sample:
            seen = self.last_seen[self.defaults:self.size]
        else:
            seen = self.last_seen[rng.integers(self.defaults, self.size, sample)]
        seen = seen[seen != FREE]
        if not len(seen):
            return 0
        at = min(len(seen) - 1, int(fraction * len(seen)))
        return int(np.partition(seen, at)[at])

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
        self._check_state(weights, accum)
        n = min(self.defaults, len(weights))
        self.weights[:n] = weights[:n]
        self.accum[:n] = accum[:n]

    # -- moving rows between shards -----------------------------------------------------------
    def accept(self, keys: np.ndarray, weights: np.ndarray, accum: np.ndarray) -> None:
        """Take over distinct keys' rows and Adagrad state (a handover from another shard, a
        restore); a key already here is overwritten."""
        self._check_state(weights, accum)
        if len(keys):
            rows = self.rows_for(np.asarray(keys, dtype=np.int64))
            self.weights[rows] = weights
            self.accum[rows] = accum
            self.dirty[rows] = True
            self._touched(rows)

    def _check_state(self, weights: np.ndarray, accum: np.ndarray) -> None:
        """Rows from elsewhere (a checkpoint, another shard) fit this table: the same width,
        and Adagrad state of this table's kind (per value or per row)."""
        if not len(weights):
            return
        if weights.ndim != 2 or weights.shape[1] != self.dim:
            raise ValueError(f"rows of width {weights.shape[1:]} for a table of width "
                             f"{self.dim}: a checkpoint of another job?")
        if accum.shape != (len(weights), self.accum.shape[1]):
            theirs = "row-wise" if accum.ndim == 2 and accum.shape[1] == 1 else "per value"
            ours = "rowwise_adagrad" if self.rowwise else "adagrad"
            raise ValueError(f"Adagrad state {theirs} for a table trained with {ours} "
                             "([train] embedding_optimizer): the rows come from a job with "
                             "another optimizer")

    def release(self, leaving: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Remove the keys whose rows are marked in ``leaving`` (bool per row); return their
        keys, rows and Adagrad state. The remaining rows are renumbered (compacted after the
        default rows, free rows gone), so no row number taken before stays valid."""
        keys, rows = self.index.items()
        gone = leaving[rows]
        out = (keys[gone], self.weights[rows[gone]].copy(), self.accum[rows[gone]].copy())
        if self._dropped is not None:
            self._dropped.append(keys[gone])
        touched = None
        if self._changed is not None:   # by key: the row numbers change below
            self._gone.append(keys[gone])
            defaults, rows_touched = self._touched_rows()
            touched = defaults, self.index.keys_of(rows_touched)
        stay_keys, stay_rows = keys[~gone], rows[~gone]
        order = np.argsort(stay_rows)
        stay_keys, stay_rows = stay_keys[order], stay_rows[order]
        d, n = self.defaults, len(stay_rows)
        for array in (self.weights, self.accum, self.last_seen):
            array[d:d + n] = array[stay_rows]
        self.last_seen[d + n:self.size] = FREE
        self.index = KeyIndex(max(1024, 2 * n), self._loops is not None)
        self.index.reserve_rows(len(self.weights))
        self.index.insert(stay_keys, np.arange(d, d + n, dtype=np.int64))
        self.size = d + n
        self._free_count = 0
        self.renumbered = True
        if touched is not None:
            defaults, keys_touched = touched
            found = self.index.find(keys_touched)
            self._touched(defaults)
            self._touched(found[found >= 0])
        return out

    # -- serving: what changed ---------------------------------------------------------------
    def follow(self) -> None:
        """From now on record what changes, for ``changes()`` (not before: nothing grows in a
        job no serving process follows)."""
        if self._changed is None:
            self._changed = []
            self._marked = np.zeros(len(self.weights), dtype=bool)

    def forget_changes(self) -> None:
        """Publish nothing of what changed so far: the table was restored from a checkpoint,
        and a serving process joins this new process on that checkpoint (the first cut would
        otherwise send the whole table)."""
        if self._changed is not None:
            self._take_touched()
        self._gone = []

    def _touched(self, rows: np.ndarray) -> None:
        """Distinct rows changed: those not marked yet join the list (no sort at the cut)."""
        if self._changed is not None and len(rows):
            rows = np.asarray(rows, dtype=np.int64)
            new = rows[~self._marked[rows]]
            self._marked[new] = True
            self._changed.append(new)

    def _take_touched(self) -> np.ndarray:
        """The distinct rows touched since the last take, unmarked. (Read off the marks in
        row order instead, for sorted gathers after: no faster on 280,000 rows of 10 million,
        scripts/bench_cut.py.)"""
        rows = np.concatenate(self._changed) if self._changed else np.zeros(0, np.int64)
        self._marked[rows] = False
        self._changed = []
        return rows

    def _touched_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """The default rows touched, and the live rows touched, since changes() (taken: the
        list starts anew)."""
        rows = self._take_touched()
        rows = rows[rows < self.size]
        defaults = rows[rows < self.defaults]
        rows = rows[rows >= self.defaults]
        if not self._gone:   # no key dropped since: every row touched holds its key
            return defaults, rows
        return defaults, rows[self.last_seen[rows] != FREE]

    def changes(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Since the previous call (or ``follow()``): the live keys whose rows changed, those
        rows as they are now, and the keys dropped (a key dropped and made again is in both:
        apply the drops first). Default rows are not among them (``weights[:defaults]``)."""
        if self._changed is None:
            raise RuntimeError("changes() before follow()")
        _, rows = self._touched_rows()
        keys = self.index.keys_of(rows)
        dropped = np.unique(np.concatenate(self._gone)) if self._gone \
            else np.zeros(0, np.int64)
        self._changed, self._gone = [], []
        return keys, np.take(self.weights, rows, axis=0), dropped

    def since_snapshot(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """What ``changes()`` would give since the latest checkpoint snapshot
        (``clear_dirty`` and ``mark``): a scan of the table, for the rare late joiner."""
        by_row, live = self.key_of_row()   # renumbered since: every row (dirty is stale)
        rows = np.flatnonzero(live if self.renumbered else self.dirty[:self.size] & live)
        return by_row[rows], np.take(self.weights, rows, axis=0), self.dropped_since_mark()

    def clear_dirty(self) -> None:
        """A checkpoint took the table as it is: nothing has changed since."""
        self.dirty[:self.size] = False
        self.renumbered = False

    def key_of_row(self) -> tuple[np.ndarray, np.ndarray]:
        """The key of each row below ``size`` and whether the row holds one (default and free
        rows do not)."""
        live = self.last_seen[:self.size] != FREE
        live[:self.defaults] = False
        return np.where(live, self.index.keys_of(slice(0, self.size)), 0), live
