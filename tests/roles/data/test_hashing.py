from __future__ import annotations

import numpy as np
import pyarrow as pa

from roles.data.hashing import (
    KEY_HASH,
    hash_array,
    hash_lists,
    hash_value,
    hash_values,
)
from roles.data.keyspace import shard_of, splitmix64
from roles.job.fields import PAD


def test_keys_are_pinned_and_depend_on_the_field():
    # pinned: a key must never change between versions, hosts or processes (a new function
    # needs a new KEY_HASH, which exports record)
    assert KEY_HASH == "zbus-key-v2"
    assert hash_value("workclass", "Private") == -2027231850706914884
    assert hash_value("C1", "68fd1e64") == -7139093826550335802
    assert hash_value("C1", "") == 8496006719421974641
    assert hash_value("workclass", "Private") != hash_value("occupation", "Private")


def test_missing_values_are_one_key_and_whitespace_does_not_count():
    keys = hash_array("f", pa.array([None, "", "?", " ", "x", " x "]))
    assert len(set(keys[:4].tolist())) == 1 and keys[4] == keys[5] != keys[0]


def test_a_column_hashes_as_each_value_alone_whatever_its_lengths():
    values = ["a", "b", "a", "", "c", "x" * 8, "x" * 9, "y" * 1000, "é", "a\x00"]
    keys = hash_values("f", values)
    assert keys.dtype == np.int64
    assert keys.tolist() == [hash_value("f", v) for v in values]
    assert len(set(keys.tolist())) == len(set(values))  # "a" and "a\0" differ too
    encoded = hash_array("f", pa.array(values).dictionary_encode())
    assert encoded.tolist() == keys.tolist()
    assert hash_values("f", [3, 3, 7]).tolist() == [hash_value("f", "3")] * 2 + [
        hash_value("f", "7")]


def test_shard_placement_is_in_range_and_balanced():
    keys = hash_values("f", list(range(20000)))
    owners = shard_of(keys, 3)
    assert set(owners.tolist()) == {0, 1, 2}
    counts = np.bincount(owners)
    assert counts.min() > 0.9 * counts.mean()


def test_shard_of_is_the_unsigned_key_modulo_the_count_for_any_count():
    """The mask (a power of two) and the division (any other count) give what Python's
    modulo of the key read as an unsigned 64-bit number gives, at both ends of the range."""
    rng = np.random.default_rng(5)
    keys = np.concatenate([rng.integers(-2**63, 2**63 - 1, 5000, dtype=np.int64),
                           np.array([0, 1, -1, 2**63 - 1, -2**63], dtype=np.int64)])
    unsigned = [k % 2**64 for k in keys.tolist()]
    for n in (1, 2, 3, 7, 64, 96, 128, 255, 4096, 4096 * 255):
        got = shard_of(keys, n)
        assert got.dtype == np.int64
        assert got.tolist() == [u % n for u in unsigned], n


def test_splitmix_is_a_bijection_on_a_sample():
    x = np.arange(100000, dtype=np.uint64)
    assert len(np.unique(splitmix64(x))) == len(x)


def reference_key(field: str, value: str) -> int:
    """The key as the hashing module's docstring defines it, one value in plain Python."""
    from hashlib import blake2b

    mask = (1 << 64) - 1

    def mix(z: int) -> int:
        z = (z + 0x9E3779B97F4A7C15) & mask
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        return z ^ (z >> 31)

    data = value.strip().encode()
    data = b"" if data == b"?" else data
    h = int.from_bytes(blake2b(field.encode(), digest_size=8).digest(), "little")
    for at in range(0, max(len(data), 1), 8):
        h = mix(h ^ int.from_bytes(data[at:at + 8].ljust(8, b"\0"), "little"))
    key = mix(h ^ ((len(data) * 0x9E3779B97F4A7C15 + 1) & mask))
    return key - (1 << 64) if key >= 1 << 63 else key


def test_the_keys_are_the_documented_function():
    values = ["", "?", "a", "Private", "68fd1e64", "x" * 17, " padded ", "日本"]
    assert hash_values("workclass", values).tolist() == [reference_key("workclass", v)
                                                        for v in values]


def test_list_ids_are_keyed_as_single_values_of_their_table():
    """A list's ids hash as the same values of a single-valued field of that table (trimmed),
    the newest ``max_len`` kept, left-aligned, ``PAD`` after them."""
    got = hash_lists("item", pa.array([["3", " 7 ", "9"], [], None, ["日本"]]), 2)
    assert got.tolist() == [[hash_value("item", "7"), hash_value("item", "9")], [PAD, PAD],
                            [PAD, PAD], [reference_key("item", "日本"), PAD]]
    assert hash_lists("item", pa.array([[3, 7]]), 4).tolist() == [
        hash_values("item", [3, 7]).tolist() + [PAD, PAD]]
