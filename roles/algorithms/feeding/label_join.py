"""The join of a stream's impressions with labels that arrive later on their own topic
(``[stream.labels]``): pure, arrays in and out, owned by a feeder.

An impression waits for its label by id; it leaves joined when its label comes, or as a negative
once ``window_s`` of event time has passed since it (``expired_negative``). A label that comes
before its impression waits the same window for it (a broker does not order two topics); if
none comes it is ``labels_unmatched``. A label for an impression that has already left (joined,
or trained as a negative) is ``labels_late``: counted, not trained, since training the row again
would train it twice (docs/streams.md). A second label for an id waiting as a label, or a second
impression of an id still known, is a duplicate: counted, the first one kept.

Time is event time: the join's clock is the newest event time seen on either topic
(``advance`` moves it on, e.g. from the broker's clock when a topic is quiet). Entries leave in
arrival order: one whose time is older than the window leaves once those that arrived before it
have (events arrive close to their time order; a straggler waits at most for the window of the
one ahead of it). What the join holds is the impressions and labels of one window: its memory
is bounded by window x rate, whatever the length of the stream.

Ids are int64 (a string id is hashed to one by the caller, as sparse values are); each
impression carries a ``handle`` (int64) by which the caller finds its row.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


class _IdRows:
    """Each held id's row (a dict: the shards' hashed ``KeyIndex`` is theirs to own; the ids
    held are one window's)."""

    BYTES_PER_ID = 100   # a dict entry of two ints, about

    def __init__(self) -> None:
        self.rows: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def nbytes(self) -> int:
        return len(self.rows) * self.BYTES_PER_ID

    def find(self, ids: np.ndarray) -> np.ndarray:
        get = self.rows.get
        return np.fromiter((get(i, -1) for i in ids.tolist()), dtype=np.int64, count=len(ids))

    def insert(self, ids: np.ndarray, rows: np.ndarray) -> None:
        self.rows.update(zip(ids.tolist(), rows.tolist(), strict=True))

    def delete(self, ids: np.ndarray) -> None:
        for i in ids.tolist():
            self.rows.pop(i, None)


