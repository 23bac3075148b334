"""Where a feeder sends each key (pure; no sockets).

``KeyRouting``: the key map the feeder routes each batch's keys by
(``roles.algorithms.control.placement``); with skew-aware placement (``[placement] mode = "skew"``)
the counts of the keys it sends per allocation window, and the pause while a new map moves in: once
control publishes one the feeder sends no new batch, reports Drained when none is in flight, and
routes by the new map when control says it is active (the shards have handed their rows over).

``WindowCounter``: per allocation window, a SpaceSaving summary of the heaviest keys and the
key-value pairs per bucket of the key map and per shard. A window closes after
``window_batches`` training batches (0: at the end of each training pass) and its KeyCounts go
to control, which merges every feeder's and places the keys of the next window.
"""

from __future__ import annotations

import numpy as np

from roles.algorithms.shared.key_map import HeavyHitters, KeyMap
from roles.job.fields import FieldLayout
from roles.job.settings import PlacementConfig
from roles.protocol.datapath import BatchKeys
from roles.protocol.placement import Drained, KeyCounts, Placement

COUNT_EVERY = 16  # batches whose keys go into the summary together


class WindowCounter:
    def __init__(self, heavy_keys: int, window_batches: int, buckets: int, shards: int):
        self.heavy_keys = heavy_keys
        self.window_batches = window_batches
        self.buckets, self.shards = buckets, shards
        self.window = 0      # the allocation window being counted
        self.batches = 0     # its batches so far
        self.clear()

    def clear(self) -> None:
        self.heavy = HeavyHitters(self.heavy_keys)
        self.uncounted: list[np.ndarray] = []   # batches' keys not yet in the summary
        self.bucket_pairs = np.zeros(self.buckets, dtype=np.int64)
        self.shard_pairs = np.zeros(self.shards, dtype=np.int64)

    def count(self, keys: np.ndarray, owner: np.ndarray, keymap: KeyMap,
              pass_end: bool) -> KeyCounts | None:
        """Count a training batch's keys (``owner``: their shards under ``keymap``), the
        last of its pass when ``pass_end``; the window's counts when this closes it. Keys go
        into the summary COUNT_EVERY batches at a time (one np.unique over many batches costs
        far less than one per batch)."""
        self.uncounted.append(keys)
        if len(self.uncounted) >= COUNT_EVERY:
            self.heavy.add(np.concatenate(self.uncounted))
            self.uncounted.clear()
        self.bucket_pairs += np.bincount(keymap.bucket_of(keys), minlength=self.buckets)
        self.shard_pairs += np.bincount(owner, minlength=self.shards)
        self.batches += 1
        every = self.window_batches
        if (every and self.batches >= every) or (not every and pass_end):
            return self.close(keymap.version)
        return None

    def close(self, version: int) -> KeyCounts:
        """The window's counts (routed by key map ``version``); the next window begins."""
        h = self.heavy
        if self.uncounted:
            h.add(np.concatenate(self.uncounted))
        counts = KeyCounts(window=self.window, version=version, size=h.size, pairs=h.total,
                           keys=h.keys, counts=h.counts, errors=h.errors,
                           bucket_pairs=self.bucket_pairs, shard_pairs=self.shard_pairs)
        self.window += 1
        self.batches = 0
        self.clear()
        return counts


class KeyRouting:
    def __init__(self, shards: int, p: PlacementConfig, layout: FieldLayout):
        self.layout = layout
        self.skew = p.mode == "skew"
        self.buckets_per_shard = p.buckets_per_shard
        self.keymap = KeyMap.hashed(shards, p.buckets_per_shard)
        self.counter = WindowCounter(p.heavy_keys, p.window_batches, len(self.keymap.buckets),
                                     shards)
        self.placing: int | None = None  # a key map version waiting for the feeder to drain
        self.drained_for = -1

    def batch_keys(self, batch_id: int, keys: np.ndarray, shards: range | list[int],
                   train: bool = True) -> tuple[np.ndarray, np.ndarray, list[BatchKeys]]:
        """The keys of a batch (samples x slots) as its grid (``roles.job.fields``), their
        shards, and the BatchKeys for each of ``shards`` (``train`` false: an evaluation
        batch)."""
        samples = len(keys)
        keys, bounds = self.layout.grid(keys)
        owner = self.keymap.owner_of(keys).astype(np.uint8)
        messages = []
        for shard in shards:
            positions = np.flatnonzero(owner == shard).astype(np.int32)
            messages.append(BatchKeys(batch_id=batch_id, window=self.counter.window,
                                      samples=samples, bounds=bounds, train=train,
                                      positions=positions, keys=keys[positions]))
        return keys, owner, messages

    def count(self, keys: np.ndarray, owner: np.ndarray, pass_end: bool) -> KeyCounts | None:
        """A training batch sent (see ``WindowCounter.count``); nothing without skew."""
        return self.counter.count(keys, owner, self.keymap, pass_end) if self.skew else None

    def newer(self, msg: Placement) -> bool:
        return self.skew and msg.version > self.keymap.version

    def pause(self, version: int) -> bool:
        """Map ``version`` moves in: no new batch until it is active. True when it is new."""
        new, self.placing = self.placing != version, version
        return new

    def drained(self, in_flight: bool) -> Drained | None:
        """The report that nothing is in flight any more, once per map waiting."""
        if self.placing is None or in_flight or self.drained_for == self.placing:
            return None
        self.drained_for = self.placing
        return Drained(version=self.placing)

    def activate(self, msg: Placement) -> None:
        """The map is active: route by it."""
        self.keymap = KeyMap.from_message(msg, self.keymap.shards, self.buckets_per_shard)
        self.placing = None
