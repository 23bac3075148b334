from __future__ import annotations

import numpy as np

from roles.data.hashing import hash_column, hash_value, shard_of, splitmix64


def test_keys_are_stable_and_depend_on_the_field():
    # pinned: a key must never change between versions, hosts or processes
    assert hash_value("workclass", "Private") == hash_value("workclass", "Private")
    assert hash_value("workclass", "Private") == -7048399692237338728
    assert hash_value("workclass", "Private") != hash_value("occupation", "Private")


def test_hash_column_matches_hashing_each_value():
    values = np.array(["a", "b", "a", "", "c"])
    keys = hash_column("f", values)
    assert keys.dtype == np.int64
    assert keys.tolist() == [hash_value("f", v) for v in values]
    assert hash_column("f", np.array([3, 3, 7])).tolist() == [hash_value("f", "3")] * 2 + [
        hash_value("f", "7")]


def test_shard_placement_is_in_range_and_balanced():
    keys = hash_column("f", np.arange(20000))
    owners = shard_of(keys, 3)
    assert set(owners.tolist()) == {0, 1, 2}
    counts = np.bincount(owners)
    assert counts.min() > 0.9 * counts.mean()


def test_splitmix_is_a_bijection_on_a_sample():
    x = np.arange(100000, dtype=np.uint64)
    assert len(np.unique(splitmix64(x))) == len(x)
