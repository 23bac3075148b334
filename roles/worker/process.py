"""A worker: one replica of the dense network.

Per batch it pulls dense features, labels and weights from the sample queue (never sparse
keys; one PULL socket connected to every feeder's queue), gets its embeddings from every shard
by batch id, asks the batch's feeder to take it (each batch is granted to one worker), runs
forward and backward, sends each shard the gradients of its rows, updates the dense weights
and acknowledges the batch to the feeder of its part (control's PartMap). Up to ``prefetch``
batches are pulled ahead while the current one trains, but only the next ``grants_ahead`` to
run are taken (asked for while the one before them trains, so that the feeder's answer does not
wait on the round trip): the rest stay untaken, so at the end of a pass the feeder can hand
copies of them to an idle worker instead of waiting for a slow one. The worker moves messages
between its sockets and its parts: the pulled batches (``roles.algorithms.worker.pulled``), the
links to the feeders' ledgers (``roles.algorithms.worker.feeder_links``), a batch's arithmetic
(``roles.model.compute``), its place in the rounds (``roles.algorithms.worker.replica``) and its
sync mode (below).

Embeddings (``[train] embeddings``): in ``push`` the shards send a batch's rows unasked: the
feeder's grant of the batch to this worker (Taken -> Grant, while the batch before it trains)
tells every shard where to send them (Deliver), and they send as soon as they have its keys;
the worker asks (Lookup) only a shard restarted meanwhile, or one whose rows have not come
``PUSH_ASK_AFTER_S`` after the batch was the next to train (a Deliver lost with a feeder that
died). ``pull`` asks every shard when the batch is the next to train and waits. Each batch's
wait for its embeddings (from when it was the next to train, lacking only them) is sampled for
the summary, and the look-ups and replies counted (the summary's messages per batch).

Dense synchronisation (``[train] sync``): what differs by mode (``step``: every step's gradient
to the aggregator, whose answer is the new weights; ``every``, ``round``, ``lazy``: a local Adam
and rounds, each mode reporting its progress and gating its batches its own way) is
``roles.algorithms.sync.worker``. In every mode, on Aggregate(r) the worker contributes (its
delta but in step, the samples and sample weight behind it) and keeps training, one round in
flight at a time, and adopts the weights of r when they come. Weights of a newer restore
generation (the aggregator restarted and restored a backup) replace the replica's outright.
With ``[cluster] aggregators`` > 1 a worker sends its contributions to aggregator
``index % aggregators``, everything else to the root; with ``[cluster] parts`` > 1 it leads a
model-parallel group (``roles.worker.group_link``).

SIGTERM: the worker stops pulling, finishes the batches it was granted, sends its last dense
progress as a contribution marked ``done``, tells control it is leaving and exits 0 (a second
SIGTERM, or ``LEAVE_TIMEOUT_S``, ends it at once: whatever it still holds, the feeder sends
again). ``--slowdown N`` (a test and demo aid) makes every batch take N times as long, idling
rather than burning CPU, like a slower machine.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import deque
from collections.abc import Callable

import numpy as np
import torch
import zmq

from roles.algorithms.shared import live
from roles.algorithms.sync import worker as sync_modes
from roles.algorithms.worker.feeder_links import FeederLinks
from roles.algorithms.worker.pulled import Pipeline, PulledBatch, WaitClock, WaitSample
from roles.algorithms.worker.replica import RESTORED, STALE, Replica, WorkerRounds
from roles.algorithms.worker.window import TakeWindow
from roles.job.cli import MAX_WORKERS, role_main
from roles.job.settings import Job
from roles.model.compute import BatchCompute
from roles.model.network import bf16_is_native, build_network, pick_device, use_threads
from roles.model.networks import NetworkError, device_error
from roles.model.parallel import GroupError, GroupLeader
from roles.protocol.datapath import (
    Ack,
    AckTaking,
    EmbeddingGrads,
    Embeddings,
    GradsLookup,
    Grant,
    Grants,
    Holding,
    Idle,
    Lookup,
    PartMap,
    SampleBatch,
    Taken,
    Taking,
    max_in_flight,
    sample_batch_bytes,
)
from roles.protocol.dense_sync import Aggregate, Contribution, Restore, Weights, WeightsRequest
from roles.protocol.lifecycle import FeederBack, ShardBack
from roles.protocol.model_parallel import ModelPlan
from roles.protocol.operator import Settings
from roles.worker.group_link import GroupLead
from zbus.codec import Message, ProtocolError
from zbus.messages import Leaving, Ready
from zbus.node import Node

log = logging.getLogger(__name__)
LEAVE_TIMEOUT_S = 5.0
PUSH_ASK_AFTER_S = 2.0  # mode push: a shard's rows this late after the batch was next: ask
WAITS_KEPT = 512  # embedding waits kept (a uniform sample) for the summary's quantiles


class Worker(Node):
    role = "worker"
    fatal_errors = (NetworkError,)  # the network cannot run on this worker's device

    def __init__(self, job: Job, index: int, slowdown: float = 1.0):
        self.leaving = False  # before the signal handlers are installed
        super().__init__(job.cluster, index, job.fingerprint())
        self.job = job
        c, t = job.cluster, job.train
        self.layout = job.layout()
        self.n_dense = len(job.dense_fields)
        self.slowdown = max(1.0, slowdown)
        self.threads = use_threads(job)
        self.device = pick_device(t.device)
        self.settings = live.LiveValues(job.aggregation)
        self.sync = sync_modes.for_mode(t, self.settings)
        # model parallelism: this worker leads group ``index`` of ``parts`` members, and the
        # replica becomes a GroupReplica when control's ModelPlan arrives
        self.grouped = c.parts > 1
        self.replica = Replica(build_network(job).to(
            torch.device("cpu") if self.grouped else self.device), self.device,
            self.sync.local_lr)
        self.group: GroupLead | None = None
        if self.grouped:
            self.group = GroupLead(
                job, self.node_id, index, self.device, inbox=self.bind(zmq.ROUTER, c.endpoint(
                    c.group_endpoint_name(index, 0)), self.on_group),
                peers={m: self.connect(zmq.DEALER, c.endpoint(c.group_endpoint_name(index, m)))
                       for m in range(1, c.parts)},
                send=self.send, traffic=self.traffic, reject=self.reject,
                timeout_s=c.node_timeout_s / 2, ping_every_s=self.heartbeat_s,
                all_there=self.request_weights, unexpected=self.unexpected)
        # one PULL fair-queues the sample queues of every feeder; acks go to a batch's feeder
        self.samples = self.connect(zmq.PULL, c.endpoint(c.feeder_endpoint_name("samples", 0)),
                                    self.on_sample, rcvhwm=1,
                                    kernel_buffer=sample_batch_bytes(
                                        t.batch_size, self.n_dense,
                                        len(self.layout.list_fields)))
        self.sample_queues = [c.endpoint(c.feeder_endpoint_name("samples", f))
                              for f in range(c.feeders)]
        for endpoint in self.sample_queues[1:]:
            self.samples.connect(endpoint)
        self.sample_links = 1  # connections to each feeder's queue (widen_sample_queue)
        self.pause(self.samples, True)  # until the first weights are here
        self.feeders = [self.connect(zmq.DEALER, c.endpoint(c.feeder_endpoint_name("ledger", f)),
                                     self.on_feeder) for f in range(c.feeders)]
        self.links = FeederLinks(c.feeders, max_in_flight(MAX_WORKERS, t.prefetch))
        self.shards_back: dict[int, int] = {}  # shard -> the restart generation acted on
        self.push = t.embeddings == "push"
        self.waits = WaitSample(WAITS_KEPT, index)  # of the batches' embedding waits
        self.waiting = WaitClock()  # what the worker waits for, between batches
        self.compute = BatchCompute(self.layout, self.device, t.precision)
        if t.precision == "bf16" and not bf16_is_native(self.device):
            log.warning("%s: [train] precision = \"bf16\" but %s has no bfloat16 arithmetic: "
                        "autocast emulates it, slower than fp32", self.node_id, self.device)
        self.shards = [self.connect(zmq.DEALER, c.endpoint(f"ps-{i}"),
                                    functools.partial(self.on_shard, i))
                       for i in range(c.shards)]
        self.aggregator = self.connect(zmq.DEALER, c.endpoint("aggregator"), self.on_reply)
        group = c.group_of(index)
        self.group_aggregator = self.aggregator if group == 0 else \
            self.connect(zmq.DEALER, c.aggregator_endpoint(group))
        self.weights_pub = self.connect(zmq.SUB, c.endpoint("aggregator_pub"),
                                        self.on_broadcast)
        self.pipeline = Pipeline(c.shards, self.layout)
        self.grants_ahead = min(t.grants_ahead, t.prefetch + 1)  # no more than it can pull
        self.window = TakeWindow(t.prefetch + 1)  # from grants_ahead up, sized for the link
        self.run_started = 0.0  # when the batch running began (its time: TakeWindow)
        self.acks_due: deque[Ack] = deque()  # sent at the next turn's start (flush_acks)
        self.rounds = WorkerRounds(2 * self.heartbeat_s)
        self.awaiting_step: tuple[PulledBatch, float, float] | None = None
        self.parked: tuple[list[tuple[zmq.Socket, Message]], Callable[[], None]] | None = None
        self.step_sent_at = 0.0
        # "request" or "step": the aggregator answers a DEALER's requests in order
        self.replies_due: deque[str] = deque()
        self.idle_since: float | None = None  # said Idle, and nothing has come since
        self.idle_said = False
        self.leave_by = 0.0
        self.counts = {"samples_trained": 0, "batches_trained": 0, "eval_samples": 0,
                       "contributions": 0, "rounds_adopted": 0, "refused_batches": 0,
                       "copies_ignored": 0, "restores": 0, "lookups_overdue": 0,
                       "lookups_with_grads": 0,
                       "batches_scored": 0,
                       "lookup_wait_s": 0.0, "compute_s": 0.0, "step_wait_s": 0.0,
                       "late_group_messages": 0,
                       "slowdown": self.slowdown}

    # -- weights -----------------------------------------------------------------------------
    def take_weights(self, w: Weights) -> None:
        """Weights of a round (or, of a newer generation, restored ones): the replica adopts
        them; the first ones make the worker ready."""
        taken = self.rounds.weights(self.replica, w)
        if taken == STALE:
            return
        if taken == RESTORED:
            log.warning("%s: weights restored from a backup (generation %d, round %d) "
                        "replace its own", self.node_id, w.generation, w.round)
            self.counts["restores"] += 1
        self.counts["rounds_adopted"] += 1
        if self.state == "starting":
            if not self.grouped:   # (a group's members answer only in its forward)
                try:
                    self.compute.warm_up(self.replica.model, self.job.train.batch_size,
                                         self.n_dense)
                except Exception as exc:   # it ran on the CPU at build: not on this device
                    raise device_error(self.job, exc, self.device) from exc
            self.state = "ready"
            self.to_control(Ready(info={"device": str(self.device), "threads": self.threads,
                                        "parameters": self.replica.size,
                                        "slowdown": self.slowdown}))
            self.gate_pulling()
        round_ = self.rounds.deferred_due(self.replica)
        if round_ is not None:
            self.contribute(round_)
        self.advance()

    def on_welcome(self) -> None:
        if not self.grouped:
            self.request_weights()  # a group leader asks once its members answered

    # -- model parallelism (roles.worker.group_link) ------------------------------------------
    @property
    def leader(self) -> GroupLeader | None:
        return None if self.group is None else self.group.leader

    def on_group(self, _identity: bytes | None, env) -> None:
        assert self.group is not None  # its socket exists only in a group
        self.group.heard(env)

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

    def request_weights(self) -> None:
        self.rounds.asked_at = time.monotonic()
        self.replies_due.append("request")
        self.send(self.aggregator, WeightsRequest())

    def on_reply(self, _identity: bytes | None, env) -> None:
        match env.msg:
            case Weights() as w if self.replies_due:
                w.require_finite()  # refused before it changes anything (zbus.codec)
                if self.replies_due.popleft() == "step":
                    self.finish_step(w)
                else:
                    self.take_weights(w)
            case _:
                self.unexpected(env, "aggregator link")

    def on_broadcast(self, _identity: bytes | None, env) -> None:
        match env.msg:
            case Weights() as w:
                w.require_finite()
                self.take_weights(w)
            case _:
                self.unexpected(env, "weights subscription")

    def handle_command(self, env) -> None:
        match env.msg:
            case ModelPlan() as plan if self.group is not None and self.leader is None:
                self.replica = self.group.take_plan(plan, time.monotonic())
            case ShardBack(shard=i, generation=g) if g > self.shards_back.get(i, 0) \
                    and 0 <= i < len(self.shards):
                self.shards_back[i] = g
                if self.moved(self.shards[i]):   # made again elsewhere (a pod rescheduled)
                    self.shards[i] = self.renew(self.shards[i])
                for b in self.pipeline.lacking(i):  # ask the restarted shard again
                    self.send(self.shards[i], Lookup(batch_id=b.batch_id,
                                                     train=not b.sample.eval))
            case FeederBack(feeder=i, generation=g) if self.links.restart(i, g):
                self.feeder_restarted(i)
            case PartMap() as m if self.links.newer(m):
                for feeder, taken in self.links.moved(m, self.pipeline):
                    self.send(self.feeders[feeder], taken)
                if self.state != "starting":
                    self.gate_pulling()
            case Settings() as m if self.settings.take(m):
                self.advance()  # max_local_rounds may have risen
            case Restore(generation=g) if self.rounds.restore(g):
                self.request_weights()  # until the restored weights are here: their
                                        # broadcast may leave before this SUB reconnects
            case Aggregate(round=r, participants=who) if self.node_id in who \
                    and self.rounds.called(self.replica, r):
                self.contribute(r)
            case _:
                pass

    def contribute(self, round_: int, done: bool = False) -> None:
        delta, coefficient, samples = self.replica.contribute(round_, self.sync.deltas)
        self.send(self.group_aggregator, Contribution(round=round_, coefficient=coefficient,
                                                      samples=samples, done=done, delta=delta))
        self.counts["contributions"] += 1
        self.rounds.contributed_at = time.monotonic()
        self.advance()  # batches of the next round may go now

    # -- batches -------------------------------------------------------------------------------
    def on_sample(self, _identity: bytes | None, env) -> None:
        match env.msg:
            case SampleBatch() as s:
                s.require_finite()  # refused as the codec refused it before (zbus.codec)
                if s.dense.shape[1] != self.n_dense:
                    raise ProtocolError("bad_shape", f"batch with {s.dense.shape[1]} dense "
                                                     f"features, model has {self.n_dense}")
                wrong = self.compute.sparse.check_lengths(s.lengths)
                if wrong is not None:
                    raise ProtocolError("bad_shape", f"batch {s.batch_id}: {wrong}")
                batch = self.pipeline.pulled(s)
                if batch is None:  # a second copy of a straggler: have it
                    self.counts["copies_ignored"] += 1
                    return
                self.idle_said = False
                self.idle_since = None
                self.ask_next()
                self.gate_pulling()
                self.note_wait()
            case _:
                self.unexpected(env, "sample queue")

    def on_feeder(self, _identity: bytes | None, env) -> None:
        match env.msg:
            case Grant(batch_id=b, granted=granted):
                if self.answered(b, granted):
                    self.advance()
            case Grants() as m:
                if sum(self.answered(b, granted) for b, granted in m.answers()):
                    self.advance()
            case _:
                self.unexpected(env, "feeder link")

    def answered(self, batch_id: int, granted: bool) -> bool:
        """The feeder's answer to a take; False when the batch is not here."""
        batch = self.pipeline.batches.get(batch_id)
        if batch is None or not self.pipeline.granted(batch_id, granted):
            return False
        if batch.asked_at is not None:  # the first answer to its take: a round trip
            self.window.answered(time.monotonic() - batch.asked_at)
            batch.asked_at = None
            self.widen_sample_queue()
        if not granted:  # another worker holds this batch (a copy sent again)
            self.counts["refused_batches"] += 1
            self.ask_next()
        return True

    def on_shard(self, shard: int, _identity: bytes | None, env) -> None:
        match env.msg:
            case Embeddings() as e:
                batch = self.pipeline.embeddings(shard, e)
                if batch is None:
                    return  # the batch was refused to this worker meanwhile
                if batch.has_embeddings():
                    now = time.monotonic()
                    if batch.looked_up_at is not None:  # rows that came before it asked
                        self.counts["lookup_wait_s"] += now - batch.looked_up_at
                    self.waits.add(now - batch.needed_at if batch.needed_at else 0.0)
                self.advance()
            case _:
                self.unexpected(env, "shard link")

    def widen_sample_queue(self) -> None:
        """Open more connections to each feeder's sample queue while the measured round trip
        and batch time say one carries too few batches (``TakeWindow.links``, at most
        ``prefetch`` + 1). Over TCP only: the kernel's buffers of an ipc:// connection are not
        sized, nor is its round trip long."""
        want = self.window.links(self.job.train.prefetch + 1)
        if want <= self.sample_links or not self.sample_queues[0].startswith("tcp://"):
            return
        for _ in range(want - self.sample_links):
            for endpoint in self.sample_queues:
                self.samples.connect(endpoint)
        log.info("%s: %d connections to each sample queue (round trip %.2f ms, batch %.2f ms)",
                 self.node_id, want, 1000 * (self.window.rtt() or 0.0),
                 1000 * (self.window.batch_s or 0.0))
        self.sample_links = want

    def gate_pulling(self) -> None:
        """Pull while the pipeline has room for another batch, and not while leaving (nor
        before the PartMap says which feeder each batch belongs to)."""
        self.pause(self.samples, self.leaving or self.links.owners is None
                   or len(self.pipeline) > self.job.train.prefetch)

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

    def send_ack(self, ack: Ack) -> None:
        """The ack goes at the start of the loop's next turn (``flush_acks``; that turn's poll
        does not wait), once the sockets were read: a batch trains with the loop's sockets
        unread, so the sample pulled meanwhile is only read then, and its take can go with
        the ack."""
        self.acks_due.append(ack)
        if self.parked is None:  # (a batch held back keeps its wake-up; the ack goes then)
            self.wake_at = time.monotonic()

    def flush_acks(self) -> None:
        """The acks due, each with the takes that follow it to the same feeder (AckTaking): a
        copy of the batch, pulled while it ran, may be asked for now, and the batch that runs
        next leaves its place among those asked ahead to another."""
        while self.acks_due:
            self.ask_next(self.acks_due.popleft())

    def feeder_restarted(self, feeder: int) -> None:
        """Tell a restarted feeder what its dead process may have lost (FeederLinks)."""
        messages = self.links.restarted(feeder, self.pipeline)
        for msg in messages:
            self.send(self.feeders[feeder], msg)
        held = next(m for m in messages if isinstance(m, Holding))
        log.warning("feeder-%d restarted: sent it %d acks again and %d batches held",
                    feeder, len(self.links.acks_kept[feeder]), len(held.held))

    def ask_next(self, ack: Ack | None = None) -> None:
        """Keep the window's batches asked for ahead of the one training, in pull order
        (``Pipeline.to_ask``; ``TakeWindow``), the takes of each feeder in one message. With
        an ``ack`` (sent here, first), the batch that runs next is counted out of the window
        already, so that the take which replaces it goes with the ack (AckTaking) rather than
        alone when that batch starts."""
        now = time.monotonic()
        feeder = None if ack is None else self.links.acked(ack)
        if ack is not None:
            self.window.ran(now - self.run_started)
        ahead = self.window.ahead(self.grants_ahead)
        if ack is not None and self.pipeline.next_granted():
            ahead += 1
        takes: dict[int, list[int]] = {}
        while (batch := self.pipeline.to_ask(self.links.unacked, ahead)) is not None:
            takes.setdefault(self.links.feeder_of(batch.batch_id), []).append(batch.batch_id)
            batch.asked_at = now
            if self.push:  # its grant sends the shards' rows here
                batch.looked_up_at = now
        if ack is not None and feeder is not None:
            mine = takes.pop(feeder, [])
            self.send(self.feeders[feeder], AckTaking.of(ack, mine) if mine else ack)
        for f, ids in takes.items():
            self.send(self.feeders[f], Taken(batch_id=ids[0]) if len(ids) == 1
                      else Taking(takes=np.array(ids, dtype=np.int64)))

    def due(self, s: SampleBatch) -> bool:
        """The batch's turn has come (its weights, or what its sync mode waits for)."""
        if s.eval:
            return self.replica.version >= s.min_round
        return self.sync.due(self.replica, s.round)

    def run_next(self) -> None:
        """Train (or score) the first batch that can go: granted, embeddings in, its round due.
        One batch per turn of the loop (``on_tick``, after every socket with something to read
        was read): between two batches the next ones are pulled and asked for and their grants
        and rows come in, so that they are ready when this one ends (run from the handlers,
        batches would follow each other with the sample queue unread, and the worker would
        pull its next batches only once it had run out of them)."""
        if self.awaiting_step is not None or self.parked is not None:
            return
        batch = self.pipeline.take_ready(self.due)
        if batch is None:
            return
        self.links.running(batch.batch_id)
        self.run_started = time.monotonic()
        self.waiting.note(None, self.run_started)  # running, not waiting
        self.ask_next()  # its grant comes back while this one trains
        if batch.sample.eval:
            self.score(batch)
        else:
            self.train(batch)
        self.advance()

    def advance(self) -> None:
        """Ask for what the next batches lack and say what the worker waits for; a batch that
        can go runs at the end of the loop's turn (``run_next``)."""
        now = time.monotonic()
        if self.awaiting_step is None and self.parked is None:
            batch = self.pipeline.wanting_embeddings(self.due, now)
            if batch is not None:  # lacking only its embeddings, not asked for (mode pull)
                self.look_up(batch)
            elif self.push:
                self.ask_overdue(now)
        self.ask_for_missed_weights(now)
        self.note_wait()
        if self.state != "starting":
            self.gate_pulling()
            if not (self.pipeline or self.idle_said or self.leaving or self.parked
                    or self.awaiting_step):
                self.idle_said = True  # said once until the next batch arrives
                for sock in self.feeders:
                    self.send(sock, Idle())
                self.idle_since = time.monotonic()

    def note_wait(self) -> None:
        """What the worker waits for from now on (``WaitClock``); nothing before it is ready."""
        reason = None if self.state == "starting" else "step" if self.awaiting_step \
            else "slowdown" if self.parked else self.pipeline.blocker(self.due)
        self.waiting.note(reason, time.monotonic())

    def ask_for_missed_weights(self, now: float) -> None:
        """A broadcast of weights can be missed: ask for the current ones while something
        waits for weights that must exist by now (``WorkerRounds.missed``)."""
        if self.state != "starting" and self.rounds.missed(now, self.replica,
                                                           self.pipeline.eval_waiting()):
            self.request_weights()

    def train(self, batch: PulledBatch) -> None:
        started = time.monotonic()
        try:
            loss, weight_sum, grads = self.compute.train(self.replica.model, self.leader, batch)
        except GroupError as exc:
            self.group_failed(exc)
            return
        outbox: list[tuple[zmq.Socket, Message]] = [
            (sock, EmbeddingGrads(batch_id=batch.batch_id, grads=g))
            for sock, g in zip(self.shards, grads, strict=True)]
        step = self.sync.after_backward(self.replica, weight_sum)
        if step is not None:  # the aggregator's answer ends the batch
            outbox.append((self.aggregator, step))
            then = functools.partial(self.await_step, batch, loss, weight_sum)
        else:
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
        """Send a finished batch's messages; in mode pull, each shard's gradients carry the
        look-up of the next batch when it is already granted and due (GradsLookup)."""
        after = None if self.push or not any(isinstance(m, EmbeddingGrads) for _, m in outbox) \
            else self.pipeline.wanting_embeddings(self.due, time.monotonic())
        if after is not None:
            after.looked_up_at = time.monotonic()
            self.counts["lookups_with_grads"] += len(self.shards)
        for i, (sock, msg) in enumerate(outbox):
            if sock.closed:   # shard i's socket renewed while the batch was held back (the
                sock = self.shards[i]  # outbox lists the shards' gradients first, in order)
            if after is not None and isinstance(msg, EmbeddingGrads):
                msg = GradsLookup(batch_id=msg.batch_id, lookup=after.batch_id,
                                  train=not after.sample.eval, grads=msg.grads)
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
        report = self.sync.trained(self.replica)
        if report is not None:
            self.to_control(report)

    def score(self, batch: PulledBatch) -> None:
        started = time.monotonic()
        s = batch.sample
        try:
            probs = self.compute.score(self.replica.model, self.leader, batch)
        except GroupError as exc:
            self.group_failed(exc)
            return
        self.counts["eval_samples"] += len(s.labels)
        self.counts["batches_scored"] += 1
        self.state = "evaluating"
        ack = Ack(batch_id=s.batch_id, samples=len(s.labels), loss_sum=0.0, weight_sum=0.0,
                  preds=probs.astype(np.float32))
        self.release([], functools.partial(self.send_ack, ack), time.monotonic() - started)

    # -- the clock and leaving -----------------------------------------------------------------
    def on_tick(self, now: float) -> None:
        self.flush_acks()
        if self.parked is not None and now >= (self.wake_at or 0.0):
            (outbox, then), self.parked, self.wake_at = self.parked, None, None
            self.deliver(outbox, then)
            self.advance()
        else:
            self.run_next()
        if self.parked is None:  # another batch ready: the next poll only looks, then runs it
            self.wake_at = now if self.acks_due or (self.awaiting_step is None
                                                    and self.pipeline.ready(self.due)) else None
        if self.group is not None and self.group.waiting():
            self.group.ping(now)
        if self.leaving:
            self.leave_when_done(now)
        self.ask_for_missed_weights(now)
        if self.push:
            self.ask_overdue(now)
        if self.idle_since is not None and now - self.idle_since >= self.heartbeat_s:
            # starved for a while (the end of a pass): lazy does not hold the aggregation back
            report = self.sync.starved(self.replica)
            if report is not None:
                self.idle_since = None
                self.to_control(report)
        super().on_tick(now)

    def on_signal(self, signum: int) -> None:
        if self.leaving or self.quiet_stop() or not self.welcomed or self.state == "starting":
            super().on_signal(signum)  # nothing to hand back, or asked twice
            return
        log.info("%s: asked to stop; finishing its batches, then leaving", self.node_id)
        self.leaving = True
        self.leave_by = time.monotonic() + LEAVE_TIMEOUT_S

    def leave_when_done(self, now: float) -> None:
        self.pause(self.samples, True)
        self.flush_acks()  # not left for a turn that will not come
        busy = self.awaiting_step is not None or self.parked is not None \
            or self.pipeline.holds_granted() or self.replica.in_flight
        if busy and now < self.leave_by:
            return
        if not busy and self.sync.deltas and self.replica.samples_since:
            # the dense progress since the last contribution counts in the next round
            self.contribute(self.replica.settled_round + 1, done=True)
        self.to_control(Leaving(reason="stopped" if not busy else
                                f"stopped with {len(self.pipeline)} batch(es) unfinished"))
        self.stopping = True

    def close(self) -> None:
        # a last contribution on leaving: closed here, with its linger (the context's
        # destroy would set every socket still open to linger 0 and drop it)
        self.group_aggregator.setsockopt(zmq.LINGER, 1000)
        self.group_aggregator.close()
        super().close()

    def counters(self) -> dict:
        group = {} if self.group is None else self.group.counters()
        return {**self.counts, **self.sync.counters(), **group, "round": self.replica.version,
                "embeddings": "push" if self.push else "pull",
                "embedding_waits": self.waits.seen,
                "embedding_wait_ms": self.waits.milliseconds(),
                "waiting_s": self.waiting.rounded(),
                "generation": self.rounds.generation,
                "round_sent": self.replica.sent_round if self.replica.in_flight else None,
                "round_deferred": self.rounds.deferred,
                "round_samples": self.replica.samples_since,
                "pipeline": len(self.pipeline), "device": str(self.device),
                "sample_links": self.sample_links, **self.window.counters(self.grants_ahead)}


def main() -> None:
    role_main(Worker)


if __name__ == "__main__":
    main()
