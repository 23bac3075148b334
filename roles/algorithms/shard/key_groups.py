"""A batch's keys grouped by the table (pure; ``Admission`` maps batches with it): the rows of
the distinct keys that have one, the distinct keys that have none, and for every key occurrence
which of those it is.

Sorting every batch's keys (``np.unique``) was the largest cost of a shard's look-up: 0.5 ms for
the 13,000 keys of a Criteo batch of 1,024 on one of two shards, 3 ms for an evaluation batch of
4,096. Here the keys are looked up first, all of them (the index's probe is one numpy pass per
probe distance), and the occurrences of a key that has a row are told apart by that row,
without sorting: every occurrence writes its own index at its row in a scratch array the size
of the table, then reads back the index that stayed there. Whichever occurrence's write stayed,
all occurrences of the row read the same one, and it is the only occurrence whose index is its
own: the row's representative. Only the keys without a row (a few, once a table has seen most
of its keys) are sorted, for their counts and first occurrences. 2-7 times faster than the
sort on Zipf-distributed batches against a table of 2M keys (13,312 keys: 1.2-1.5 against
0.25-0.7 ms; 53,248: 5.8-6.9 against 0.9-2.7 ms). With numba (``kernels.group``) the rows
found are grouped by one compiled loop instead (in order of first occurrence), the numpy
scatter and gather its fallback.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from roles.algorithms.shard import kernels
from roles.algorithms.shard.embedding_table import EmbeddingTable

_EMPTY = np.zeros(0, dtype=np.int64)


@dataclass(frozen=True, slots=True)
class KeyGroups:
    """``found``: the distinct rows of the keys that have one (in order of first occurrence's
    winner, not sorted); ``missing``: the distinct keys without a row (sorted), and when they
    were asked for (``counted``), ``first`` the index of each one's first occurrence and
    ``counts`` its occurrences (else empty); ``inverse`` (int64):
    for each key occurrence its index in ``found``, or ``len(found)`` + its index in
    ``missing``."""

    found: np.ndarray
    missing: np.ndarray
    first: np.ndarray
    counts: np.ndarray
    inverse: np.ndarray


class KeyGrouper:
    """Groups batches' keys against one table; owns the scratch array (int32, the size of the
    table's rows: 4 bytes a row). ``compiled``: the rows found are grouped by a compiled loop
    (``kernels.group``: in order of first occurrence, the scratch -1 between batches), else
    by the numpy scatter and gather below."""

    def __init__(self, compiled: bool = kernels.COMPILED) -> None:
        self._loops = kernels.loops() if compiled else None
        self._at = np.full(0, -1, dtype=np.int32)   # -1 between batches (the loop's)

    def group(self, table: EmbeddingTable, keys: np.ndarray, counted: bool = False) -> KeyGroups:
        """Look every key up (the rows found count as seen now) and group the occurrences;
        ``counted``: with the missing keys' first occurrences and counts (a stable sort and a
        count, about a third more of the sort: only admission needs them)."""
        keys = np.ascontiguousarray(keys, dtype=np.int64).reshape(-1)
        rows = table.lookup(keys)
        have = rows >= 0
        every = bool(have.all())
        hit = None if every else np.flatnonzero(have)
        found_rows = rows if hit is None else rows[hit]
        found, first_index = self._distinct(found_rows, table.size)
        if hit is None:
            return KeyGroups(found, _EMPTY, _EMPTY, _EMPTY, first_index)
        inverse = np.empty(len(keys), dtype=np.int64)
        inverse[hit] = first_index
        miss = np.flatnonzero(~have)
        if counted:
            missing, first, again, counts = np.unique(keys[miss], return_index=True,
                                                      return_inverse=True, return_counts=True)
            first = miss[first]
        else:
            missing, again = np.unique(keys[miss], return_inverse=True)
            first = counts = _EMPTY
        inverse[miss] = len(found) + again.reshape(-1)
        return KeyGroups(found, missing, first, counts, inverse)

    def _distinct(self, rows: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
        """The distinct rows among ``rows`` (every one below ``size``) and each one's index
        among them."""
        if len(self._at) < size:
            self._at = np.full(max(size, 2 * len(self._at)), -1, dtype=np.int32)
        if self._loops is not None:
            return self._loops.group(np.ascontiguousarray(rows, dtype=np.int64), self._at)
        order = np.arange(len(rows), dtype=np.int32)
        self._at[rows] = order           # duplicates: one index stays per row, whichever
        winner = self._at[rows]
        own = winner == order
        rank = np.cumsum(own) - 1        # a representative's index among the found rows
        return rows[own], rank[winner]
