"""Sample weights: time decay, dropping, and merging of identical samples (pure).

Age is counted in whole ``decay_unit``s (days by default) before the newest training sample
(the data's, given by the statistics pass; a block's own newest when not given): a sample's time
bucket is ``floor(timestamp / unit)`` and its age is the newest bucket minus its own, so the
newest day has age 0 and decay 1. Decay = ``decay_base ** -age``.

Merging: samples with the same sparse keys, dense values, label and time bucket are one sample
with a ``count`` (a feeder merges within each chunk of rows it reads). The keys are a sample's
slots (``roles.job.fields``), a list field's included: two samples with the same ids in the same
order in a list field (its newest ``max_len``, as kept) are alike there, and with other ids,
another order or another length they differ. A merged sample's weight is decay x count. A
sample whose final weight (after merging) falls below ``drop_below`` is dropped, with every row
merged into it (and counted). The worker's loss is the weighted mean of the per-sample losses
(sum of weight x loss over sum of weight), so a batch holding one merged sample trains exactly
as a batch holding its ``count`` copies.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from roles.data.keyspace import splitmix64


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


def decay_weights(buckets: np.ndarray, base: float, newest: int | None = None) -> np.ndarray:
    """``base ** -(newest bucket - bucket)``: 1 for the newest unit, smaller for older ones."""
    if not len(buckets):
        return np.zeros(0, dtype=np.float64)
    top = int(buckets.max()) if newest is None else max(int(newest), int(buckets.max()))
    age = (top - buckets).astype(np.float64)
    return np.power(float(base), -age)


def identical_groups(keys: np.ndarray, dense: np.ndarray, labels: np.ndarray,
                     buckets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first row of each group of identical samples in input order, group of every row)."""
    n = len(labels)
    parts = [np.ascontiguousarray(keys, dtype=np.int64).reshape(n, -1).view(np.uint8),
             np.ascontiguousarray(dense, dtype=np.float32).reshape(n, -1).view(np.uint8),
             np.ascontiguousarray(labels, dtype=np.float32).reshape(n, -1).view(np.uint8),
             np.ascontiguousarray(buckets, dtype=np.int64).reshape(n, 1).view(np.uint8)]
    rows = np.ascontiguousarray(np.concatenate(parts, axis=1))
    as_void = rows.view(np.dtype((np.void, rows.shape[1]))).reshape(n)
    _, first, inverse = np.unique(as_void, return_index=True, return_inverse=True)
    # renumber groups by their first row, so the result keeps the input's order
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return first[order], rank[inverse.reshape(-1)]


def negatives_kept(keys: np.ndarray, labels: np.ndarray, rate: float, seed: int,
                   dense: np.ndarray | None = None,
                   timestamps: np.ndarray | None = None) -> np.ndarray:
    """Negative down-sampling: which rows stay, every row but the negatives (first label 0)
    whose hash of their values (keys, dense values, timestamp) and ``seed`` falls above
    ``rate``: the same rows whichever feeder reads them, and in every epoch, and a part read
    again after a restart makes the same batches. (Rows of the very same values are kept or
    dropped together.)"""
    first = labels if labels.ndim == 1 else labels[:, 0]
    n = len(first)
    h = np.full(n, np.uint64(seed) ^ np.uint64(0x4E45_4741_5449_5645), np.uint64)
    columns = [np.asarray(keys, dtype=np.int64).reshape(n, -1).view(np.uint64)]
    if dense is not None and dense.size:
        columns.append(np.ascontiguousarray(dense, dtype=np.float32).reshape(n, -1)
                       .view(np.uint32).astype(np.uint64))
    if timestamps is not None:
        columns.append(np.asarray(timestamps, dtype=np.int64).reshape(n, 1).view(np.uint64))
    for column in np.concatenate(columns, axis=1).T:
        h = splitmix64(h ^ column)
    uniform = (h >> np.uint64(11)).astype(np.float64) / float(1 << 53)
    return np.asarray(~(first == 0) | (uniform < rate))


def weigh(keys: np.ndarray, dense: np.ndarray, labels: np.ndarray,
          timestamps: np.ndarray | None, *, base: float, unit_s: int, drop_below: float,
          merge: bool, newest: int | None = None,
          row_weights: np.ndarray | None = None) -> Weighted:
    """``newest``: the newest time bucket of the training data (else the rows' own newest);
    ``row_weights``: each row's own weight ([data] weight), times its decay (merged rows: the
    sum of theirs)."""
    n = len(labels)
    buckets = buckets_of(timestamps, unit_s, n)
    decay = decay_weights(buckets, base, newest) if base > 1.0 else np.ones(n)
    if merge:
        rows, group = identical_groups(keys, dense, labels, buckets)
        counts = np.bincount(group, minlength=len(rows)).astype(np.int64)
        own = counts if row_weights is None else \
            np.bincount(group, weights=row_weights, minlength=len(rows))
    else:
        rows, counts = np.arange(n), np.ones(n, dtype=np.int64)
        own = counts if row_weights is None else row_weights
    weights = decay[rows] * own
    # drop_below weighs decay x the rows merged (not [data] weight's values); a weight of 0
    # trains nothing: dropped too
    keep = (decay[rows] * counts >= drop_below) & (weights > 0)
    return Weighted(rows=rows[keep], weights=weights[keep].astype(np.float32),
                    counts=counts[keep], dropped=int(counts[~keep].sum()),
                    merged=int((counts[keep] - 1).sum()))
