"""Skew-aware key placement: the feeders' key counts, control's key map and its migration
phases, the shards' handover of rows, and the shards' work per window (the capacity
predictor's history), reported until control has recorded it."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from zbus.codec import Message, array, finite, message, require

# A shard's work in one allocation window (a row of WindowWork's figures): for each operation,
# where its key-value pairs and its CPU seconds are.
WORK_SLOTS = {"lookup": (0, 1), "update": (2, 3)}
WORK_FIGURES = 4
MAX_WINDOWS_REPORTED = 256   # windows in one WindowWork (more wait for the next one)


@message()
class KeyCounts(Message):
    """A feeder's counts of allocation window ``window``: its SpaceSaving summary of the
    heaviest keys (``counts`` over-estimate by at most ``errors``; a summary of ``size``
    counters), all its key-value pairs (``pairs``), pairs per bucket of the key map and pairs
    per shard under the routing of version ``version``."""

    window: int
    version: int
    size: int
    pairs: int
    keys: np.ndarray = array("int64", 1)
    counts: np.ndarray = array("int64", 1)
    errors: np.ndarray = array("int64", 1)
    bucket_pairs: np.ndarray = array("int64", 1)
    shard_pairs: np.ndarray = array("int64", 1)

    def check(self) -> None:
        require(self.keys.shape == self.counts.shape == self.errors.shape,
                "keys, counts and errors differ in length")
        require(0 < self.size and len(self.keys) <= self.size, "more keys than counters")
        require(self.window >= 0 and self.version >= 0 and self.pairs >= 0,
                "negative window, version or pairs")
        for name in ("counts", "errors", "bucket_pairs", "shard_pairs"):
            values = getattr(self, name)
            require(not values.size or values.min() >= 0, f"negative {name}")
        require(not self.errors.size or bool((self.errors <= self.counts).all()),
                "an error larger than its count")


@message()
class Placement(Message):
    """The key map of ``version`` (standing; control PUB). ``phase``: ``drain`` (feeders send
    no new batch and report Drained once nothing is in flight), ``move`` (shards hand the rows
    they no longer own to their new owners, and report Moved), ``active`` (feeders route by
    this version). Key k is on ``owners[i]`` when ``keys[i] == k`` (``keys`` sorted), else on
    ``buckets[k mod len(buckets)]``."""

    PHASES: ClassVar[tuple[str, ...]] = ("drain", "move", "active")
    version: int
    phase: str
    buckets: np.ndarray = array("int64", 1)
    keys: np.ndarray = array("int64", 1)
    owners: np.ndarray = array("int64", 1)

    def check(self) -> None:
        require(self.phase in self.PHASES, f"phase must be one of {self.PHASES}")
        require(self.version >= 0 and self.buckets.size > 0, "no buckets")
        require(self.keys.shape == self.owners.shape, "keys and owners differ in length")
        require(bool((self.buckets >= 0).all()) and (not self.owners.size
                                                     or self.owners.min() >= 0),
                "negative shard")
        require(self.keys.size < 2 or bool((np.diff(self.keys) > 0).all()),
                "keys not sorted and distinct")


@message()
class Drained(Message):
    """A feeder paused for placement ``version`` has nothing in flight."""

    version: int


@message("handover")
class Handover(Message):
    """Shard -> shard (DEALER -> ROUTER): the rows of placement ``version`` that move to the
    receiver, with their Adagrad state. Every shard sends one to every other (maybe empty)."""

    version: int
    keys: np.ndarray = array("int64", 1)
    weights: np.ndarray = array("float32", 2)
    accum: np.ndarray = array("float32", 2)

    def check(self) -> None:
        require(self.weights.shape[0] == self.accum.shape[0] == self.keys.shape[0]
                and self.accum.shape[1] in (1, self.weights.shape[1]),
                "rows, keys and Adagrad state differ")
        require(finite(self.weights) and finite(self.accum),
                "non-finite rows")


@message()
class Moved(Message):
    """A shard has sent and received every Handover of placement ``version``."""

    version: int
    sent: int
    received: int


@message()
class WindowWork(Message):
    """A shard's work in allocation windows it has finished (ps -> control, with a heartbeat,
    until control answers WorkRecorded): one row of ``figures`` per window of ``windows``
    (ascending, distinct), in WORK_SLOTS order. A window is finished when control has said it
    is closed (every feeder's batches of it sent) and no batch of it held by the shard still
    expects gradients. ``late_pairs``: pairs of work done for windows already recorded (a batch
    sent again), counted and left out of the history."""

    late_pairs: int
    windows: np.ndarray = array("int64", 1)
    figures: np.ndarray = array("float64", 2)

    def check(self) -> None:
        n = len(self.windows)
        require(self.figures.shape == (n, WORK_FIGURES), f"figures must be n x {WORK_FIGURES}")
        require(n <= MAX_WINDOWS_REPORTED, "too many windows in one report")
        require(not n or (self.windows.min() >= 0 and bool((np.diff(self.windows) > 0).all())),
                "windows must be ascending, distinct and not negative")
        require(finite(self.figures) and (not n or self.figures.min() >= 0),
                "figures must be finite and not negative")
        require(self.late_pairs >= 0, "negative late pairs")


@message()
class WorkRecorded(Message):
    """Control's answer to WindowWork (control -> that shard, on its link): the windows it has
    recorded, or never will (the shard forgets them), and the newest window closed, every
    window up to which the shard may finish. -1: none closed yet."""

    closed: int
    windows: np.ndarray = array("int64", 1)

    def check(self) -> None:
        require(self.closed >= -1 and (not self.windows.size or self.windows.min() >= 0),
                "negative window")
