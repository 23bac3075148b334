"""Skew-aware placement of embedding keys on shards (pure; no sockets).

The counts and the map it works on (``HeavyHitters``, ``KeyMap``) are in
``roles.algorithms.shared.key_map``.

``place``         one allocation window: items (heavy keys, and buckets carrying the tail of
                  light keys) are walked by descending load; each goes to its current shard when
                  that still has room for it, else to the shard with the least room that still
                  fits it (best fit). An item larger than every shard's capacity *overflows*: it
                  keeps its shard (or, if that shard is already over, the one with the most room
                  takes it) and is reported. An item that would fit a shard but fits in no room
                  left is *deferred*: the shard that keeps it (its own while it has room, else
                  the one with most room) takes what room it has, and the rest of the item's
                  pairs is held to the next allocation (``Deferred``), where the pairs held on
                  each shard count against its capacity before any item is placed (the
                  capacities are scaled to the window's pairs plus those held: that window has
                  more work). Deferred pairs, their shards and how many allocations in a row
                  each item has been held are reported.

Moving whole buckets is what lets placement drain the tail away from a shard that holds a key
hotter than its capacity: the bound k x (share of the hottest key) is then reachable.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from roles.algorithms.shared.key_map import HeavyHitters, KeyMap


@dataclass(frozen=True)
class Deferred:
    """Pairs held over from an allocation to the next: per shard, the pairs of the items it kept
    beyond its room (``by_shard``, charged first against its next capacity), and which items
    were held and for how many allocations in a row (heavy ``keys`` with ``key_windows``; per
    bucket ``bucket_windows``, 0 when not held) with their pairs."""

    by_shard: np.ndarray          # float64 [shards]
    keys: np.ndarray              # int64: heavy keys held
    key_pairs: np.ndarray         # float64
    key_windows: np.ndarray       # int64: allocations in a row each has been held
    bucket_pairs: np.ndarray      # float64 [buckets]
    bucket_windows: np.ndarray    # int64 [buckets]

    @classmethod
    def nothing(cls, shards: int, buckets: int) -> Deferred:
        return cls(np.zeros(shards), np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int64),
                   np.zeros(buckets), np.zeros(buckets, np.int64))

    @property
    def pairs(self) -> float:
        return float(self.by_shard.sum())

    @property
    def items(self) -> int:
        return len(self.keys) + int((self.bucket_windows > 0).sum())

    @property
    def windows_max(self) -> int:
        """The most allocations in a row any held item has been held (0: nothing held)."""
        return int(max(self.key_windows.max(initial=0), self.bucket_windows.max(initial=0)))

    def report(self) -> dict[str, object]:
        return {"deferred_pairs": round(self.pairs, 1), "deferred_items": self.items,
                "deferred_by_shard": [round(float(x), 1) for x in self.by_shard],
                "deferred_windows_max": self.windows_max}


@dataclass(frozen=True)
class Allocation:
    """One window's placement: the new mapping and what it predicts."""

    keymap: KeyMap
    loads: np.ndarray          # predicted pairs per shard under the new mapping (this window's)
    overflow: np.ndarray       # heavy keys larger than any shard's capacity
    overflow_by_shard: np.ndarray
    moved_keys: int            # heavy keys whose shard changed
    moved_buckets: int
    deferred: Deferred         # pairs held to the next allocation (nothing without deferral)
    released_pairs: float = 0.0   # pairs held from the previous allocation, charged in this one


def bucket_tail(bucket_pairs: np.ndarray, heavy: HeavyHitters, keymap: KeyMap) -> np.ndarray:
    """Pairs of each bucket that belong to keys outside the heavy set."""
    tail = np.asarray(bucket_pairs, dtype=np.float64).copy()
    np.subtract.at(tail, keymap.bucket_of(heavy.keys), heavy.counts.astype(np.float64))
    return np.maximum(tail, 0.0)


def _held_windows(heavy: HeavyHitters, deferred: Deferred, keymap: KeyMap) -> np.ndarray:
    """Per item (heavy keys, then buckets): allocations in a row it has been held so far; a held
    heavy key that is no longer heavy passes its count to its bucket."""
    windows = np.concatenate([np.zeros(len(heavy), np.int64), deferred.bucket_windows])
    if len(deferred.keys):
        still = np.isin(deferred.keys, heavy.keys)
        by_key = np.argsort(heavy.keys)
        at = np.searchsorted(heavy.keys, deferred.keys[still], sorter=by_key)
        windows[by_key[at]] = deferred.key_windows[still]
        gone = keymap.bucket_of(deferred.keys[~still]) + len(heavy)
        np.maximum.at(windows, gone, deferred.key_windows[~still])
    return windows


