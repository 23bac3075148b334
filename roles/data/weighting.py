"""Sample weights: time decay, dropping, and merging of identical samples (pure).

Age is counted in whole ``decay_unit``s (days by default) before the newest training sample:
a sample's time bucket is ``floor(timestamp / unit)`` and its age is the newest bucket minus its
own, so the newest day has age 0 and weight 1. Weight = ``decay_base ** -age``. Samples whose
weight falls below ``drop_below`` are dropped (and counted).

Merging: samples with the same sparse keys, dense values, label and time bucket are one sample
with a ``count``; its weight is decay x count. The worker's loss is the weighted mean of the
per-sample losses (sum of weight x loss over sum of weight), so a batch holding one merged
sample trains exactly as a batch holding its ``count`` copies.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Weighted:
    """Which of the input rows remain (in input order), with their weights and counts."""

    rows: np.ndarray     # int64 indexes into the input
    weights: np.ndarray  # float32, decay x count
    counts: np.ndarray   # int64, input rows merged into each remaining row
    dropped: int         # rows whose decayed weight fell below drop_below
    merged: int          # rows folded into another identical row


def buckets_of(timestamps: np.ndarray | None, unit_s: int, n: int) -> np.ndarray:
    if timestamps is None:
        return np.zeros(n, dtype=np.int64)
    return np.floor_divide(np.asarray(timestamps, dtype=np.int64), unit_s)


def decay_weights(buckets: np.ndarray, base: float) -> np.ndarray:
    """``base ** -(newest bucket - bucket)``: 1 for the newest unit, smaller for older ones."""
    if not len(buckets):
        return np.zeros(0, dtype=np.float64)
    age = (buckets.max() - buckets).astype(np.float64)
    return np.power(float(base), -age)


def identical_groups(keys: np.ndarray, dense: np.ndarray, labels: np.ndarray,
                     buckets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first row of each group of identical samples in input order, group of every row)."""
    n = len(labels)
    parts = [np.ascontiguousarray(keys, dtype=np.int64).reshape(n, -1).view(np.uint8),
             np.ascontiguousarray(dense, dtype=np.float32).reshape(n, -1).view(np.uint8),
             np.ascontiguousarray(labels, dtype=np.float32).reshape(n, 1).view(np.uint8),
             np.ascontiguousarray(buckets, dtype=np.int64).reshape(n, 1).view(np.uint8)]
    rows = np.ascontiguousarray(np.concatenate(parts, axis=1))
    as_void = rows.view(np.dtype((np.void, rows.shape[1]))).reshape(n)
    _, first, inverse = np.unique(as_void, return_index=True, return_inverse=True)
    # renumber groups by their first row, so the result keeps the input's order
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return first[order], rank[inverse.reshape(-1)]


def weigh(keys: np.ndarray, dense: np.ndarray, labels: np.ndarray,
          timestamps: np.ndarray | None, *, base: float, unit_s: int, drop_below: float,
          merge: bool) -> Weighted:
    n = len(labels)
    buckets = buckets_of(timestamps, unit_s, n)
    decay = decay_weights(buckets, base) if base > 1.0 else np.ones(n)
    kept = np.flatnonzero(decay >= drop_below) if base > 1.0 else np.arange(n)
    dropped = n - len(kept)
    if not merge:
        return Weighted(rows=kept, weights=decay[kept].astype(np.float32),
                        counts=np.ones(len(kept), dtype=np.int64), dropped=dropped, merged=0)
    first, group = identical_groups(keys[kept], dense[kept], labels[kept], buckets[kept])
    counts = np.bincount(group, minlength=len(first)).astype(np.int64)
    rows = kept[first]
    return Weighted(rows=rows, weights=(decay[rows] * counts).astype(np.float32),
                    counts=counts, dropped=dropped, merged=len(kept) - len(rows))
