"""Skew-aware placement, pure parts: heavy-hitter counting and merging, the mapping, best fit
with overflow and deferral."""

from collections import Counter

import numpy as np
import pytest

from roles.algorithms.control.placement import Deferred, lower_bound, max_over_mean, place
from roles.algorithms.shared.key_map import HeavyHitters, KeyMap
from roles.data.keyspace import shard_of


def zipf_keys(n: int, distinct: int, exponent: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    p = np.arange(1, distinct + 1, dtype=np.float64) ** -exponent
    ids = rng.choice(distinct, size=n, p=p / p.sum())
    return (ids * 7919 + 13).astype(np.int64)  # keys unrelated to their rank's parity


def test_exact_counts_while_the_summary_has_room():
    hh = HeavyHitters(100)
    hh.add(np.array([5, 5, 7, 5, 9], dtype=np.int64))
    hh.add(np.array([7, 7], dtype=np.int64))
    assert list(hh.keys) == [5, 7, 9] and list(hh.counts) == [3, 3, 1]
    assert hh.errors.sum() == 0 and hh.total == 7


def test_counts_never_underestimate_and_errors_bound_them():
    keys = zipf_keys(50_000, 5_000, 1.1, seed=1)
    hh = HeavyHitters(200)
    for chunk in np.array_split(keys, 37):
        hh.add(chunk)
    true = Counter(keys.tolist())
    for k, c, e in zip(hh.keys, hh.counts, hh.errors, strict=True):
        assert c - e <= true[int(k)] <= c
    top = [k for k, _ in true.most_common(20)]
    assert set(top) <= set(hh.keys.tolist())  # the heaviest keys are all there
    assert hh.total == len(keys)


def test_merged_summaries_equal_one_summary_of_everything_on_the_heavy_keys():
    keys = zipf_keys(40_000, 3_000, 1.2, seed=2)
    a, b, whole = HeavyHitters(300), HeavyHitters(300), HeavyHitters(300)
    for chunk in np.array_split(keys[:25_000], 10):
        a.add(chunk)
    for chunk in np.array_split(keys[25_000:], 10):
        b.add(chunk)
    whole.add(keys)
    a.merge(b)
    true = Counter(keys.tolist())
    assert a.total == whole.total == len(keys)
    for k, c, e in zip(a.keys, a.counts, a.errors, strict=True):
        assert c - e <= true[int(k)] <= c
    assert list(a.keys[:30]) == list(whole.keys[:30])


def test_version_zero_is_hash_placement_and_the_table_overrides():
    keys = np.random.default_rng(3).integers(-2**62, 2**62, size=10_000)
    m = KeyMap.hashed(4, 16)
    assert np.array_equal(m.owner_of(keys), shard_of(keys, 4))
    moved = m.with_table(1, keys[:3], np.array([3, 3, 3]), m.buckets)
    owners = moved.owner_of(keys)
    assert (owners[:3] == 3).all() and np.array_equal(owners[3:], shard_of(keys[3:], 4))
    assert len(moved.keys) == 3 - int((shard_of(keys[:3], 4) == 3).sum())


def shard_loads(keymap: KeyMap, keys: np.ndarray) -> np.ndarray:
    return np.bincount(keymap.owner_of(keys), minlength=keymap.shards).astype(float)


def window(keymap: KeyMap, keys: np.ndarray, size: int):
    hh = HeavyHitters(size)
    hh.add(keys)
    return hh, np.bincount(keymap.bucket_of(keys), minlength=len(keymap.buckets))


def test_capacities_are_respected_and_the_next_window_is_balanced():
    k = 4
    m = KeyMap.hashed(k, 64)
    first, second = zipf_keys(200_000, 50_000, 1.0, 4), zipf_keys(200_000, 50_000, 1.0, 5)
    hh, buckets = window(m, first, 2000)
    caps = np.full(k, len(first) / k)
    alloc = place(hh, buckets, caps, m)
    assert alloc.keymap.version == 1 and len(alloc.overflow) == 0
    assert (alloc.loads <= caps + 1e-6).all()
    assert max_over_mean(shard_loads(m, second)) > 1.1          # hash
    assert max_over_mean(shard_loads(alloc.keymap, second)) < 1.05


def test_unequal_capacities_get_proportional_load():
    m = KeyMap.hashed(2, 64)
    keys = zipf_keys(100_000, 20_000, 1.1, 6)
    hh, buckets = window(m, keys, 1000)
    alloc = place(hh, buckets, np.array([2.0, 1.0]) * len(keys) / 3, m)
    loads = shard_loads(alloc.keymap, keys)
    assert loads[1] / loads[0] == pytest.approx(0.5, abs=0.03)


def test_a_key_bigger_than_any_capacity_overflows_and_is_alone_on_its_shard():
    k = 4
    m = KeyMap.hashed(k, 64)
    keys = zipf_keys(200_000, 100_000, 1.5, 7)   # the top key is about 38 % of the pairs
    hh, buckets = window(m, keys, 2000)
    alloc = place(hh, buckets, np.full(k, len(keys) / k), m)
    hot = hh.keys[0]
    assert hot in alloc.overflow and alloc.overflow_by_shard.sum() == len(alloc.overflow)
    hot_shard = alloc.keymap.owner_of(np.array([hot]))[0]
    assert hot_shard == m.owner_of(np.array([hot]))[0]   # it kept its shard
    loads = shard_loads(alloc.keymap, keys)
    share = hh.counts[0] / len(keys)
    assert loads[hot_shard] == pytest.approx(hh.counts[0], rel=0.01)  # nothing else there
    assert max_over_mean(loads) <= 1.05 * lower_bound(share, k)
    # it is never held over (no capacity can ever take it): deferral leaves it where it is
    held = place(hh, buckets, np.full(k, len(keys) / k), m, Deferred.nothing(k, 4 * 64))
    assert hot in held.overflow and hot not in held.deferred.keys
    again = place(hh, buckets, np.full(k, len(keys) / k), held.keymap, held.deferred)
    assert again.moved_keys == 0 and hot in again.overflow


def test_two_overflowing_keys_on_one_shard_are_split():
    m = KeyMap.hashed(4, 4)
    hot = np.array([0, 4], dtype=np.int64)                     # both on shard 0 by hash
    cold = np.arange(8, 8 + 4000, dtype=np.int64)
    keys = np.concatenate([np.repeat(hot, 3000), cold])
    hh, buckets = window(m, keys, 10)
    alloc = place(hh, buckets, np.full(4, len(keys) / 4 * 0.9), m)
    owners = alloc.keymap.owner_of(hot)
    assert owners[0] != owners[1]


def test_a_placement_that_already_fits_moves_nothing():
    m = KeyMap.hashed(2, 8)
    keys = np.arange(10_000, dtype=np.int64)
    hh, buckets = window(m, keys, 50)
    alloc = place(hh, buckets, np.full(2, 6000.0), m)
    assert alloc.moved_keys == 0 and alloc.moved_buckets == 0
    assert alloc.keymap.version == 1 and np.array_equal(alloc.keymap.buckets, m.buckets)
    assert len(alloc.keymap.keys) == len(alloc.keymap.owners) == 0


def test_a_key_map_travels_as_a_placement_and_one_that_does_not_fit_is_refused():
    from zbus.codec import ProtocolError, decode

    m = KeyMap.hashed(2, 4).with_table(3, np.array([5, 8]), np.array([0, 1]),
                                       np.arange(8) % 2)
    msg = decode(m.message("move").to_frames()).msg
    again = KeyMap.from_message(msg, 2, 4)
    keys = np.arange(-100, 100, dtype=np.int64)
    assert again.version == 3 and np.array_equal(again.owner_of(keys), m.owner_of(keys))
    with pytest.raises(ProtocolError):
        KeyMap.from_message(msg, 2, 8)        # another bucket count
    with pytest.raises(ProtocolError):
        KeyMap.from_message(KeyMap(4, 3, np.arange(8) % 3).message("move"), 2, 4)


def two_shards(keys: dict[int, int], tails: list[int]) -> tuple[HeavyHitters, np.ndarray]:
    """A window of heavy ``keys`` (key -> pairs) and light pairs per bucket (``tails``), on 2
    shards of len(tails) // 2 buckets each."""
    k = np.array(list(keys), dtype=np.int64)
    c = np.array(list(keys.values()), dtype=np.int64)
    heavy = HeavyHitters.of(len(k), k, c, np.zeros_like(c), int(c.sum()) + sum(tails))
    buckets = np.array(tails, dtype=np.int64)
    np.add.at(buckets, k % len(tails), c)
    return heavy, buckets


def test_pairs_that_fit_no_room_are_held_and_count_first_against_the_next_window():
    m = KeyMap.hashed(2, 2)             # buckets 0, 2 on shard 0; 1, 3 on shard 1
    caps = np.array([50.0, 50.0])
    # window 1: two keys of 45 fill the shards; bucket 0's 10 light pairs fit no room left
    heavy, buckets = two_shards({4: 45, 5: 45}, [10, 0, 0, 0])
    first = place(heavy, buckets, caps, m, Deferred.nothing(2, 4))
    held = first.deferred
    assert held.pairs == 5 and held.by_shard.tolist() == [5.0, 0.0]   # shard 0 took 5 of 10
    assert held.bucket_windows.tolist() == [1, 0, 0, 0] and held.items == 1
    assert held.report()["deferred_windows_max"] == 1
    # window 2: shard 0 starts with the 5 pairs it still owes, so it is given less new work
    heavy, buckets = two_shards({4: 40, 5: 40}, [5, 5, 5, 5])
    second = place(heavy, buckets, caps, first.keymap, held)
    assert second.released_pairs == 5
    assert second.loads[0] == 45 and second.loads[1] == 55
    assert second.deferred.by_shard[0] == 0     # shard 0 has worked its backlog off
    # every pair is placed or held: this window's and the ones released into it
    placed = second.loads.sum() - second.deferred.pairs
    assert placed + second.deferred.pairs == heavy.total and second.deferred.pairs == 2.5
    # without deferral the same window is planned as if shard 0 owed nothing
    off = place(heavy, buckets, caps, first.keymap)
    assert off.loads.tolist() == [50.0, 50.0] and off.deferred.pairs == 0


def test_an_item_held_again_counts_its_allocations_in_a_row():
    m = KeyMap.hashed(2, 2)
    caps = np.array([50.0, 50.0])
    heavy, buckets = two_shards({4: 45, 5: 45}, [10, 0, 0, 0])
    held = Deferred.nothing(2, 4)
    for window in range(1, 4):
        alloc = place(heavy, buckets, caps, m, held)
        held = alloc.deferred
        assert held.bucket_windows[0] == window and held.windows_max == window
    # a heavy key held while heavy, then light, passes its count to its bucket
    heavy, buckets = two_shards({4: 48, 5: 45, 7: 6}, [1, 0, 0, 0])
    alloc = place(heavy, buckets, caps, m, Deferred.nothing(2, 4))
    assert alloc.deferred.keys.tolist() == [7] and alloc.deferred.key_windows.tolist() == [1]
    heavy, buckets = two_shards({4: 48, 5: 45}, [1, 0, 0, 6])   # key 7 is in bucket 3
    again = place(heavy, buckets, caps, m, alloc.deferred)
    assert again.released_pairs == alloc.deferred.pairs == 1
    assert again.deferred.bucket_windows.tolist() == [0, 0, 0, 2]


def test_deferred_pairs_stay_bounded_over_many_windows_of_skewed_keys():
    """Coarse items (2 buckets per shard, 20 heavy keys) on unequal shards: something is held
    over almost every window, and it is a sliver of a window, served in the next one."""
    k = 4
    m = KeyMap.hashed(k, 2)
    caps = np.array([1.5, 1.0, 1.0, 0.5])
    held = Deferred.nothing(k, len(m.buckets))
    shares, longest = [], 0
    for w in range(40):
        keys = zipf_keys(20_000, 2_000, 1.0, seed=100 + w)
        hh, buckets = window(m, keys, 20)
        alloc = place(hh, buckets, caps / caps.sum() * len(keys), m, held)
        m, held = alloc.keymap, alloc.deferred
        shares.append(held.pairs / len(keys))
        longest = max(longest, held.windows_max)
    assert sum(s > 0 for s in shares) >= 30
    assert max(shares) < 0.05 and longest <= 6