def place(heavy: HeavyHitters, bucket_pairs: np.ndarray, capacities: np.ndarray,
          current: KeyMap, deferred: Deferred | None = None) -> Allocation:
    """Best-fit placement of the heavy keys and the buckets of light keys (see the module).

    ``bucket_pairs``: pairs of the window per bucket (all keys); ``capacities``: predicted
    pairs each shard can take of the window's pairs; ``deferred``: what the previous allocation
    held over (None: no deferral; an item that fits nowhere then overflows onto a shard, as one
    larger than every capacity does, and nothing is held).
    """
    k = current.shards
    caps = np.asarray(capacities, dtype=np.float64)
    if caps.shape != (k,):
        raise ValueError(f"need {k} capacities, got {caps.shape}")
    tail = bucket_tail(bucket_pairs, heavy, current)
    n_keys = len(heavy)
    loads = np.concatenate([heavy.counts.astype(np.float64), tail])
    owner_now = np.concatenate([current.owner_of(heavy.keys), current.buckets])
    order = np.argsort(-loads, kind="stable")
    room = caps.copy()
    largest = float(room.max())          # an item larger than this fits no shard at all
    held_before = np.zeros(len(loads), np.int64)
    released = 0.0
    if deferred is not None:
        released = deferred.pairs
        window = float(loads.sum())
        if released > 0 and window > 0:   # the window's work: its pairs and those held
            room *= (window + released) / window
        largest = float(room.max())
        room -= deferred.by_shard          # held pairs count first
        held_before = _held_windows(heavy, deferred, current)
    # the walk, on plain Python numbers: a numpy call per item costs more than the item's work
    room_l, loads_l, here_l = room.tolist(), loads.tolist(), owner_now.tolist()
    owner_l, over_l, left_l = list(here_l), [False] * len(loads_l), [0.0] * len(loads_l)
    shards = range(k)
    for i in order.tolist():
        load, here = loads_l[i], here_l[i]
        if load <= 0:
            continue
        if room_l[here] >= load:
            target, take = here, load
        else:
            fits = [(room_l[s], s) for s in shards if room_l[s] >= load]
            if fits:
                target, take = min(fits)[1], load          # best fit: the least room left
            elif deferred is None or load > largest:   # fits no shard: it overflows
                over_l[i] = True
                most = max(shards, key=room_l.__getitem__)
                target, take = (here if room_l[here] >= 0 else most), load
            else:                                      # fits no room left: deferred
                most = max(shards, key=room_l.__getitem__)
                target = here if room_l[here] > 0 or room_l[most] <= 0 else most
                take = max(room_l[target], 0.0)
                left_l[i] = load - take
        owner_l[i] = target
        room_l[target] -= take
    owner = np.array(owner_l, dtype=np.int64)
    over = np.array(over_l, dtype=bool)
    left = np.array(left_l, dtype=np.float64)
    new_buckets = owner[n_keys:]
    keymap = current.with_table(current.version + 1, heavy.keys, owner[:n_keys], new_buckets)
    predicted = np.bincount(owner, weights=loads, minlength=k)
    over_keys = over[:n_keys]
    held = left > 0
    windows = np.where(held, held_before + 1, 0)
    kept = held[:n_keys]
    return Allocation(
        keymap=keymap, loads=predicted, overflow=heavy.keys[over_keys],
        overflow_by_shard=np.bincount(owner[:n_keys][over_keys], minlength=k),
        moved_keys=int((owner[:n_keys] != owner_now[:n_keys]).sum()),
        moved_buckets=int((new_buckets != current.buckets).sum()),
        deferred=Deferred(np.bincount(owner, weights=left, minlength=k).astype(np.float64),
                          heavy.keys[kept], left[:n_keys][kept], windows[:n_keys][kept],
                          left[n_keys:], windows[n_keys:]),
        released_pairs=released)


def max_over_mean(loads: np.ndarray) -> float:
    loads = np.asarray(loads, dtype=np.float64)
    mean = loads.mean() if len(loads) else 0.0
    return float(loads.max() / mean) if mean > 0 else 1.0


def lower_bound(top_share: float, shards: int) -> float:
    """No placement of whole keys does better than max(1, k x the hottest key's share)."""
    return max(1.0, shards * top_share)
