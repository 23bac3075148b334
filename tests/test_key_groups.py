"""A batch's keys grouped against a shard's table without sorting the keys that have a row
(``KeyGrouper``): the same rows, distinct, for every occurrence as ``np.unique`` gives."""

from __future__ import annotations

import numpy as np
import pytest

from roles.algorithms.shard.embedding_table import EmbeddingTable
from roles.algorithms.shard.key_groups import KeyGrouper


def table_with(keys: np.ndarray) -> EmbeddingTable:
    t = EmbeddingTable(4, 0.01, 0.1, seed=1)
    t.rows_for(np.unique(keys))
    return t


@pytest.mark.parametrize("known_share", [0.0, 0.5, 1.0])
def test_every_occurrence_maps_to_its_keys_row_or_its_missing_key(known_share):
    rng = np.random.default_rng(7)
    universe = rng.integers(-(1 << 62), 1 << 62, 5_000)
    table = table_with(universe[:int(known_share * len(universe))])
    grouper = KeyGrouper()
    for _ in range(5):   # the scratch array is reused, never cleared
        keys = universe[(rng.zipf(1.3, 6_000) - 1) % len(universe)]
        g = grouper.group(table, keys, counted=True)
        plain = grouper.group(table, keys)   # without the missing keys' counts
        assert np.array_equal(plain.found, g.found) and np.array_equal(plain.inverse, g.inverse)
        assert np.array_equal(plain.missing, g.missing) and len(plain.counts) == 0
        expected = table.index.find(keys)
        assert len(np.unique(g.found)) == len(g.found)              # each row once
        assert (np.diff(g.missing) > 0).all()                       # each key once, sorted
        known = g.inverse < len(g.found)
        assert (g.found[g.inverse[known]] == expected[known]).all()
        assert (expected[~known] == -1).all()
        assert (g.missing[g.inverse[~known] - len(g.found)] == keys[~known]).all()
        # what the sort would say of the keys without a row: first occurrences and counts
        uniq, first, counts = np.unique(keys[~known], return_index=True, return_counts=True)
        assert (uniq == g.missing).all() and (counts == g.counts).all()
        assert (g.first == np.flatnonzero(~known)[first]).all()
        assert set(g.found.tolist()) == set(expected[known].tolist())


def test_an_empty_batch_and_a_table_that_grew_in_between():
    table = table_with(np.arange(10, dtype=np.int64))
    grouper = KeyGrouper()
    g = grouper.group(table, np.zeros(0, dtype=np.int64))
    assert len(g.found) == len(g.missing) == len(g.inverse) == 0
    grouper.group(table, np.arange(10, dtype=np.int64))
    table.rows_for(np.arange(10, 10_000, dtype=np.int64))   # rows past the scratch array
    keys = np.array([9_999, 5, 9_999, 20_000], dtype=np.int64)
    g = grouper.group(table, keys)
    assert list(g.found[g.inverse[:3]]) == list(table.index.find(keys[:3]))
    assert g.missing.tolist() == [20_000] and g.inverse[3] == len(g.found)
