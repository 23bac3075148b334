"""The shard's per-key loops compiled (numba), for the key index and the grouping of a batch's
keys: the same results as the numpy code beside them (``key_index``, ``key_groups``), which
stays as the fallback where numba is not installed (``COMPILED`` says which runs).

Why compiled: a shard's look-up is a hash probe per key. In numpy each probe distance is a
handful of whole-array passes (gathers through the keys still probing, masks, compactions);
compiled, it is one loop with one random read of the index per probe. On a table of 4M keys, a
Criteo batch's 13,312 keys: the look-up 0.36 against 1.0-1.2 ms, the grouping of the rows found
0.07 against about 1 ms; a whole job's shards used 24% less CPU (docs/benchmarks.md, "Seventh
round").

Every kernel is compiled for its signatures when the process makes its first table
(``loops()``; ``cache=True``: from numba's cache after the first time, about 0.25 s, and the
image's pods from the cache built into it: ``NUMBA_CACHE_DIR``, Dockerfile), so that no batch
waits for the compiler. They release the GIL (``nogil``);
none allocates per key.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from roles.data.compiled import AVAILABLE, compiled
from roles.data.keyspace import compiled_splitmix, splitmix_one

# numba is a dependency; without it (a Python it has no wheel for yet) the callers run their
# numpy code
COMPILED = AVAILABLE

EMPTY = -1       # an index slot never used
TOMBSTONE = -2   # an index slot whose key was deleted (a probe walks over it)


def _home(key: int, mask: int) -> np.int64:
    """splitmix64 of the key masked to the index's size."""
    return np.int64(mix(np.uint64(key)) & np.uint64(mask))


def _probe(slot_rows: np.ndarray, row_keys: np.ndarray, keys: np.ndarray,
           slots: bool) -> np.ndarray:
    """Each key's row (``slots``: its slot number), -1 where it is absent; tombstones are
    walked over. A slot holds a row number, the row's key is ``row_keys[row]``."""
    mask = len(slot_rows) - 1
    out = np.empty(len(keys), dtype=np.int64)
    for i in range(len(keys)):
        key = keys[i]
        p = home(key, mask)
        found = np.int64(-1)
        while True:
            row = slot_rows[p]
            if row == EMPTY:
                break
            if row >= 0 and row_keys[row] == key:
                found = p if slots else row
                break
            p = (p + 1) & mask
        out[i] = found
    return out


def _place(slot_rows: np.ndarray, row_keys: np.ndarray, keys: np.ndarray,
           rows: np.ndarray) -> int:
    """Put distinct absent keys, in order, in the first free slot (empty, or a tombstone) of
    their probe paths, each key as its row's; returns how many tombstones they took."""
    mask = len(slot_rows) - 1
    reused = 0
    for i in range(len(keys)):
        p = home(keys[i], mask)
        while slot_rows[p] >= 0:
            p = (p + 1) & mask
        if slot_rows[p] == TOMBSTONE:
            reused += 1
        slot_rows[p] = rows[i]
        row_keys[rows[i]] = keys[i]
    return reused


