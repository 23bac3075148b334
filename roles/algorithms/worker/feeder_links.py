"""A worker's links to the feeders' ledgers (pure; no sockets: the worker sends what these
return to the feeder they name).

A batch's feeder is the one that reads its part (control's PartMap; batch ids carry the
part): a worker pulls no batch before it has the map. The worker keeps its latest acks to each
feeder and the batches it trained whose ack is not sent yet: when a feeder is restarted
(FeederBack) it is told them again, then the batches of its that are granted here (Holding),
then asked again for the grants it never answered. When a lost feeder's parts move to another
feeder, every batch asked of the lost one (granted or not) is asked of the new one.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from roles.algorithms.worker.pulled import Pipeline
from roles.protocol.datapath import Ack, Holding, PartMap, Taken, split_batch_id
from zbus.codec import Message, ProtocolError


class FeederLinks:
    def __init__(self, feeders: int, acks_kept: int):
        self.feeders = feeders
        self.owners: np.ndarray | None = None  # part -> feeder (control's PartMap)
        self.map_version = -1
        self.acks_kept: list[deque[Ack]] = [deque(maxlen=acks_kept) for _ in range(feeders)]
        self.unacked: set[int] = set()  # batches taken to run whose ack is not sent yet
        self.restarts: dict[int, int] = {}  # feeder -> the restart generation acted on

    def feeder_of(self, batch_id: int) -> int:
        """The feeder that reads the batch's part."""
        part = split_batch_id(batch_id)[1]
        owner = int(self.owners[part]) if self.owners is not None \
            and part < len(self.owners) else -1
        if not 0 <= owner < self.feeders:
            raise ProtocolError("bad_field", f"batch {batch_id} of part {part}: no feeder")
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

    def newer(self, m: PartMap) -> bool:
        return m.version > self.map_version

    def moved(self, m: PartMap, pipeline: Pipeline) -> list[tuple[int, Taken]]:
        """Control's new PartMap: the Takens to ask again of their part's new feeder, for
        every batch of a moved part asked for, granted or not. The new feeder knows nothing of
        the lost one's grants: it feeds the part again from its last progress report, and
        grants the batch to whoever asks first once it has sent it again. A grant of the lost
        feeder's is therefore void (the batch waits for the new feeder's answer): kept, the
        batch could run here while its copy runs elsewhere, or wait for ever for embeddings
        that the shards no longer hold once that copy's update is applied. The new feeder
        grants the batch (it has sent it again and nobody holds it) or refuses it (not sent
        again yet, or held by another worker): it goes, and comes again as any batch."""
        before, self.owners = self.owners, np.array(m.owners)
        self.map_version = m.version
        again = []
        for b in pipeline:
            part = split_batch_id(b.batch_id)[1]
            moved = before is not None and part < len(before) and before[part] != m.owners[part]
            if moved and b.asked:
                b.granted = False
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