class Waiting:
    """Ids in arrival order, each with an event time and a value: a ring of rows, and an index
    id -> row. ``add`` takes ids not already held."""

    def __init__(self, capacity: int = 1024):
        self._alloc(max(16, capacity))
        self.head = 0   # the oldest row held (a count of rows ever added)
        self.tail = 0   # the next row's

    def _alloc(self, capacity: int) -> None:
        self.ids = np.zeros(capacity, dtype=np.int64)
        self.times = np.zeros(capacity, dtype=np.float64)
        self.values = np.zeros(capacity, dtype=np.float64)
        self.live = np.zeros(capacity, dtype=bool)
        self.index = _IdRows()

    def __len__(self) -> int:
        return len(self.index)

    @property
    def capacity(self) -> int:
        return len(self.ids)

    def nbytes(self) -> int:
        return int(self.ids.nbytes + self.times.nbytes + self.values.nbytes
                   + self.live.nbytes + self.index.nbytes)

    def find(self, ids: np.ndarray) -> np.ndarray:
        """Each id's row, -1 where it is not held."""
        return self.index.find(ids).astype(np.int64)

    def add(self, ids: np.ndarray, times: np.ndarray, values: np.ndarray) -> None:
        n = len(ids)
        if self.tail + n - self.head > self.capacity:
            self._grow(self.tail + n - self.head)
        rows = (self.tail + np.arange(n)) % self.capacity
        self.ids[rows], self.times[rows], self.values[rows] = ids, times, values
        self.live[rows] = True
        self.index.insert(ids, rows.astype(np.int32))
        self.tail += n

    def take(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Removes the ids held: (which of ``ids`` were held, their values)."""
        rows = self.find(ids)
        held = rows >= 0
        values = self.values[rows[held]].copy()
        if held.any():
            self.live[rows[held]] = False
            self.index.delete(ids[held])
        self._trim()
        return held, values

    def expire(self, before: float) -> tuple[np.ndarray, np.ndarray]:
        """Removes, in arrival order, the oldest entries whose time is before ``before`` (up to
        the first that is not): their ids and values."""
        out_ids, out_values = [], []
        while self.head < self.tail:
            n = min(self.tail - self.head, 4096)
            rows = (self.head + np.arange(n)) % self.capacity
            live = self.live[rows]
            old = ~live | (self.times[rows] < before)
            stop = n if old.all() else int(np.argmin(old))
            gone = rows[:stop][live[:stop]]
            if len(gone):
                out_ids.append(self.ids[gone].copy())
                out_values.append(self.values[gone].copy())
                self.live[gone] = False
                self.index.delete(self.ids[gone])
            self.head += stop
            if stop < n:
                break
        if not out_ids:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
        return np.concatenate(out_ids), np.concatenate(out_values)

    def _trim(self) -> None:
        """Rows taken at the head are free again."""
        while self.head < self.tail and not self.live[self.head % self.capacity]:
            self.head += 1

    def _grow(self, needed: int) -> None:
        rows = (self.head + np.arange(self.tail - self.head)) % self.capacity
        keep = rows[self.live[rows]]
        ids, times, values = self.ids[keep], self.times[keep], self.values[keep]
        size = self.capacity
        while size < max(needed, 2 * len(keep)):
            size *= 2
        self._alloc(size)
        self.head, self.tail = 0, 0
        self.add(ids, times, values)

    def state(self) -> dict[str, np.ndarray]:
        """What it holds, in arrival order (for a checkpoint)."""
        rows = (self.head + np.arange(self.tail - self.head)) % self.capacity
        rows = rows[self.live[rows]]
        return {"ids": self.ids[rows].copy(), "times": self.times[rows].copy(),
                "values": self.values[rows].copy()}

    @classmethod
    def from_state(cls, state: dict[str, np.ndarray]) -> Waiting:
        w = cls(2 * len(state["ids"]))
        w.add(state["ids"], state["times"], state["values"])
        return w


@dataclass
class Joined:
    """What leaves the join for training: the handles of impressions and their labels (1/0;
    0 for those expired)."""

    handles: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    labels: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))

    def __len__(self) -> int:
        return len(self.handles)

    @staticmethod
    def of(parts: list[tuple[np.ndarray, np.ndarray]]) -> Joined:
        parts = [(h, v) for h, v in parts if len(h)]
        if not parts:
            return Joined()
        return Joined(np.concatenate([h for h, _ in parts]).astype(np.int64),
                      np.concatenate([v for _, v in parts]).astype(np.float32))


@dataclass
class JoinCounts:
    joined: int = 0
    expired_negative: int = 0
    labels_late: int = 0
    labels_unmatched: int = 0
    duplicate_impressions: int = 0
    duplicate_labels: int = 0


def _first_seen(ids: np.ndarray) -> np.ndarray:
    """Which entries are the first of their id in ``ids``."""
    _, first = np.unique(ids, return_index=True)
    mask = np.zeros(len(ids), dtype=bool)
    mask[first] = True
    return mask


class LabelJoin:
    def __init__(self, window_s: float):
        if not window_s > 0:
            raise ValueError(f"[stream.labels] window_s must be above 0, got {window_s}")
        self.window_s = window_s
        self.impressions = Waiting()   # value: the caller's handle
        self.labels = Waiting()        # value: the label, before its impression
        self.resolved = Waiting()      # ids that left this window: a label for one is late
        self.now = -np.inf
        self.counts = JoinCounts()
        self._unmatched: list[np.ndarray] = []   # ids of labels expired unmatched, not yet told

    def waiting(self) -> int:
        return len(self.impressions) + len(self.labels)

    def nbytes(self) -> int:
        return self.impressions.nbytes() + self.labels.nbytes() + self.resolved.nbytes()

    def add_impressions(self, ids: np.ndarray, times: np.ndarray,
                        handles: np.ndarray) -> tuple[Joined, np.ndarray]:
        """Impressions in: (what leaves the join now, the handles of duplicates, which the
        caller sets aside)."""
        ids, times, handles = (np.asarray(ids, np.int64), np.asarray(times, np.float64),
                               np.asarray(handles, np.int64))
        new = _first_seen(ids) & (self.impressions.find(ids) < 0) & \
            (self.resolved.find(ids) < 0)
        duplicates = handles[~new]
        self.counts.duplicate_impressions += len(duplicates)
        ids, times, handles = ids[new], times[new], handles[new]
        early, labels = self.labels.take(ids)
        joined = (handles[early], labels)
        self.resolved.add(ids[early], times[early], np.zeros(int(early.sum())))
        self.counts.joined += int(early.sum())
        self.impressions.add(ids[~early], times[~early], handles[~early].astype(np.float64))
        expired = self.advance(float(times.max()) if len(times) else self.now)
        return Joined.of([joined, (expired.handles, expired.labels)]), duplicates

    def add_labels(self, ids: np.ndarray, labels: np.ndarray, times: np.ndarray) -> Joined:
        """Labels in: what leaves the join now."""
        ids, labels, times = (np.asarray(ids, np.int64), np.asarray(labels, np.float64),
                              np.asarray(times, np.float64))
        first = _first_seen(ids)
        self.counts.duplicate_labels += int((~first).sum())
        ids, labels, times = ids[first], labels[first], times[first]
        found, handles = self.impressions.take(ids)
        joined = (handles.astype(np.int64), labels[found])
        self.resolved.add(ids[found], times[found], np.zeros(int(found.sum())))
        self.counts.joined += int(found.sum())
        rest = ~found
        late = rest & (self.resolved.find(ids) >= 0)
        self.counts.labels_late += int(late.sum())
        early = rest & ~late
        again = early & (self.labels.find(ids) >= 0)
        self.counts.duplicate_labels += int(again.sum())
        early &= ~again
        self.labels.add(ids[early], times[early], labels[early])
        expired = self.advance(float(times.max()) if len(times) else self.now)
        return Joined.of([joined, (expired.handles, expired.labels)])

    def unmatched_ids(self) -> np.ndarray:
        """The ids of the labels that waited a window for their impression in vain, since the
        last call (their messages are done with)."""
        gone, self._unmatched = self._unmatched, []
        return np.concatenate(gone) if gone else np.zeros(0, dtype=np.int64)

    def advance(self, now: float) -> Joined:
        """The clock moved to ``now`` (never back): impressions older than the window leave as
        negatives, labels older than it are unmatched, resolved ids are forgotten."""
        self.now = max(self.now, now)
        before = self.now - self.window_s
        ids, handles = self.impressions.expire(before)
        self.counts.expired_negative += len(ids)
        self.resolved.add(ids, np.full(len(ids), self.now), np.zeros(len(ids)))
        unmatched, _ = self.labels.expire(before)
        self.counts.labels_unmatched += len(unmatched)
        self._unmatched.append(unmatched)
        self.resolved.expire(before)
        return Joined(handles.astype(np.int64), np.zeros(len(handles), dtype=np.float32))