def _group(rows: np.ndarray, scratch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct rows (in order of first occurrence) and each occurrence's index among
    them. ``scratch``: -1 at every row number (int32, longer than the largest row); it is -1
    everywhere again afterwards."""
    n = len(rows)
    distinct = np.empty(n, dtype=np.int64)
    inverse = np.empty(n, dtype=np.int64)
    m = 0
    for i in range(n):
        row = rows[i]
        at = scratch[row]
        if at < 0:
            scratch[row] = m
            distinct[m] = row
            at = m
            m += 1
        inverse[i] = at
    for j in range(m):
        scratch[distinct[j]] = -1
    return distinct[:m].copy(), inverse


def _adagrad(weights: np.ndarray, accum: np.ndarray, rows: np.ndarray, grads: np.ndarray,
             lr: np.float32, eps: np.float32) -> None:
    """Sparse Adagrad on distinct rows, in float32 and in the order of the numpy code's
    operations (``EmbeddingTable.adagrad``): acc += g * g; w -= (g * lr) / (sqrt(acc) + eps),
    so the same bits."""
    for i in range(len(rows)):
        row = rows[i]
        for j in range(weights.shape[1]):
            g = grads[i, j]
            acc = accum[row, j] + g * g
            accum[row, j] = acc
            weights[row, j] -= (g * lr) / (np.sqrt(acc) + eps)


def _rowwise_adagrad(weights: np.ndarray, accum: np.ndarray, rows: np.ndarray,
                     grads: np.ndarray, lr: np.float32, eps: np.float32,
                     widths: np.ndarray) -> None:
    """Row-wise Adagrad on distinct rows (``accum`` [rows, 1]), in float32 and in the order of
    the numpy code's operations (``EmbeddingTable.adagrad``): acc += sum_j(g_j * g_j) / the
    row's table's width (``widths[i]``: the mean over its values); w -= (g * lr) / (sqrt(acc)
    + eps), so the same bits."""
    dim = weights.shape[1]
    for i in range(len(rows)):
        row = rows[i]
        total = np.float32(0.0)
        for j in range(dim):
            total += grads[i, j] * grads[i, j]
        acc = accum[row, 0] + total / widths[i]
        accum[row, 0] = acc
        scale = np.sqrt(acc) + eps
        for j in range(dim):
            weights[row, j] -= (grads[i, j] * lr) / scale


def _initial(keys: np.ndarray, seed_mix: np.uint64, scale: float, out: np.ndarray) -> None:
    """``embedding_table.initial_rows`` into ``out`` [n, dim]: the same float64 arithmetic
    on the same hashes, so the same bits."""
    for i in range(len(keys)):
        base = mix(np.uint64(keys[i]) ^ seed_mix)
        for j in range(out.shape[1]):
            bits = mix(base + np.uint64(j + 1))
            unit = np.float64(bits >> np.uint64(40)) / 16777216.0
            out[i, j] = np.float32((2.0 * unit - 1.0) * scale)


@dataclass(frozen=True, slots=True)
class Loops:
    """The compiled loops (``loops()``)."""

    probe: Callable[[np.ndarray, np.ndarray, np.ndarray, bool], np.ndarray]
    place: Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], int]
    group: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]
    adagrad: Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.float32,
                       np.float32], None]
    rowwise_adagrad: Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.float32,
                               np.float32, np.ndarray], None]
    initial: Callable[[np.ndarray, np.uint64, float, np.ndarray], None]


# What the loops call, as numba compiles them: plain Python until ``loops()`` compiles them
mix: Callable[[np.uint64], np.uint64] = splitmix_one
home: Callable[[int, int], np.int64] = _home


@functools.cache
def loops() -> Loops:
    """The loops compiled, once per process, at the first table made (not at import: the
    roles that only read a model's files never load numba, about 100 MB and half a second)."""
    global mix, home   # noqa: PLW0603 - the helpers the loops call must be compiled first
    from numba import types

    i64 = types.Array(types.int64, 1, "C")
    i64_in = types.Array(types.int64, 1, "C", readonly=True)   # a message's frame
    i32 = types.Array(types.int32, 1, "C")
    f32 = types.Array(types.float32, 2, "C")
    f32_in = types.Array(types.float32, 2, "C", readonly=True)
    mix = compiled_splitmix()
    home = compiled([types.int64(types.int64, types.int64)], _home, inline="always")
    return Loops(
        probe=compiled([i64(i32, i64, keys, types.boolean) for keys in (i64, i64_in)],
                        _probe),
        place=compiled([types.int64(i32, i64, keys, i64) for keys in (i64, i64_in)],
                        _place),
        group=compiled([types.Tuple((i64, i64))(i64, i32)], _group),  # type: ignore[no-untyped-call]
        adagrad=compiled([types.void(f32, f32, i64, g, types.float32, types.float32)
                           for g in (f32, f32_in)], _adagrad),
        rowwise_adagrad=compiled([types.void(f32, f32, i64, g, types.float32, types.float32,
                                              types.Array(types.float32, 1, "C"))
                                   for g in (f32, f32_in)], _rowwise_adagrad),
        initial=compiled([types.void(keys, types.uint64, types.float64, f32)
                           for keys in (i64, i64_in)], _initial))
