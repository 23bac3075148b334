"""A batch's keys grouped against a shard's table without sorting the keys that have a row
(``KeyGrouper``): the same rows, distinct, for every occurrence as ``np.unique`` gives; with
the compiled loop and with numpy alike."""

from __future__ import annotations

import numpy as np
import pytest

from roles.algorithms.shard import kernels
from roles.algorithms.shard.embedding_table import EmbeddingTable
from roles.algorithms.shard.key_groups import KeyGrouper

WAYS = [pytest.param(True, id="compiled"), pytest.param(False, id="numpy")]


def test_the_kernels_are_compiled_here():
    assert kernels.COMPILED, "numba is a dependency: the shard's loops run compiled"


def table_with(keys: np.ndarray) -> EmbeddingTable:
    t = EmbeddingTable(4, 0.01, 0.1, seed=1)
    t.rows_for(np.unique(keys))
    return t


@pytest.mark.parametrize("compiled", WAYS)
@pytest.mark.parametrize("known_share", [0.0, 0.5, 1.0])
def test_every_occurrence_maps_to_its_keys_row_or_its_missing_key(known_share, compiled):
    rng = np.random.default_rng(7)
    universe = rng.integers(-(1 << 62), 1 << 62, 5_000)
    table = table_with(universe[:int(known_share * len(universe))])
    grouper = KeyGrouper(compiled)
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


@pytest.mark.parametrize("compiled", WAYS)
def test_an_empty_batch_and_a_table_that_grew_in_between(compiled):
    table = table_with(np.arange(10, dtype=np.int64))
    grouper = KeyGrouper(compiled)
    g = grouper.group(table, np.zeros(0, dtype=np.int64))
    assert len(g.found) == len(g.missing) == len(g.inverse) == 0
    grouper.group(table, np.arange(10, dtype=np.int64))
    table.rows_for(np.arange(10, 10_000, dtype=np.int64))   # rows past the scratch array
    keys = np.array([9_999, 5, 9_999, 20_000], dtype=np.int64)
    g = grouper.group(table, keys)
    assert list(g.found[g.inverse[:3]]) == list(table.index.find(keys[:3]))
    assert g.missing.tolist() == [20_000] and g.inverse[3] == len(g.found)


def test_both_ways_group_a_batch_alike_and_the_compiled_one_in_order_of_first_occurrence():
    rng = np.random.default_rng(11)
    universe = rng.integers(-(1 << 62), 1 << 62, 3_000)
    table = table_with(universe[:2_000])
    compiled, numpy_way = KeyGrouper(True), KeyGrouper(False)
    for _ in range(4):
        keys = universe[(rng.zipf(1.2, 8_000) - 1) % len(universe)]
        a, b = compiled.group(table, keys), numpy_way.group(table, keys)
        assert np.array_equal(a.found[a.inverse[a.inverse < len(a.found)]],
                              b.found[b.inverse[b.inverse < len(b.found)]])
        assert np.array_equal(a.missing, b.missing) and set(a.found) == set(b.found)
        rows = table.index.find(keys)
        _, first = np.unique(rows[rows >= 0], return_index=True)
        assert a.found.tolist() == rows[rows >= 0][np.sort(first)].tolist()
