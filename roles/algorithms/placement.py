"""Skew-aware placement of embedding keys on shards (pure; no sockets).

Three parts:

``HeavyHitters``  a SpaceSaving summary of at most ``size`` keys with their occurrence counts.
                  Counts over-estimate (by at most ``errors``), never under-estimate; two
                  summaries merge into one with the same guarantee (Agarwal et al., "Mergeable
                  summaries", 2012): a key absent from a full summary is given that summary's
                  smallest count. A feeder adds each batch's keys; control merges the feeders'.

``KeyMap``        the versioned mapping key -> shard: an explicit table of placed heavy keys,
                  and for every other key its bucket (``key mod buckets``) whose owner is in a
                  bucket table. With ``buckets`` a multiple of the shard count and bucket b on
                  shard b mod shards, version 0 is exactly hash placement (key mod shards).

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

from dataclasses import dataclass, field

import numpy as np

from roles.data.hashing import shard_of
from roles.protocol.placement import Placement
from zbus.codec import ProtocolError


def _top(keys: np.ndarray, counts: np.ndarray, errors: np.ndarray,
         size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ``size`` largest counts, by descending count then ascending key (deterministic)."""
    order = np.lexsort((keys, -counts))[:size]
    return keys[order], counts[order], errors[order]


class HeavyHitters:
    def __init__(self, size: int):
        if size < 1:
            raise ValueError("a heavy-hitter summary needs at least one counter")
        self.size = size
        self.keys = np.zeros(0, dtype=np.int64)
        self.counts = np.zeros(0, dtype=np.int64)
        self.errors = np.zeros(0, dtype=np.int64)
        self.total = 0  # occurrences seen, heavy or not

    @classmethod
    def of(cls, size: int, keys: np.ndarray, counts: np.ndarray, errors: np.ndarray,
           total: int) -> HeavyHitters:
        hh = cls(size)
        hh.keys, hh.counts, hh.errors = _top(np.asarray(keys, np.int64),
                                             np.asarray(counts, np.int64),
                                             np.asarray(errors, np.int64), size)
        hh.total = int(total)
        return hh

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def floor(self) -> int:
        """The count a key absent from this summary may have had (0 while not full)."""
        return int(self.counts[-1]) if len(self.keys) >= self.size else 0

    def add(self, keys: np.ndarray) -> None:
        """Count every occurrence in ``keys`` (one batch's key-value pairs)."""
        if not len(keys):
            return
        uniq, counts = np.unique(np.asarray(keys, dtype=np.int64), return_counts=True)
        self._combine(uniq, counts.astype(np.int64), np.zeros(len(uniq), np.int64), 0,
                      len(keys))

    def merge(self, other: HeavyHitters) -> None:
        self._combine(other.keys, other.counts, other.errors, other.floor, other.total)

    def _combine(self, keys: np.ndarray, counts: np.ndarray, errors: np.ndarray,
                 floor: int, total: int) -> None:
        mine = self.floor
        both = np.concatenate([self.keys, keys])
        uniq, inverse = np.unique(both, return_inverse=True)
        n, first = len(uniq), inverse[:len(self.keys)]
        second = inverse[len(self.keys):]
        count = np.bincount(first, self.counts, n) + np.bincount(second, counts, n)
        error = np.bincount(first, self.errors, n) + np.bincount(second, errors, n)
        in_first = np.zeros(n, bool)
        in_first[first] = True
        in_second = np.zeros(n, bool)
        in_second[second] = True
        count += np.where(in_first, 0, mine) + np.where(in_second, 0, floor)
        error += np.where(in_first, 0, mine) + np.where(in_second, 0, floor)
        self.keys, self.counts, self.errors = _top(uniq, count.astype(np.int64),
                                                   error.astype(np.int64), self.size)
        self.total += int(total)


@dataclass(frozen=True)
class KeyMap:
    version: int
    shards: int
    buckets: np.ndarray                    # int64 [buckets]: owner shard of each bucket
    keys: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))   # sorted
    owners: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    @classmethod
    def hashed(cls, shards: int, buckets_per_shard: int) -> KeyMap:
        """Version 0: every key on shard ``key mod shards`` (hash placement)."""
        return cls(0, shards, np.arange(shards * buckets_per_shard, dtype=np.int64) % shards)

    def bucket_of(self, keys: np.ndarray) -> np.ndarray:
        return shard_of(np.asarray(keys, dtype=np.int64), len(self.buckets))

    def owner_of(self, keys: np.ndarray) -> np.ndarray:
        keys = np.asarray(keys, dtype=np.int64)
        owner: np.ndarray = self.buckets[self.bucket_of(keys)]
        if len(self.keys) and len(keys):
            at = np.minimum(np.searchsorted(self.keys, keys), len(self.keys) - 1)
            hit = self.keys[at] == keys
            owner[hit] = self.owners[at[hit]]
        return owner

    def with_table(self, version: int, keys: np.ndarray, owners: np.ndarray,
                   buckets: np.ndarray) -> KeyMap:
        """A new version; table entries equal to their bucket's owner are left out."""
        keys, owners = np.asarray(keys, np.int64), np.asarray(owners, np.int64)
        buckets = np.asarray(buckets, np.int64)
        off = owners != buckets[shard_of(keys, len(buckets))]
        order = np.argsort(keys[off], kind="stable")
        return KeyMap(version, self.shards, buckets, keys[off][order], owners[off][order])

    def message(self, phase: str) -> Placement:
        """This map as control publishes it, in ``phase`` (drain, move or active)."""
        return Placement(version=self.version, phase=phase, buckets=self.buckets,
                         keys=self.keys, owners=self.owners)

    @classmethod
    def from_message(cls, msg: Placement, shards: int, buckets_per_shard: int) -> KeyMap:
        """The map a Placement carries; ProtocolError when it does not fit this cluster."""
        if (len(msg.buckets) != shards * buckets_per_shard or msg.buckets.max() >= shards
                or (msg.owners.size and msg.owners.max() >= shards)):
            raise ProtocolError("bad_placement", "a key map that does not fit this cluster")
        return cls(msg.version, shards, np.array(msg.buckets), np.array(msg.keys),
                   np.array(msg.owners))


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
