"""The shard's key index with deletion (tombstones, rebuilds), against a dict; compiled
(``kernels``) and in numpy alike."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from roles.algorithms.shard.key_index import MAX_LOAD, MAX_ROWS, TOMBSTONE, KeyIndex

# a small key space, so that inserts, deletes and look-ups keep meeting the same keys
keys_st = st.lists(st.integers(-40, 40), max_size=30)
op_st = st.tuples(st.sampled_from(["insert", "delete", "sweep"]), keys_st)


def check(index: KeyIndex, reference: dict[int, int]) -> None:
    probe = np.arange(-45, 46, dtype=np.int64)
    assert index.find(probe).tolist() == [reference.get(k, -1) for k in probe.tolist()]
    keys, rows = index.items()
    assert dict(zip(keys.tolist(), rows.tolist(), strict=True)) == reference
    assert len(index) == len(reference)
    assert len(index) + index.tombstones <= MAX_LOAD * index.capacity


WAYS = [pytest.param(True, id="compiled"), pytest.param(False, id="numpy")]


@pytest.mark.parametrize("compiled", WAYS)
@settings(max_examples=300, deadline=None)
@given(ops=st.lists(op_st, max_size=40))
def test_random_inserts_and_deletes_agree_with_a_dict(compiled, ops):
    """Freed row numbers are given to new keys first, as the table does: the index keeps one
    key per row, so a row that changed hands must answer for its new key only."""
    index, reference, row, free = KeyIndex(capacity=16, compiled=compiled), {}, 0, []
    for op, raw in ops:
        keys = np.unique(np.array(raw, dtype=np.int64))
        if op == "insert":
            new = keys[index.find(keys) < 0]
            reused = [free.pop() for _ in range(min(len(new), len(free)))]
            rows = np.array(reused + list(range(row, row + len(new) - len(reused))),
                            dtype=np.int64)
            row += len(new) - len(reused)
            index.insert(new, rows)
            reference.update(zip(new.tolist(), rows.tolist(), strict=True))
        elif op == "delete":
            got = index.delete(keys)
            assert got.tolist() == [reference.pop(k, -1) for k in keys.tolist()]
            free.extend(r for r in got.tolist() if r >= 0)
        else:  # a sweep: delete whatever live entry of a slot range holds a listed key
            half = index.capacity // 2
            slots, found, rows = index.live_slots(half // 2, half // 2 + half)
            pick = np.isin(found, keys)
            index.delete_slots(slots[pick])
            for k in found[pick].tolist():
                free.append(reference.pop(k))
        check(index, reference)


@pytest.mark.parametrize("compiled", WAYS)
def test_a_row_number_past_int32_is_refused_and_nothing_is_inserted(compiled):
    index = KeyIndex(capacity=16, compiled=compiled)
    for rows in ([0, MAX_ROWS], [-1, 3]):
        with pytest.raises(ValueError, match="row numbers"):
            index.insert(np.array([7, 8], dtype=np.int64), np.array(rows, dtype=np.int64))
    assert len(index) == 0 and index.find(np.array([7, 8])).tolist() == [-1, -1]


def test_the_index_costs_4_bytes_a_slot_and_8_a_row():
    index = KeyIndex(capacity=16)
    index.insert(np.arange(1, 100_001, dtype=np.int64), np.arange(100_000))
    assert index.nbytes <= 4 * index.capacity + 8 * 2 * 100_000
    assert 4 * index.capacity <= 4 * 100_000 / 0.1875   # at least 3/16 full after a rebuild


@pytest.mark.parametrize("compiled", WAYS)
def test_tombstones_are_reused_and_cleared_by_a_rebuild(compiled):
    index = KeyIndex(capacity=64, compiled=compiled)
    keys = np.arange(1, 31, dtype=np.int64)
    index.insert(keys, keys * 2)
    assert index.delete(keys[:20]).tolist() == (keys[:20] * 2).tolist()
    assert len(index) == 10 and index.tombstones == 20
    assert (index.find(keys[:20]) == -1).all()
    assert index.find(keys[20:]).tolist() == (keys[20:] * 2).tolist()
    # churn: the same number of keys in and out never grows the index beyond its bound
    rebuilds, size = index.rebuilds, index.capacity
    for step in range(50):
        new = np.arange(1000 + 10 * step, 1010 + 10 * step, dtype=np.int64)
        index.insert(new, new)
        index.delete(new)
        assert len(index) + index.tombstones <= MAX_LOAD * index.capacity
    assert index.rebuilds > rebuilds and index.capacity == size
    assert index.find(keys[20:]).tolist() == (keys[20:] * 2).tolist()


def test_both_ways_find_the_same_rows_and_slots_on_a_large_index_after_churn():
    rng = np.random.default_rng(3)
    keys = np.unique(rng.integers(-(1 << 63), (1 << 63) - 1, 60_000, dtype=np.int64))
    a, b = KeyIndex(1024, compiled=True), KeyIndex(1024, compiled=False)
    for index in (a, b):
        index.insert(keys[:40_000], np.arange(40_000))
        index.delete(keys[:10_000])
        index.insert(keys[40_000:], np.arange(40_000, len(keys)))
    probe = np.concatenate([keys, rng.integers(-(1 << 63), (1 << 63) - 1, 5_000,
                                               dtype=np.int64)])
    assert np.array_equal(a.find(probe), b.find(probe))
    frame = probe.copy()
    frame.flags.writeable = False   # keys as a message's frame holds them
    assert np.array_equal(a.find(frame), b.find(probe))
    assert (a.find(keys[:10_000]) == -1).all() and len(a) == len(b)
    for index in (a, b):   # the count kept is the count there (which slots differs: the
        assert index.tombstones == int((index._slot_rows == TOMBSTONE).sum())   # order of a tie)
    assert a.capacity == b.capacity
    slots = a._slots(probe)
    assert (a.live_slots(0, a.capacity)[1][np.searchsorted(
        a.live_slots(0, a.capacity)[0], slots[slots >= 0])] == probe[slots >= 0]).all()
