"""The key -> shard map and the key counts behind it (pure; no sockets): what a feeder routes
each batch's keys by and counts, what a shard and ``zbus-predict`` look keys up by, what control
places (``roles.algorithms.control.placement``).

``HeavyHitters``  a SpaceSaving summary of at most ``size`` keys with their occurrence counts.
                  Counts over-estimate (by at most ``errors``), never under-estimate; two
                  summaries merge into one with the same guarantee (Agarwal et al., "Mergeable
                  summaries", 2012): a key absent from a full summary is given that summary's
                  smallest count. A feeder adds each batch's keys; control merges the feeders'.

``KeyMap``        the versioned mapping key -> shard: an explicit table of placed heavy keys,
                  and for every other key its bucket (``key mod buckets``) whose owner is in a
                  bucket table. With ``buckets`` a multiple of the shard count and bucket b on
                  shard b mod shards, version 0 is exactly hash placement (key mod shards).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from roles.data.keyspace import shard_of
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
