"""A worker's links to the feeders' ledgers (pure; no sockets: the worker sends what these
return to the feeder they name).

A batch's feeder is the one that feeds its slice (control's SliceMap; batch ids carry the
slice). The worker keeps its latest acks to each feeder and the batches it trained whose ack
is not sent yet: when a feeder is restarted (FeederBack) it is told them again, then the
batches of its that are granted here (Holding), then asked again for the grants it never
answered. When a lost feeder's slices move to another feeder, a Taken that went to the lost one
is asked of the new one.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from roles.algorithms.pulled import Pipeline
from roles.protocol.datapath import Ack, Holding, Taken, split_batch_id
from zbus.codec import Message, ProtocolError


class FeederLinks:
    def __init__(self, feeders: int, acks_kept: int):
        self.feeders = feeders
        self.owners: list[int] = list(range(feeders))  # slice -> feeder (control's SliceMap)
        self.acks_kept: list[deque[Ack]] = [deque(maxlen=acks_kept) for _ in range(feeders)]
        self.unacked: set[int] = set()  # batches taken to run whose ack is not sent yet
        self.restarts: dict[int, int] = {}  # feeder -> the restart generation acted on

    def feeder_of(self, batch_id: int) -> int:
        """The feeder that owns the batch's slice."""
        slice_ = split_batch_id(batch_id)[1]
        owner = self.owners[slice_] if slice_ < len(self.owners) else slice_
        if not 0 <= owner < self.feeders:
            raise ProtocolError("bad_field", f"batch {batch_id} of slice {slice_}: no feeder")
        return owner

    def running(self, batch_id: int) -> None:
        """A batch leaves the pipeline to run: it is held here until its ack is sent."""
        self.unacked.add(batch_id)

    def acked(self, ack: Ack) -> int:
        """The ack goes out (to the feeder returned): kept, for a restart of that feeder."""
        feeder = self.feeder_of(ack.batch_id)
        self.acks_kept[feeder].append(ack)
        self.unacked.discard(ack.batch_id)
        return feeder

    def moved(self, owners: list[int], pipeline: Pipeline) -> list[tuple[int, Taken]]:
        """Control's new SliceMap: the Takens to ask again of their slice's new feeder (it
        refuses them: it feeds the batch again itself)."""
        before, self.owners = self.owners, owners
        again = []
        for b in pipeline:
            slice_ = split_batch_id(b.batch_id)[1]
            moved = slice_ < len(owners) and before[slice_] != owners[slice_]  # same slices
            if moved and b.asked and not b.granted:
                again.append((self.feeder_of(b.batch_id), Taken(batch_id=b.batch_id)))
        return again

    def restart(self, feeder: int, generation: int) -> bool:
        """FeederBack: True when this restart of the feeder is news (to answer)."""
        if generation <= self.restarts.get(feeder, 0) or not 0 <= feeder < self.feeders:
            return False
        self.restarts[feeder] = generation
        return True

    def restarted(self, feeder: int, pipeline: Pipeline) -> list[Message]:
        """What a restarted feeder's dead process may have lost, to send it in order: the
        latest acks, the batches it granted here not acknowledged yet (Holding), then the
        Takens it never answered."""
        mine = [b for b in pipeline if self.feeder_of(b.batch_id) == feeder]
        held = [b.batch_id for b in mine if b.granted]
        held += [b for b in self.unacked if self.feeder_of(b) == feeder]
        return [*self.acks_kept[feeder], Holding(held=np.array(held, dtype=np.int64)),
                *(Taken(batch_id=b.batch_id) for b in mine if b.asked and not b.granted)]
