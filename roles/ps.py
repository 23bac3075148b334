"""A parameter-server shard: the embedding rows of the keys it owns and their Adagrad state.

Per batch: the feeder sends the keys this shard owns (BatchKeys); the shard dedupes them, finds
or creates their rows and keeps (rows, positions, inverse) until the batch's gradients arrive.
A worker's Lookup is answered as soon as both the keys and the request are here (in either
order). EmbeddingGrads are applied once per batch: the shard remembers applied batch ids (the
current and the previous epoch), so a gradient sent twice is refused and counted. A batch sent
again (its worker died) brings its keys again: while the batch is held that is a no-op, after
its gradients were applied the rows are held again for the new worker's look-up, and its
gradients will be refused.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zmq

from roles.batching import split_batch_id
from roles.cli import role_main
from roles.embedding_table import EmbeddingTable
from roles.job import Job
from roles.model_files import embeddings_file, save_embeddings
from zbus.node import Node
from zbus.wire import (
    BatchKeys,
    EmbeddingGrads,
    Embeddings,
    Lookup,
    ProtocolError,
    Ready,
)

log = logging.getLogger(__name__)
MAX_WAITING = 10_000  # look-ups parked for keys that have not arrived (bounded)
MAX_EVAL_KEPT = 256   # answered eval batches still held, for a second copy's look-up


@dataclass
class HeldBatch:
    rows: np.ndarray       # table row of each distinct key
    positions: np.ndarray  # int32 position in the batch grid of each key occurrence
    inverse: np.ndarray    # int32 index into rows of each key occurrence


class Shard(Node):
    role = "ps"

    def __init__(self, job: Job, index: int):
        super().__init__(job.cluster, index, job.fingerprint())
        self.job = job
        self.sock = self.bind(zmq.ROUTER, job.cluster.endpoint(f"ps-{index}"), self.on_message)
        t = job.train
        self.table = EmbeddingTable(job.model.embedding_dim, t.embedding_init, t.embedding_lr,
                                    seed=t.seed)
        self.held: dict[int, HeldBatch] = {}
        self.waiting: OrderedDict[int, list[tuple[bytes, bool]]] = OrderedDict()
        self.applied: set[int] = set()
        self.answered_eval: OrderedDict[int, None] = OrderedDict()
        self.newest_epoch = 0
        self.counts = {"key_messages": 0, "lookups": 0, "updates": 0, "duplicates_refused": 0,
                       "keys_received": 0, "keys_repeated": 0}

    def on_welcome(self) -> None:
        self.state = "ready"
        self.to_control(Ready(info={"keys": len(self.table)}))

    def export_part(self, where: Path) -> tuple[str, list[str]]:
        """A snapshot of every row this shard holds (the export's embeddings-ps-<i>.npz)."""
        where.mkdir(parents=True, exist_ok=True)
        keys, rows = self.table.index.items()
        order = np.argsort(rows)
        name = embeddings_file(self.index)
        save_embeddings(where / name, keys[order], self.table.weights[rows[order]])
        log.info("exported %d rows to %s", len(keys), where / name)
        return self.node_id, [name]

    def on_message(self, identity: bytes | None, env) -> None:
        match env.msg:
            case BatchKeys() as msg:
                self.handle_keys(msg)
            case Lookup() as msg:
                self.handle_lookup(identity, msg)
            case EmbeddingGrads() as msg:
                self.handle_grads(msg)
            case _:
                self.unexpected(env, "shard socket")

    def handle_keys(self, msg: BatchKeys) -> None:
        if msg.batch_id in self.held:
            self.counts["keys_repeated"] += 1
            return
        self._forget_old_epochs(split_batch_id(msg.batch_id)[0])
        uniq, inverse = np.unique(msg.keys, return_inverse=True)
        self.held[msg.batch_id] = HeldBatch(rows=self.table.rows_for(uniq),
                                            positions=msg.positions,
                                            inverse=inverse.astype(np.int32).reshape(-1))
        self.counts["key_messages"] += 1
        self.counts["keys_received"] += len(msg.keys)
        for identity, train in self.waiting.pop(msg.batch_id, []):
            self.answer(identity, msg.batch_id, train)

    def handle_lookup(self, identity: bytes, msg: Lookup) -> None:
        if msg.batch_id in self.held:
            self.answer(identity, msg.batch_id, msg.train)
            return
        self.waiting.setdefault(msg.batch_id, []).append((identity, msg.train))
        while len(self.waiting) > MAX_WAITING:
            dropped, _ = self.waiting.popitem(last=False)
            self.reject(ProtocolError("lookup_dropped", f"batch {dropped} never got its keys"))

    def answer(self, identity: bytes, batch_id: int, train: bool) -> None:
        held = self.held[batch_id]
        if not train:  # eval batches get no gradients: keep the newest few, in case a copy
            self.answered_eval[batch_id] = None  # of the batch was sent again
            while len(self.answered_eval) > MAX_EVAL_KEPT:
                self.held.pop(self.answered_eval.popitem(last=False)[0], None)
        self.send(self.sock, Embeddings(batch_id=batch_id, positions=held.positions,
                                        inverse=held.inverse,
                                        rows=self.table.weights[held.rows]), identity=identity)
        self.counts["lookups"] += 1

    def handle_grads(self, msg: EmbeddingGrads) -> None:
        if msg.batch_id in self.applied:
            self.counts["duplicates_refused"] += 1
            self.held.pop(msg.batch_id, None)
            return
        held = self.held.get(msg.batch_id)
        if held is None:
            raise ProtocolError("unknown_batch", f"gradients for batch {msg.batch_id}, "
                                                 "which this shard does not hold")
        if msg.grads.shape != (len(held.rows), self.table.dim):
            raise ProtocolError("bad_shape", f"gradients of shape {msg.grads.shape} for "
                                             f"{len(held.rows)} rows of {self.table.dim}")
        del self.held[msg.batch_id]
        self.table.adagrad(held.rows, msg.grads)
        self.applied.add(msg.batch_id)
        self.counts["updates"] += 1

    def _forget_old_epochs(self, epoch: int) -> None:
        if epoch > self.newest_epoch:
            self.newest_epoch = epoch
            self.applied = {b for b in self.applied if split_batch_id(b)[0] >= epoch - 1}

    def counters(self) -> dict:
        return {**self.counts, "keys": len(self.table), "held_batches": len(self.held),
                "waiting_lookups": len(self.waiting)}


def main() -> None:
    role_main(Shard)


if __name__ == "__main__":
    main()
