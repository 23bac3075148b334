"""A worker's side of the shards: a batch's embeddings in, its gradient rows out.

In mode ``push`` the shards send a batch's rows unasked (the feeder's grant tells them where);
the worker asks (Lookup) only a shard restarted meanwhile, or one whose rows have not come
``PUSH_ASK_AFTER_S`` after the batch was the next to train (a Deliver lost with a feeder that
died). In mode ``pull`` it asks every shard when the batch is the next to train (``look_up``),
or with the gradients of the batch before (GradsLookup). Each batch's wait for its embeddings
(from when it was the next to train, lacking only them) is sampled for the summary, and the
look-ups and replies counted.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import zmq

from roles.algorithms.worker.pulled import Due, Pipeline, PulledBatch, WaitSample
from roles.protocol.datapath import EmbeddingGrads, Embeddings, GradsLookup, Lookup
from zbus.codec import Message

PUSH_ASK_AFTER_S = 2.0  # mode push: a shard's rows this late after the batch was next: ask
WAITS_KEPT = 512  # embedding waits kept (a uniform sample) for the summary's quantiles


class ShardSide:
    def __init__(self, index: int, push: bool, pipeline: Pipeline, shards: list[zmq.Socket],
                 send: Callable[[zmq.Socket, Message], object],
                 reconnect: Callable[[zmq.Socket], zmq.Socket], due: Due):
        self.push, self.pipeline, self.shards = push, pipeline, shards
        self.send, self.reconnect, self.due = send, reconnect, due
        self.shards_back: dict[int, int] = {}  # shard -> the restart generation acted on
        self.waits = WaitSample(WAITS_KEPT, index)  # of the batches' embedding waits
        self.counts = {"lookups_overdue": 0, "lookups_with_grads": 0, "lookup_wait_s": 0.0}

    def embeddings(self, shard: int, e: Embeddings) -> bool:
        """A shard's rows for a batch; False when the batch is not here (refused meanwhile)."""
        batch = self.pipeline.embeddings(shard, e)
        if batch is None:
            return False
        if batch.has_embeddings():
            now = time.monotonic()
            if batch.looked_up_at is not None:  # rows that came before it asked
                self.counts["lookup_wait_s"] += now - batch.looked_up_at
            self.waits.add(now - batch.needed_at if batch.needed_at else 0.0)
        return True

    def look_up(self, batch: PulledBatch) -> None:
        batch.looked_up_at = time.monotonic()
        for sock in self.shards:
            self.send(sock, Lookup(batch_id=batch.batch_id, train=not batch.sample.eval))

    def ask_overdue(self, now: float) -> None:
        """Mode push: the next batch's rows from a shard have not come ``PUSH_ASK_AFTER_S``
        after it was the next to train: ask that shard (again every ``PUSH_ASK_AFTER_S``
        while they do not come)."""
        batch = self.pipeline.overdue(now, PUSH_ASK_AFTER_S)
        if batch is not None:
            for i, reply in enumerate(batch.replies):
                if reply is None:
                    self.send(self.shards[i], Lookup(batch_id=batch.batch_id,
                                                     train=not batch.sample.eval))
                    self.counts["lookups_overdue"] += 1

    def send_grads(self, batch_id: int, grads: list[np.ndarray]) -> None:
        """Each shard the gradients of its rows; in mode pull, with the look-up of the next
        batch when it is already granted and due (GradsLookup)."""
        after = None if self.push else self.pipeline.wanting_embeddings(self.due,
                                                                        time.monotonic())
        if after is not None:
            after.looked_up_at = time.monotonic()
            self.counts["lookups_with_grads"] += len(self.shards)
        for sock, g in zip(self.shards, grads, strict=True):
            self.send(sock, EmbeddingGrads(batch_id=batch_id, grads=g) if after is None else
                      GradsLookup(batch_id=batch_id, lookup=after.batch_id,
                                  train=not after.sample.eval, grads=g))

    def restarted(self, shard: int, generation: int) -> None:
        """ShardBack: connect anew if the shard was made again elsewhere (a pod rescheduled),
        and ask it again for the rows of every batch looked up that it has not sent."""
        if generation <= self.shards_back.get(shard, 0) or not 0 <= shard < len(self.shards):
            return
        self.shards_back[shard] = generation
        self.shards[shard] = self.reconnect(self.shards[shard])
        for b in self.pipeline.lacking(shard):
            self.send(self.shards[shard], Lookup(batch_id=b.batch_id, train=not b.sample.eval))

    def counters(self) -> dict:
        return {**self.counts, "embeddings": "push" if self.push else "pull",
                "embedding_waits": self.waits.seen,
                "embedding_wait_ms": self.waits.milliseconds()}
