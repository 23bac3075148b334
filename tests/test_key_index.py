"""The shard's key index with deletion (tombstones, rebuilds), against a dict."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from roles.algorithms.shard.key_index import MAX_LOAD, KeyIndex

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


@settings(max_examples=300, deadline=None)
@given(st.lists(op_st, max_size=40))
def test_random_inserts_and_deletes_agree_with_a_dict(ops):
    index, reference, row = KeyIndex(capacity=16), {}, 0
    for op, raw in ops:
        keys = np.unique(np.array(raw, dtype=np.int64))
        if op == "insert":
            new = keys[index.find(keys) < 0]
            rows = np.arange(row, row + len(new))
            row += len(new)
            index.insert(new, rows)
            reference.update(zip(new.tolist(), rows.tolist(), strict=True))
        elif op == "delete":
            got = index.delete(keys)
            assert got.tolist() == [reference.pop(k, -1) for k in keys.tolist()]
        else:  # a sweep: delete whatever live entry of a slot range holds a listed key
            half = index.capacity // 2
            slots, found, rows = index.live_slots(half // 2, half // 2 + half)
            pick = np.isin(found, keys)
            index.delete_slots(slots[pick])
            for k in found[pick].tolist():
                del reference[k]
        check(index, reference)


def test_tombstones_are_reused_and_cleared_by_a_rebuild():
    index = KeyIndex(capacity=64)
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
