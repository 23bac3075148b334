"""A worker: one replica of the dense network.

Per batch it pulls dense features, labels and weights from the sample queue (never sparse
keys; one PULL socket connected to every feeder's queue), gets its embeddings from every shard
by batch id, asks the batch's feeder to take it (each batch is granted to one worker), runs
forward and backward, sends each shard the gradients of its rows, updates the dense weights
and acknowledges the batch to the feeder of its slice (control's SliceMap). Up to ``prefetch``
batches are pulled ahead while the current one trains, but only the next one to run is taken:
the rest stay untaken, so at the end of a pass the feeder can hand copies of them to an idle
worker instead of waiting for a slow one.

Embeddings (``[train] embeddings``): ``push`` announces each batch to the shards (Lookup) as it
is pulled, and they send its rows as soon as they have its keys; ``pull`` asks when the batch
is the next to train and waits. Each batch's wait for its embeddings (from when it was the next
to train, lacking only them) is sampled for the summary.

Dense synchronisation (``[train] sync``), see ``roles.algorithms.replica`` for the round arithmetic:

- ``step``: the dense gradient of every step goes to the aggregator, which applies it with its
  Adam and answers with the new weights; the worker waits for them (no local optimiser).
- ``every``: local Adam; after ``sync_every`` local steps the worker tells control it is
  ready; on Aggregate(r) it contributes its delta and keeps training.
- ``round``: local Adam; the feeder releases ``round_iterations`` batches per worker per
  round, control calls Aggregate(r) when they are all acknowledged, and a worker trains a batch
  of round r + 1 only after it has contributed to round r, so that M (its samples in the
  round) is exact.
- ``lazy``: local Adam; a local round is ``sync_every`` local steps, and the worker reports
  each one to control (RoundReady), which decides when to aggregate
  (``roles.algorithms.decision``). A worker that has done ``max_local_rounds`` local rounds since
  its last contribution waits.

Weights of a newer restore generation (the aggregator restarted and restored a backup)
replace the replica's weights outright. With ``[cluster] aggregators`` > 1 a worker sends its
contributions to aggregator ``index % aggregators``, everything else to the root.

SIGTERM: the worker stops pulling, finishes the batches it was granted, sends its last dense
progress as a contribution marked ``done``, tells control it is leaving and exits 0 (a second
SIGTERM, or ``LEAVE_TIMEOUT_S``, ends it at once: whatever it still holds, the feeder sends
again). ``--slowdown N`` (a test and demo aid) makes every batch
take N times as long, idling rather than burning CPU, like a slower machine.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import zmq

from roles.algorithms import live
from roles.algorithms.batching import max_in_flight, sample_batch_bytes
from roles.algorithms.replica import Replica
from roles.job.cli import MAX_WORKERS, role_main
from roles.job.settings import Job
from roles.model.network import (
    auto_threads,
    build_model,
    pick_device,
    set_threads,
    weighted_loss_sum,
)
from roles.model.parallel import GroupError, GroupLeader, GroupReplica, member_program
from roles.protocol.datapath import (
    Ack,
    EmbeddingGrads,
    Embeddings,
    Grant,
    Holding,
    Idle,
    Lookup,
    SampleBatch,
    SliceMap,
    Taken,
    split_batch_id,
)
from roles.protocol.dense_sync import (
    Aggregate,
    Contribution,
    Restore,
    RoundReady,
    StepGrad,
    Weights,
    WeightsRequest,
)
from roles.protocol.lifecycle import FeederBack, ShardBack
from roles.protocol.model_parallel import ModelPlan, PartCall, PartReply, PartTensors
from roles.protocol.operator import Settings
from zbus.codec import Message, ProtocolError
from zbus.endpoints import node_index
from zbus.messages import Leaving, Ready
from zbus.node import Node

log = logging.getLogger(__name__)
LEAVE_TIMEOUT_S = 5.0
WAITS_KEPT = 512  # embedding waits kept (a uniform sample) for the summary's quantiles


@dataclass
class PulledBatch:
    sample: SampleBatch
    replies: list[Embeddings | None]
    positions: list[np.ndarray | None]  # grid positions of each shard's reply
    asked: bool = False       # Taken sent to the feeder
    granted: bool = False
    looked_up_at: float | None = None   # when its Lookups went to the shards
    needed_at: float | None = None      # when it was the next to train, but for embeddings

    def has_embeddings(self) -> bool:
        return all(r is not None for r in self.replies)

    def complete(self) -> bool:
        return self.granted and self.has_embeddings()


class Worker(Node):
    role = "worker"

    def __init__(self, job: Job, index: int, slowdown: float = 1.0):
        self.leaving = False  # before the signal handlers are installed
        super().__init__(job.cluster, index, job.fingerprint())
        self.job = job
        c, t = job.cluster, job.train
        self.fields, self.dim = len(job.sparse_fields), job.model.embedding_dim
        self.n_dense = len(job.dense_fields)
        self.slowdown = max(1.0, slowdown)
        self.threads = set_threads(t.torch_threads or auto_threads(c, os.cpu_count() or 1))
        self.device = pick_device(t.device)
        self.step_mode = t.sync == "step"
        # model parallelism: this worker leads group ``index`` of ``parts`` members, and the
        # replica becomes a GroupReplica when control's ModelPlan arrives
        self.grouped = c.parts > 1
        self.leader: GroupLeader | None = None
        self.members_answered: set[int] = set()
        self.next_ping = 0.0
        self.replica = Replica(build_model(job).to(
            torch.device("cpu") if self.grouped else self.device), self.device,
            None if self.step_mode else t.dense_lr)
        if self.grouped:
            self.group_inbox = self.bind(zmq.ROUTER, c.endpoint(c.group_endpoint_name(
                index, 0)), self.on_group)
            self.group_peers = {m: self.connect(zmq.DEALER, c.endpoint(
                c.group_endpoint_name(index, m))) for m in range(1, c.parts)}
        # one PULL fair-queues the sample queues of every feeder; acks go to a batch's feeder
        self.samples = self.connect(zmq.PULL, c.endpoint(c.feeder_endpoint_name("samples", 0)),
                                    self.on_sample, rcvhwm=1,
                                    kernel_buffer=sample_batch_bytes(t.batch_size,
                                                                     self.n_dense))
        for f in range(1, c.feeders):
            self.samples.connect(c.endpoint(c.feeder_endpoint_name("samples", f)))
        self.pause(self.samples, True)  # until the first weights are here
        self.feeders = [self.connect(zmq.DEALER, c.endpoint(c.feeder_endpoint_name("ledger", f)),
                                     self.on_feeder) for f in range(c.feeders)]
        self.slice_owners: list[int] = list(range(c.feeders))  # control's SliceMap
        # the latest acks to each feeder, and the batches trained whose ack is not sent yet:
        # what a restarted feeder is told again (FeederBack)
        self.acks_kept = [deque(maxlen=max_in_flight(MAX_WORKERS, t.prefetch))
                          for _ in range(c.feeders)]
        self.unacked: set[int] = set()
        self.feeders_back: dict[int, int] = {}  # feeder -> the restart generation acted on
        self.shards_back: dict[int, int] = {}  # shard -> the restart generation acted on
        self.push = t.embeddings == "push"
        self.waits: list[float] = []  # seconds each batch waited for its embeddings (sample)
        self.waits_seen = 0
        self.rng = np.random.default_rng(index)
        self.shards = [self.connect(zmq.DEALER, c.endpoint(f"ps-{i}"),
                                    functools.partial(self.on_shard, i))
                       for i in range(c.shards)]
        self.aggregator = self.connect(zmq.DEALER, c.endpoint("aggregator"), self.on_reply)
        group = c.group_of(index)
        self.group_aggregator = self.aggregator if group == 0 else \
            self.connect(zmq.DEALER, c.aggregator_endpoint(group))
        self.weights_pub = self.connect(zmq.SUB, c.endpoint("aggregator_pub"),
                                        self.on_broadcast)
        self.pipeline: dict[int, PulledBatch] = {}   # in pull order
        self.deferred_round: int | None = None
        self.awaiting_step: tuple[PulledBatch, float, float] | None = None
        self.parked: tuple[list[tuple[zmq.Socket, Message]], Callable[[], None]] | None = None
        self.step_sent_at = 0.0
        self.replies_due: deque[str] = deque()  # "request" or "step": the aggregator answers
        self.asked_weights_at = 0.0             # a DEALER's requests in order
        self.ready_sent_for = -1
        self.idle_since: float | None = None  # said Idle, and nothing has come since
        self.generation = 0
        self.restore_wanted = 0
        self.contributed_at = 0.0
        self.lazy = t.sync == "lazy"
        self.settings = live.LiveValues(job.aggregation)
        self.idle_said = False
        self.leave_by = 0.0
        self.counts = {"samples_trained": 0, "batches_trained": 0, "eval_samples": 0,
                       "contributions": 0, "rounds_adopted": 0, "refused_batches": 0,
                       "copies_ignored": 0, "restores": 0, "waits_at_max": 0,
                       "lookup_wait_s": 0.0, "compute_s": 0.0, "step_wait_s": 0.0,
                       "late_group_messages": 0,
                       "slowdown": self.slowdown}

    # -- weights -----------------------------------------------------------------------------
    def adopt(self, w: Weights) -> None:
        if w.params.shape != (self.replica.size,):
            raise ProtocolError("bad_shape", f"weights of {w.params.shape}, model has "
                                             f"{self.replica.size} parameters")
        if w.generation < self.generation:
            return  # from before a restore
        if w.generation > self.generation:
            log.warning("%s: weights restored from a backup (generation %d, round %d) "
                        "replace its own", self.node_id, w.generation, w.round)
            self.generation = w.generation
            self.replica.reset(w.round, w.params)
            self.counts["restores"] += 1
            if self.deferred_round is not None and self.deferred_round <= w.round:
                self.deferred_round = None
        elif not self.replica.adopt(w.round, w.params):
            return
        self.counts["rounds_adopted"] += 1
        if self.state == "starting":
            self.state = "ready"
            self.to_control(Ready(info={"device": str(self.device), "threads": self.threads,
                                        "parameters": self.replica.size,
                                        "slowdown": self.slowdown}))
            self.gate_pulling()
        if self.deferred_round is not None and self.deferred_round > self.replica.version:
            round_, self.deferred_round = self.deferred_round, None
            self.contribute(round_)
        self.advance()

    def on_welcome(self) -> None:
        if not self.grouped:
            self.request_weights()  # a group leader asks once its members answered

    # -- model parallelism (roles.model.parallel) --------------------------------------------
    def take_plan(self, plan: ModelPlan) -> None:
        gm, program = member_program(self.job, plan, 0, self.device)
        self.leader = GroupLeader(program, self.group_inbox, self.group_peers, self.send,
                                  self.traffic, self.reject, self.cluster.node_timeout_s / 2)
        self.replica = GroupReplica(gm, program, self.leader, self.device,
                                    self.job.train.dense_lr)
        log.info("%s leads group %d: %d members, nodes here: %s", self.node_id, self.index,
                 plan.parts, ", ".join(n.name for st in program.mine for n in st.nodes))
        self.ping_members(time.monotonic())

    def ping_members(self, now: float) -> None:
        """Until every member has the plan: ask them, once a heartbeat."""
        if self.leader is None or now < self.next_ping:
            return
        self.next_ping = now + self.heartbeat_s
        for member, sock in self.group_peers.items():
            if member not in self.members_answered:
                self.send(sock, PartCall(call="ping", seq=0,
                                         values=np.zeros(0, dtype=np.float32)))

    def on_group(self, _identity: bytes | None, env) -> None:
        """Group messages outside a step: members answering the ping; anything else is late
        (of a step given up on) and dropped."""
        match env.msg:
            case PartReply(call="ping") if node_index(env.sender) >= 0:
                _, member = self.cluster.part_position(node_index(env.sender))
                if member not in self.members_answered:
                    self.members_answered.add(member)
                    if len(self.members_answered) == len(self.group_peers):
                        log.info("%s: every member of its group is there", self.node_id)
                        self.request_weights()
            case PartReply() | PartTensors():
                self.counts["late_group_messages"] += 1
            case _:
                self.unexpected(env, "group link")

    def group_failed(self, exc: GroupError) -> None:
        """A member is gone: this group cannot train. Leave; the feeder sends the batches it
        holds to the other groups. (A leader waits half of node_timeout_s for its members,
        so that control does not take its own silence meanwhile for a failure.)"""
        log.error("%s: %s; the group leaves the job", self.node_id, exc)
        self.to_control(Leaving(reason=f"model-parallel group {self.index}: {exc}"))
        self.exit_code = 1
        self.stopping = True

    def on_crash(self, exc: Exception) -> None:
        if isinstance(exc, GroupError):  # a member gone while the weights were gathered
            self.group_failed(exc)       # or spread
        else:
            super().on_crash(exc)

    def dense_forward_backward(self, emb: torch.Tensor, dense: torch.Tensor,
                               labels: torch.Tensor, weights: torch.Tensor,
                               weight_sum: float) -> torch.Tensor:
        """Loss sum of the batch; the gradients land in emb.grad and the dense parameters."""
        if self.leader is None:
            model = self.replica.model
            loss_sum = weighted_loss_sum(model(emb, dense), labels, weights)
            model.zero_grad(set_to_none=True)
            (loss_sum / max(weight_sum, 1e-12)).backward()
            return loss_sum
        logits = self.leader.forward({"embeddings": emb, "dense": dense}, train=True)
        leaf = logits.detach().requires_grad_(True)
        loss_sum = weighted_loss_sum(leaf, labels, weights)
        (loss_sum / max(weight_sum, 1e-12)).backward()
        self.leader.backward(leaf.grad)
        return loss_sum

    def dense_scores(self, emb: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            if self.leader is None:
                return torch.sigmoid(self.replica.model(emb, dense))
            return torch.sigmoid(self.leader.forward({"embeddings": emb, "dense": dense},
                                                     train=False))

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
            case ModelPlan() as plan if self.grouped and self.leader is None:
                self.take_plan(plan)
            case ShardBack(shard=i, generation=g) if g > self.shards_back.get(i, 0) \
                    and 0 <= i < len(self.shards):
                self.shards_back[i] = g
                for b in self.pipeline.values():  # ask the restarted shard again
                    if b.looked_up_at is not None and b.replies[i] is None:
                        self.send(self.shards[i], Lookup(batch_id=b.sample.batch_id,
                                                         train=not b.sample.eval))
            case FeederBack(feeder=i, generation=g) if g > self.feeders_back.get(i, 0) \
                    and 0 <= i < len(self.feeders):
                self.feeders_back[i] = g
                self.feeder_restarted(i)
            case SliceMap(owners=owners) if list(owners) != self.slice_owners:
                self.slices_moved(list(owners))
            case Settings() as m if self.settings.take(m):
                self.advance()  # max_local_rounds may have risen
            case Restore(generation=g) if g > max(self.generation, self.restore_wanted):
                self.restore_wanted = g  # ask until the restored weights are here: their
                self.request_weights()   # broadcast may leave before this SUB reconnects
            case Aggregate(round=r, participants=who) if self.node_id in who:
                if r <= self.replica.settled_round:
                    return  # a repeat of a round already done or contributed
                if self.replica.in_flight:
                    self.deferred_round = r  # one round in flight at a time
                else:
                    self.contribute(r)
            case _:
                pass

    def contribute(self, round_: int, done: bool = False) -> None:
        delta, coefficient, samples = self.replica.contribute(round_, not self.step_mode)
        self.send(self.group_aggregator, Contribution(round=round_, coefficient=coefficient,
                                                      samples=samples, done=done, delta=delta))
        self.counts["contributions"] += 1
        self.contributed_at = time.monotonic()
        self.advance()  # batches of the next round may go now

    # -- batches -------------------------------------------------------------------------------
    def on_sample(self, _identity: bytes | None, env) -> None:
        match env.msg:
            case SampleBatch() as s:
                if s.dense.shape[1] != self.n_dense:
                    raise ProtocolError("bad_shape", f"batch with {s.dense.shape[1]} dense "
                                                     f"features, model has {self.n_dense}")
                if s.batch_id in self.pipeline:  # a second copy of a straggler: have it
                    self.counts["copies_ignored"] += 1
                    return
                batch = self.pipeline[s.batch_id] = PulledBatch(s, [None] * len(self.shards),
                                                              [None] * len(self.shards))
                self.idle_said = False
                self.idle_since = None
                if self.push:  # announce it: the shards send its rows as soon as they can
                    self.look_up(batch)
                self.ask_next()
                self.gate_pulling()
            case _:
                self.unexpected(env, "sample queue")

    def on_feeder(self, _identity: bytes | None, env) -> None:
        match env.msg:
            case Grant(batch_id=b, granted=granted) if b in self.pipeline:
                if granted:
                    self.pipeline[b].granted = True
                else:  # another worker holds this batch (a copy sent again)
                    del self.pipeline[b]
                    self.counts["refused_batches"] += 1
                    self.ask_next()
                self.advance()
            case _:
                self.unexpected(env, "feeder link")

    def on_shard(self, shard: int, _identity: bytes | None, env) -> None:
        match env.msg:
            case Embeddings() as e:
                batch = self.pipeline.get(e.batch_id)
                if batch is None:
                    return  # the batch was refused to this worker meanwhile
                grid = len(batch.sample.labels) * self.fields
                if e.rows.shape[1:] != (self.dim,) or e.grid != grid:
                    raise ProtocolError("bad_shape", f"embeddings of batch {e.batch_id} do "
                                                     "not fit the batch")
                batch.positions[shard] = e.positions()
                batch.replies[shard] = e
                if batch.has_embeddings():
                    now = time.monotonic()
                    self.counts["lookup_wait_s"] += now - batch.looked_up_at
                    self.waited(now - batch.needed_at if batch.needed_at else 0.0)
                self.advance()
            case _:
                self.unexpected(env, "shard link")

    def gate_pulling(self) -> None:
        """Pull while the pipeline has room for another batch, and not while leaving."""
        self.pause(self.samples, self.leaving or len(self.pipeline) > self.job.train.prefetch)

    def look_up(self, batch: PulledBatch) -> None:
        batch.looked_up_at = time.monotonic()
        for sock in self.shards:
            self.send(sock, Lookup(batch_id=batch.sample.batch_id, train=not batch.sample.eval))

    def waited(self, seconds: float) -> None:
        """Keep a uniform sample of the batches' embedding waits (reservoir sampling)."""
        self.waits_seen += 1
        if len(self.waits) < WAITS_KEPT:
            self.waits.append(seconds)
        else:
            slot = int(self.rng.integers(self.waits_seen))
            if slot < WAITS_KEPT:
                self.waits[slot] = seconds

    def want_embeddings(self, now: float) -> None:
        """Nothing can train: if the next batch lacks only its embeddings, it waits for them
        from now (and, in mode pull, asks for them now)."""
        batch = next(iter(self.pipeline.values()), None)
        if batch is None or batch.has_embeddings() or not batch.granted \
                or not self.due(batch.sample):
            return
        if batch.needed_at is None:
            batch.needed_at = now
        if batch.looked_up_at is None:
            self.look_up(batch)

    def slices_moved(self, owners: list[int]) -> None:
        """A lost feeder's slices have a new feeder: a Taken that went to the lost one is
        asked of the new one (which refuses it: it feeds the batch again itself)."""
        before, self.slice_owners = self.slice_owners, owners
        for b in self.pipeline.values():
            slice_ = split_batch_id(b.sample.batch_id)[1]
            moved = slice_ < len(owners) and before[slice_] != owners[slice_]  # same slices
            if moved and b.asked and not b.granted:
                self.send(self.feeder_of(b.sample.batch_id), Taken(batch_id=b.sample.batch_id))

    def feeder_of(self, batch_id: int) -> zmq.Socket:
        """The ledger of the feeder that owns the batch's slice."""
        return self.feeders[self.feeder_index(batch_id)]

    def feeder_index(self, batch_id: int) -> int:
        slice_ = split_batch_id(batch_id)[1]
        owner = self.slice_owners[slice_] if slice_ < len(self.slice_owners) else slice_
        if not 0 <= owner < len(self.feeders):
            raise ProtocolError("bad_field", f"batch {batch_id} of slice {slice_}: no feeder")
        return owner

    def send_ack(self, ack: Ack) -> None:
        feeder = self.feeder_index(ack.batch_id)
        self.send(self.feeders[feeder], ack)
        self.acks_kept[feeder].append(ack)
        self.unacked.discard(ack.batch_id)

    def feeder_restarted(self, feeder: int) -> None:
        """Tell a restarted feeder what its dead process may have lost: the latest acks, then
        the batches it granted here that are not acknowledged yet (Holding); then ask again
        for the grants it never answered."""
        sock = self.feeders[feeder]
        for ack in self.acks_kept[feeder]:
            self.send(sock, ack)
        mine = [b for b in self.pipeline if self.feeder_index(b) == feeder]
        held = [b for b in mine if self.pipeline[b].granted]
        held += [b for b in self.unacked if self.feeder_index(b) == feeder]
        self.send(sock, Holding(held=np.array(held, dtype=np.int64)))
        for b in mine:
            if self.pipeline[b].asked and not self.pipeline[b].granted:
                self.send(sock, Taken(batch_id=b))
        log.warning("feeder-%d restarted: sent it %d acks again and %d batches held",
                    feeder, len(self.acks_kept[feeder]), len(held))

    def ask_next(self) -> None:
        """Keep one batch taken ahead of the one training: the first not yet asked for."""
        if any(b.asked for b in self.pipeline.values()):
            return
        batch = next(iter(self.pipeline.values()), None)
        if batch is not None:
            batch.asked = True
            self.send(self.feeder_of(batch.sample.batch_id),
                      Taken(batch_id=batch.sample.batch_id))

    def ready_to_run(self, batch: PulledBatch) -> bool:
        return batch.complete() and self.due(batch.sample)

    def due(self, s: SampleBatch) -> bool:
        """The batch's turn has come (its weights or its round), embeddings aside."""
        if s.eval:
            return self.replica.version >= s.min_round
        if self.lazy and self.at_max_local_rounds():
            return False  # wait for an aggregation
        return s.round <= self.replica.settled_round + 1  # round mode: round r-1 contributed

    def at_max_local_rounds(self) -> bool:
        limit = self.settings["max_local_rounds"] * self.job.train.sync_every
        return self.replica.steps_since >= limit

    def advance(self) -> None:
        """Train (or score) every batch that can go: granted, embeddings in, its round due."""
        while self.awaiting_step is None and self.parked is None:
            batch = next((b for b in self.pipeline.values() if self.ready_to_run(b)), None)
            if batch is None:
                break
            del self.pipeline[batch.sample.batch_id]
            self.unacked.add(batch.sample.batch_id)
            self.ask_next()  # its grant comes back while this one trains
            if batch.sample.eval:
                self.score(batch)
            else:
                self.train(batch)
        now = time.monotonic()
        if self.awaiting_step is None and self.parked is None:
            self.want_embeddings(now)
        self.ask_for_missed_weights(now)
        if self.state != "starting":
            self.gate_pulling()
            if not (self.pipeline or self.idle_said or self.leaving or self.parked
                    or self.awaiting_step):
                self.idle_said = True  # said once until the next batch arrives
                for sock in self.feeders:
                    self.send(sock, Idle())
                self.idle_since = time.monotonic()

    def report_progress(self, idle: bool = False) -> None:
        self.to_control(RoundReady(round=self.replica.settled_round + 1,
                                   steps=self.replica.steps_since, idle=idle))

    def ask_for_missed_weights(self, now: float) -> None:
        """A broadcast of weights can be missed (a SUB reconnecting to a restarted aggregator):
        ask for the current weights, at most once per two heartbeats, while something waits for
        weights that must exist by now: restored ones, those of the round in flight when the
        next round was called (rounds complete in order), or those an eval batch needs."""
        if now - self.asked_weights_at <= 2 * self.heartbeat_s or self.state == "starting":
            return
        waiting = (self.restore_wanted > self.generation
                   or (self.deferred_round is not None and self.replica.in_flight
                       and now - self.contributed_at > 2 * self.heartbeat_s)
                   or any(b.complete() and b.sample.eval for b in self.pipeline.values()))
        if waiting:
            self.request_weights()

    def assemble(self, batch: PulledBatch) -> torch.Tensor:
        n = len(batch.sample.labels)
        flat = np.zeros((n * self.fields, self.dim), dtype=np.float32)
        for e, positions in zip(batch.replies, batch.positions, strict=True):
            flat[positions] = e.rows[e.inverse]
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
        try:
            loss_sum = self.dense_forward_backward(emb, dense, labels, weights, weight_sum)
        except GroupError as exc:
            self.group_failed(exc)
            return
        grad = emb.grad.reshape(-1, self.dim)
        outbox: list[tuple[zmq.Socket, Message]] = []
        for sock, e, where in zip(self.shards, batch.replies, batch.positions, strict=True):
            rows = torch.zeros((e.rows.shape[0], self.dim), device=self.device)
            positions = torch.from_numpy(where).to(self.device)
            inverse = torch.from_numpy(e.inverse.astype(np.int64)).to(self.device)
            rows.index_add_(0, inverse, grad[positions])
            outbox.append((sock, EmbeddingGrads(batch_id=s.batch_id, grads=rows.cpu().numpy())))
        loss = float(loss_sum.detach())
        if self.step_mode:
            outbox.append((self.aggregator, StepGrad(coefficient=weight_sum,
                                                     grads=self.replica.dense_grads())))
            then = functools.partial(self.await_step, batch, loss, weight_sum)
        else:
            if self.replica.optimizer is not None:  # a group leader may own no weights
                self.replica.optimizer.step()
            then = functools.partial(self.finish_batch, batch, loss, weight_sum)
        self.release(outbox, then, time.monotonic() - started)

    def release(self, outbox: list[tuple[zmq.Socket, Message]], then: Callable[[], None],
                took: float) -> None:
        """Send a finished batch's messages, now or, slowed down, after (slowdown - 1) x took."""
        self.counts["compute_s"] += took
        if self.slowdown > 1:
            self.parked = (outbox, then)
            self.wake_at = time.monotonic() + (self.slowdown - 1) * took
            return
        self.deliver(outbox, then)

    def deliver(self, outbox: list[tuple[zmq.Socket, Message]], then: Callable[[], None]) -> None:
        for sock, msg in outbox:
            self.send(sock, msg)
        then()

    def await_step(self, batch: PulledBatch, loss: float, weight_sum: float) -> None:
        self.replies_due.append("step")
        self.awaiting_step = (batch, loss, weight_sum)
        self.step_sent_at = time.monotonic()

    def finish_step(self, w: Weights) -> None:
        if self.awaiting_step is None or w.params.shape != (self.replica.size,):
            raise ProtocolError("bad_shape", "step weights that do not fit")
        batch, loss, weight_sum = self.awaiting_step
        self.awaiting_step = None
        self.counts["step_wait_s"] += time.monotonic() - self.step_sent_at
        self.replica.replace(w.params)
        self.finish_batch(batch, loss, weight_sum)
        self.advance()

    def finish_batch(self, batch: PulledBatch, loss: float, weight_sum: float) -> None:
        n = len(batch.sample.labels)
        self.send_ack(Ack(batch_id=batch.sample.batch_id, samples=n, loss_sum=loss,
                          weight_sum=weight_sum, preds=np.zeros(0, dtype=np.float32)))
        self.counts["samples_trained"] += n
        self.counts["batches_trained"] += 1
        self.replica.trained(n, weight_sum)
        self.state = "training"
        next_round = self.replica.settled_round + 1
        every = self.job.train.sync_every
        if (self.job.train.sync == "every" and self.replica.steps_since >= every
                and self.ready_sent_for < next_round):
            self.ready_sent_for = next_round
            self.report_progress()
        elif self.lazy and self.replica.steps_since % every == 0:
            self.report_progress()  # one more local round
            self.counts["waits_at_max"] += self.at_max_local_rounds()

    def score(self, batch: PulledBatch) -> None:
        started = time.monotonic()
        s = batch.sample
        dense, _, _ = self.tensors(s)
        try:
            probs = self.dense_scores(self.assemble(batch), dense).cpu().numpy()
        except GroupError as exc:
            self.group_failed(exc)
            return
        self.counts["eval_samples"] += len(s.labels)
        self.state = "evaluating"
        ack = Ack(batch_id=s.batch_id, samples=len(s.labels), loss_sum=0.0, weight_sum=0.0,
                  preds=probs.astype(np.float32))
        self.release([], functools.partial(self.send_ack, ack), time.monotonic() - started)

    # -- the clock and leaving -----------------------------------------------------------------
    def on_tick(self, now: float) -> None:
        if self.parked is not None and now >= (self.wake_at or 0.0):
            (outbox, then), self.parked, self.wake_at = self.parked, None, None
            self.deliver(outbox, then)
            self.advance()
        if self.grouped and len(self.members_answered) < len(self.group_peers):
            self.ping_members(now)
        if self.leaving:
            self.leave_when_done(now)
        self.ask_for_missed_weights(now)
        if self.lazy and self.idle_since is not None and now - self.idle_since >= \
                self.heartbeat_s:
            self.idle_since = None  # starved for a while (the end of a pass): do not hold
            self.report_progress(idle=True)  # the aggregation back
        super().on_tick(now)

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.leaving or not self.welcomed or self.state == "starting":
            super()._on_signal(signum, frame)  # nothing to hand back, or asked twice
            return
        log.info("%s: asked to stop; finishing its batches, then leaving", self.node_id)
        self.leaving = True
        self.leave_by = time.monotonic() + LEAVE_TIMEOUT_S

    def leave_when_done(self, now: float) -> None:
        self.pause(self.samples, True)
        busy = self.awaiting_step is not None or self.parked is not None or any(
            b.granted for b in self.pipeline.values()) or self.replica.in_flight
        if busy and now < self.leave_by:
            return
        if not busy and not self.step_mode and self.replica.samples_since:
            # the dense progress since the last contribution counts in the next round
            self.contribute(self.replica.settled_round + 1, done=True)
        self.to_control(Leaving(reason="stopped" if not busy else
                                f"stopped with {len(self.pipeline)} batch(es) unfinished"))
        self.stopping = True

    def close(self) -> None:
        self.group_aggregator.setsockopt(zmq.LINGER, 1000)  # a last contribution on leaving
        super().close()

    def counters(self) -> dict:
        group = {} if self.leader is None else {"group_wait_s": round(self.leader.wait_s, 3),
                                                "group_steps": self.leader.step}
        waits = np.asarray(self.waits) * 1000
        return {**self.counts, **group, "round": self.replica.version,
                "embeddings": "push" if self.push else "pull",
                "embedding_waits": self.waits_seen,
                "embedding_wait_ms": [round(float(w), 3) for w in np.sort(waits)],
                "generation": self.generation,
                "round_samples": self.replica.samples_since,
                "pipeline": len(self.pipeline), "device": str(self.device)}


def main() -> None:
    role_main(Worker)


if __name__ == "__main__":
    main()
