"""Which of a stream's messages are wholly trained (``MessageTracker``): pure bookkeeping, owned
by a feeder. The unit the broker acknowledges is a message; the unit trained is an event; a
message may hold many events, split over several batches, and an event set aside (malformed)
counts as done at once. A message is told to the broker as done only when every one of its
events is: so a feeder that dies leaves the broker to deliver again exactly the messages with
some event not yet trained.

A message delivered again while it is still held (JetStream delivers it again once its ack wait
passes without an ack; a Kafka rebalance) is a duplicate: ``add`` leaves it out, so no event of
it is trained twice here. ``overdue`` lists the held messages delivered longest ago, for the
feeder to tell the broker they are still being worked on (JetStream's in-progress ack) before
their ack wait passes.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from roles.events import Delivery


@dataclass
class _Held:
    delivery: Delivery
    left: int          # events not yet trained
    total: int         # events to train (told by ``events``)
    since: float       # when it was delivered, or last said to be in progress
    order: int         # its place among the deliveries added
    rejected: int = 0  # its events set aside as malformed


class MessageTracker:
    def __init__(self) -> None:
        self._held: OrderedDict[tuple[int, int], _Held] = OrderedDict()
        self._ready: set[tuple[int, int]] = set()   # held, every event trained: to release
        self._added = 0
        self.duplicates = 0      # deliveries left out: already held
        self.events_held = 0     # events of held messages not yet trained

    def __len__(self) -> int:
        return len(self._held)

    def add(self, deliveries: list[Delivery], now: float) -> list[int]:
        """New deliveries: the indices (into ``deliveries``) of those to decode and train; a
        message already held, or twice in the list, is left out."""
        fresh = []
        for i, d in enumerate(deliveries):
            key = (d.partition, d.position)
            if key in self._held:
                self.duplicates += 1
                continue
            self._held[key] = _Held(d, -1, -1, now, self._added)   # events: by ``events``
            self._added += 1
            fresh.append(i)
        return fresh

    def events(self, delivery: Delivery, trained: int, rejected: int = 0) -> None:
        """How many of ``delivery``'s events go to training, and how many were set aside as
        malformed."""
        key = (delivery.partition, delivery.position)
        held = self._held[key]
        held.left = held.total = trained
        held.rejected = rejected
        self.events_held += trained
        if trained == 0:
            self._ready.add(key)

    def trained(self, where: list[tuple[int, int]], counts: list[int]) -> None:
        """``counts[i]`` events of message ``where[i]`` (partition, position) were trained."""
        for key, n in zip(where, counts, strict=True):
            held = self._held.get(key)
            if held is not None:
                held.left -= n
                self.events_held -= n
                if held.left == 0:
                    self._ready.add(key)

    def trained_rows(self, origin: np.ndarray) -> None:
        """One event trained (or done with) per row of ``origin`` [n, 2] (partition,
        position)."""
        if len(origin):
            where, counts = np.unique(np.asarray(origin, np.int64).reshape(-1, 2), axis=0,
                                      return_counts=True)
            self.trained([(int(p), int(q)) for p, q in where], counts.tolist())

    def done(self) -> list[Delivery]:
        """The held messages every event of which is trained (or set aside), now released:
        acknowledge them to the broker."""
        keys = sorted(self._ready, key=lambda k: self._held[k].order)   # in delivery order
        self._ready.clear()
        return [self._held.pop(k).delivery for k in keys]

    def forget(self, keys: list[tuple[int, int]]) -> tuple[list[Delivery], int]:
        """Stop holding these messages (partition, position), none of whose events is
        trained or on its way: set aside untrained (a revoked partition's); their deliveries
        and their malformed events."""
        out, rejected = [], 0
        for key in keys:
            held = self._held.pop(key, None)
            if held is not None:
                self._ready.discard(key)
                self.events_held -= max(held.left, 0)
                rejected += held.rejected
                out.append(held.delivery)
        return out, rejected

    def holds(self, partition: int, position: int) -> bool:
        return (partition, position) in self._held

    def overdue(self, now: float, after_s: float) -> list[Delivery]:
        """Held messages delivered (or said in progress) more than ``after_s`` ago; their
        clock starts again."""
        out = []
        for held in self._held.values():
            if now - held.since > after_s:
                out.append(held.delivery)
                held.since = now
        return out

    def partly_trained(self) -> list[tuple[int, int, int]]:
        """(partition, position, events trained) of the held messages some of whose events
        are trained."""
        return [(h.delivery.partition, h.delivery.position, h.total - h.left)
                for h in self._held.values() if h.total > 0 and 0 < h.total - h.left]

    def oldest_time_s(self) -> float | None:
        """The broker's time of the oldest message held (None if none)."""
        if not self._held:
            return None
        return min(h.delivery.time_s for h in self._held.values())
