"""A worker: one replica of the dense network.

Per batch it pulls dense features, labels and weights from the sample queue (never sparse
keys), asks every shard for the batch's embeddings by batch id, runs forward and backward,
sends each shard the gradients of its rows, updates the dense weights and acknowledges the
batch to the feeder. Up to ``prefetch`` batches are pulled ahead so that their look-ups are in
flight while the current batch trains.

Dense synchronisation (``[train] sync``):

- ``step``: the dense gradient of every step goes to the aggregator, which applies it with its
  Adam and answers with the new weights; the worker waits for them (no local optimiser).
- ``every``: the worker trains with its own Adam. After ``sync_every`` local steps it tells
  control it is ready; when control publishes Aggregate(r) it sends its delta (weights now
  minus weights at its last contribution) and keeps training. When the combined weights W(r)
  arrive it adopts ``W(r) + (its progress since it contributed)``, so no local step is lost
  and no worker ever blocks on a slower one.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import torch
import zmq

from roles.cli import role_main
from roles.job import Job
from roles.model import auto_threads, build_model, pick_device, set_threads, weighted_loss_sum
from zbus.node import Node
from zbus.wire import (
    Ack,
    Aggregate,
    Contribution,
    EmbeddingGrads,
    Embeddings,
    Lookup,
    ProtocolError,
    Ready,
    RoundReady,
    SampleBatch,
    StepGrad,
    Weights,
    WeightsRequest,
)

log = logging.getLogger(__name__)


@dataclass
class PulledBatch:
    sample: SampleBatch
    replies: list[Embeddings | None]
    asked_at: float = field(default_factory=time.monotonic)

    def complete(self) -> bool:
        return all(r is not None for r in self.replies)


class Worker(Node):
    role = "worker"

    def __init__(self, job: Job, index: int):
        super().__init__(job.cluster, index, job.fingerprint())
        self.job = job
        c, t = job.cluster, job.train
        self.fields, self.dim = len(job.sparse_fields), job.model.embedding_dim
        self.n_dense = len(job.dense_fields)
        self.threads = set_threads(t.torch_threads or auto_threads(c, os.cpu_count() or 1))
        self.device = pick_device(t.device)
        self.model = build_model(job).to(self.device)
        self.params = list(self.model.parameters())
        self.size = sum(p.numel() for p in self.params)
        self.step_mode = t.sync == "step"
        self.optimizer = None if self.step_mode else torch.optim.Adam(self.params, lr=t.dense_lr)
        self.samples = self.connect(zmq.PULL, c.endpoint("samples"), self.on_sample,
                                    rcvhwm=t.prefetch)
        self.pause(self.samples, True)  # until the first weights are here
        self.acks = self.connect(zmq.DEALER, c.endpoint("ledger"))
        self.shards = [self.connect(zmq.DEALER, c.endpoint(f"ps-{i}"),
                                    functools.partial(self.on_shard, i))
                       for i in range(c.shards)]
        self.aggregator = self.connect(zmq.DEALER, c.endpoint("aggregator"), self.on_reply)
        self.weights_pub = self.connect(zmq.SUB, c.endpoint("aggregator_pub"),
                                        self.on_broadcast)
        self.pipeline: deque[PulledBatch] = deque()
        self.by_id: dict[int, PulledBatch] = {}
        self.version = -1                 # round of the global weights adopted last
        self.base: np.ndarray | None = None   # weights at the last contribution or adoption
        self.sent: np.ndarray | None = None   # weights when the in-flight contribution left
        self.sent_round = -1
        self.deferred_round: int | None = None
        self.awaiting_step: tuple[PulledBatch, float, float] | None = None
        self.step_sent_at = 0.0
        self.replies_due: deque[str] = deque()  # "request" or "step": the aggregator answers
        self.asked_weights_at = 0.0             # a DEALER's requests in order
        self.steps_since = 0
        self.coef_since = 0.0
        self.samples_since = 0
        self.ready_sent_for = -1
        self.counts = {"samples_trained": 0, "batches_trained": 0, "eval_samples": 0,
                       "contributions": 0, "rounds_adopted": 0, "lookup_wait_s": 0.0,
                       "compute_s": 0.0, "step_wait_s": 0.0}

    # -- weights -----------------------------------------------------------------------------
    def get_flat(self) -> np.ndarray:
        with torch.no_grad():
            return torch.cat([p.detach().reshape(-1) for p in self.params]).cpu().numpy()

    def set_flat(self, flat: np.ndarray) -> None:
        source = torch.from_numpy(np.array(flat, dtype=np.float32)).to(self.device)
        offset = 0
        with torch.no_grad():
            for p in self.params:
                n = p.numel()
                p.copy_(source[offset:offset + n].view_as(p))
                offset += n

    def adopt(self, w: Weights) -> None:
        """Take the global weights of a newer round, keeping local progress not yet in them."""
        if w.params.shape != (self.size,):
            raise ProtocolError("bad_shape", f"weights of {w.params.shape}, model has "
                                             f"{self.size} parameters")
        if w.round <= self.version:
            return
        new = np.array(w.params, dtype=np.float32)
        if self.base is not None:
            reference = self.sent if self.sent is not None else self.base
            new = new + (self.get_flat() - reference)
        self.set_flat(new)
        self.base = np.array(w.params, dtype=np.float32)
        self.version, self.sent, self.sent_round = w.round, None, -1
        self.counts["rounds_adopted"] += 1
        if self.state == "starting":
            self.state = "ready"
            self.to_control(Ready(info={"device": str(self.device), "threads": self.threads,
                                        "parameters": self.size}))
            self.pause(self.samples, False)
        if self.deferred_round is not None and self.deferred_round > self.version:
            round_, self.deferred_round = self.deferred_round, None
            self.contribute(round_)
        self.advance()

    def on_welcome(self) -> None:
        self.request_weights()

    def request_weights(self) -> None:
        self.asked_weights_at = time.monotonic()
        self.replies_due.append("request")
        self.send(self.aggregator, WeightsRequest())

    def on_reply(self, _identity: bytes | None, env) -> None:
        match env.msg:
            case Weights() as w if self.replies_due:
                if self.replies_due.popleft() == "step":
                    self.finish_step(w)
                else:
                    self.adopt(w)
            case _:
                self.unexpected(env, "aggregator link")

    def on_broadcast(self, _identity: bytes | None, env) -> None:
        match env.msg:
            case Weights() as w:
                self.adopt(w)
            case _:
                self.unexpected(env, "weights subscription")

    def handle_command(self, env) -> None:
        match env.msg:
            case Aggregate(round=r, participants=who) if self.node_id in who:
                if r <= self.version or r == self.sent_round:
                    return  # a repeat of a round already done or contributed
                if self.sent is not None:
                    self.deferred_round = r  # one round in flight at a time
                else:
                    self.contribute(r)
            case _:
                pass

    def contribute(self, round_: int) -> None:
        flat = self.get_flat()
        delta = np.zeros(0, dtype=np.float32) if self.step_mode else flat - self.base
        self.send(self.aggregator, Contribution(round=round_, coefficient=self.coef_since,
                                                samples=self.samples_since, delta=delta))
        self.sent, self.sent_round = flat, round_
        self.steps_since, self.coef_since, self.samples_since = 0, 0.0, 0
        self.counts["contributions"] += 1

    # -- batches -------------------------------------------------------------------------------
    def on_sample(self, _identity: bytes | None, env) -> None:
        match env.msg:
            case SampleBatch() as s:
                if s.dense.shape[1] != self.n_dense:
                    raise ProtocolError("bad_shape", f"batch with {s.dense.shape[1]} dense "
                                                     f"features, model has {self.n_dense}")
                if s.batch_id in self.by_id:
                    raise ProtocolError("duplicate_batch", f"batch {s.batch_id} is already "
                                                           "in this worker's pipeline")
                batch = PulledBatch(s, [None] * len(self.shards))
                self.pipeline.append(batch)
                self.by_id[s.batch_id] = batch
                for sock in self.shards:
                    self.send(sock, Lookup(batch_id=s.batch_id, train=not s.eval))
                if len(self.pipeline) > self.job.train.prefetch:
                    self.pause(self.samples, True)
            case _:
                self.unexpected(env, "sample queue")

    def on_shard(self, shard: int, _identity: bytes | None, env) -> None:
        match env.msg:
            case Embeddings() as e:
                batch = self.by_id.get(e.batch_id)
                if batch is None:
                    raise ProtocolError("unknown_batch", f"embeddings for batch {e.batch_id} "
                                                         f"from {env.sender!r}")
                grid = len(batch.sample.labels) * self.fields
                if e.rows.shape[1:] != (self.dim,) or (e.positions.size and
                                                       e.positions.max() >= grid):
                    raise ProtocolError("bad_shape", f"embeddings of batch {e.batch_id} do "
                                                     "not fit the batch")
                batch.replies[shard] = e
                if batch.complete():
                    self.counts["lookup_wait_s"] += time.monotonic() - batch.asked_at
                self.advance()
            case _:
                self.unexpected(env, "shard link")

    def advance(self) -> None:
        """Train (or score) the batches at the head of the pipeline whose embeddings are in."""
        while self.pipeline and self.pipeline[0].complete() and self.awaiting_step is None:
            head = self.pipeline[0]
            if head.sample.eval and self.version < head.sample.min_round:
                if time.monotonic() - self.asked_weights_at > 2 * self.heartbeat_s:
                    self.request_weights()  # the broadcast may have been missed
                return
            self.pipeline.popleft()
            del self.by_id[head.sample.batch_id]
            if head.sample.eval:
                self.score(head)
            else:
                self.train(head)
        if len(self.pipeline) <= self.job.train.prefetch and self.state != "starting":
            self.pause(self.samples, False)

    def assemble(self, batch: PulledBatch) -> torch.Tensor:
        n = len(batch.sample.labels)
        flat = np.zeros((n * self.fields, self.dim), dtype=np.float32)
        for e in batch.replies:
            flat[e.positions] = e.rows[e.inverse]
        return torch.from_numpy(flat).to(self.device).view(n, self.fields, self.dim)

    def tensors(self, s: SampleBatch) -> tuple[torch.Tensor, ...]:
        return tuple(torch.from_numpy(np.array(a)).to(self.device)
                     for a in (s.dense, s.labels, s.weights))

    def train(self, batch: PulledBatch) -> None:
        started = time.monotonic()
        s = batch.sample
        emb = self.assemble(batch).requires_grad_(True)
        dense, labels, weights = self.tensors(s)
        weight_sum = float(weights.sum())
        loss_sum = weighted_loss_sum(self.model(emb, dense), labels, weights)
        self.model.zero_grad(set_to_none=True)
        (loss_sum / max(weight_sum, 1e-12)).backward()
        grad = emb.grad.reshape(-1, self.dim)
        for sock, e in zip(self.shards, batch.replies, strict=True):
            rows = torch.zeros((e.rows.shape[0], self.dim), device=self.device)
            positions = torch.from_numpy(e.positions.astype(np.int64)).to(self.device)
            inverse = torch.from_numpy(e.inverse.astype(np.int64)).to(self.device)
            rows.index_add_(0, inverse, grad[positions])
            self.send(sock, EmbeddingGrads(batch_id=s.batch_id, grads=rows.cpu().numpy()))
        loss = float(loss_sum.detach())
        self.counts["compute_s"] += time.monotonic() - started
        if self.step_mode:
            grads = torch.cat([p.grad.reshape(-1) for p in self.params]).cpu().numpy()
            self.replies_due.append("step")
            self.send(self.aggregator, StepGrad(coefficient=weight_sum, grads=grads))
            self.awaiting_step = (batch, loss, weight_sum)
            self.step_sent_at = time.monotonic()
            return
        self.optimizer.step()
        self.finish_batch(batch, loss, weight_sum)

    def finish_step(self, w: Weights) -> None:
        batch, loss, weight_sum = self.awaiting_step
        self.awaiting_step = None
        self.counts["step_wait_s"] += time.monotonic() - self.step_sent_at
        if w.params.shape != (self.size,):
            raise ProtocolError("bad_shape", "step weights do not fit the model")
        self.set_flat(w.params)
        self.base = np.array(w.params, dtype=np.float32)
        self.finish_batch(batch, loss, weight_sum)
        self.advance()

    def finish_batch(self, batch: PulledBatch, loss: float, weight_sum: float) -> None:
        n = len(batch.sample.labels)
        self.send(self.acks, Ack(batch_id=batch.sample.batch_id, samples=n, loss_sum=loss,
                                 weight_sum=weight_sum, preds=np.zeros(0, dtype=np.float32)))
        self.counts["samples_trained"] += n
        self.counts["batches_trained"] += 1
        self.steps_since += 1
        self.coef_since += weight_sum
        self.samples_since += n
        self.state = "training"
        next_round = (self.sent_round if self.sent is not None else self.version) + 1
        if (not self.step_mode and self.steps_since >= self.job.train.sync_every
                and self.ready_sent_for < next_round):
            self.ready_sent_for = next_round
            self.to_control(RoundReady(round=next_round, steps=self.steps_since))

    def score(self, batch: PulledBatch) -> None:
        s = batch.sample
        with torch.no_grad():
            dense, _, _ = self.tensors(s)
            probs = torch.sigmoid(self.model(self.assemble(batch), dense)).cpu().numpy()
        self.send(self.acks, Ack(batch_id=s.batch_id, samples=len(s.labels), loss_sum=0.0,
                                 weight_sum=0.0, preds=probs.astype(np.float32)))
        self.counts["eval_samples"] += len(s.labels)
        self.state = "evaluating"

    def counters(self) -> dict:
        return {**self.counts, "round": self.version, "pipeline": len(self.pipeline),
                "device": str(self.device)}


def main() -> None:
    role_main(Worker)


if __name__ == "__main__":
    main()
