"""A worker: one replica of the dense network (``python -m roles.worker`` or ``zbus-worker``).

Per batch it pulls dense features, labels and weights from the sample queue (never sparse
keys; one PULL socket connected to every feeder's queue), gets its embeddings from every shard
by batch id, asks the batch's feeder to take it (each batch is granted to one worker), runs
forward and backward, sends each shard the gradients of its rows, updates the dense weights
and acknowledges the batch to the feeder of its part (control's PartMap). Up to ``prefetch``
batches are pulled ahead while the current one trains, but only the next ``grants_ahead`` to
run are taken (asked for while the one before them trains, so that the feeder's answer does not
wait on the round trip): the rest stay untaken, so at the end of a pass the feeder can hand
copies of them to an idle worker instead of waiting for a slow one.

This module is its loop (``Worker``): the sockets, the messages from control, the feeders, the
shards, the aggregator and its group dispatched to its parts, the batch that runs each turn, the
heartbeat's counters. Its parts, each given what it needs: ``feeders`` (the sample queue, takes,
grants, acks), ``shards`` (embeddings in, gradient rows out), ``dense`` (the replica, the rounds,
the aggregators), ``running`` (one batch at a time: the arithmetic, the slowdown, a step's
answer), ``group_link`` (a model-parallel group it leads, ``[cluster] parts`` > 1). The pure
state they keep is ``roles.algorithms.worker`` (the pulled batches, the feeder links, the take
window, the replica and its rounds), the arithmetic ``roles.model``.

A worker runs one batch per turn of its loop (``run_next``, from ``on_tick``): its handlers only
record what arrives, and the batch that can go runs once every socket with something to read was
read, so that the next batches are pulled and asked for meanwhile.

SIGTERM: the worker stops pulling, finishes the batches it was granted, sends its last dense
progress as a contribution marked ``done``, tells control it is leaving and exits 0 (a second
SIGTERM, or ``LEAVE_TIMEOUT_S``, ends it at once: whatever it still holds, the feeder sends
again).
"""

from __future__ import annotations

import functools
import logging
import signal
import time

import torch
import zmq

from roles.algorithms.shared import live
from roles.algorithms.sync import worker as sync_modes
from roles.algorithms.worker.pulled import Pipeline, WaitClock
from roles.algorithms.worker.replica import NetworkWeights, Replica
from roles.job.cli import role_main
from roles.job.settings import Job
from roles.model.network import build_network, pick_device, use_threads
from roles.model.networks import NetworkError
from roles.protocol.datapath import (
    Ack,
    Embeddings,
    Grant,
    Grants,
    PartMap,
    SampleBatch,
    sample_batch_bytes,
)
from roles.protocol.dense_sync import Aggregate, Restore, Weights
from roles.protocol.lifecycle import FeederBack, ShardBack
from roles.protocol.model_parallel import ModelPlan
from roles.protocol.operator import Settings
from roles.worker.dense import DenseSide
from roles.worker.feeders import FeederSide
from roles.worker.group_link import GroupError, GroupLink
from roles.worker.running import Runner
from roles.worker.shards import ShardSide
from zbus.codec import Envelope
from zbus.messages import Leaving, Ready
from zbus.node import Node

log = logging.getLogger(__name__)
LEAVE_TIMEOUT_S = 5.0


class Worker(Node):
    role = "worker"
    fatal_errors = (NetworkError,)  # the network cannot run on this worker's device

    def __init__(self, job: Job, index: int, slowdown: float = 1.0):
        self.leaving = False  # before the signal handlers are installed
        super().__init__(job.cluster, index, job.fingerprint())
        self.job = job
        c, t = job.cluster, job.train
        self.threads = use_threads(job)
        self.device = pick_device(t.device)
        self.settings = live.LiveValues(job.aggregation)
        self.sync = sync_modes.for_mode(t, self.settings)
        self.pipeline = Pipeline(c.shards, job.layout())
        self.waiting = WaitClock()  # what the worker waits for, between batches
        self.leave_by = 0.0
        self.departing = False  # leaving: its last contribution is on its way
        # model parallelism: this worker leads group ``index`` of ``parts`` members, and the
        # replica becomes the group's when control's ModelPlan arrives
        self.group: GroupLink | None = None
        if c.parts > 1:
            self.bind(zmq.ROUTER, c.endpoint(c.group_endpoint_name(index, 0)), self.on_group)
            self.group = GroupLink(
                job, self.node_id, index, self.device,
                peers={m: self.connect(zmq.DEALER, c.endpoint(c.group_endpoint_name(index, m)))
                       for m in range(1, c.parts)},
                send=self.send, timeout_s=c.node_timeout_s / 2, ping_every_s=self.heartbeat_s,
                all_there=self.request_weights, unexpected=self.unexpected,
                failed=self.group_failed)
        network = build_network(job).to(torch.device("cpu") if self.group is not None
                                        else self.device)
        # one PULL fair-queues the sample queues of every feeder; acks go to a batch's feeder
        samples = self.connect(zmq.PULL, c.endpoint(c.feeder_endpoint_name("samples", 0)),
                               self.on_sample, rcvhwm=1,
                               kernel_buffer=sample_batch_bytes(
                                   t.batch_size, len(job.dense_fields),
                                   len(job.layout().list_fields), len(job.tasks)))
        self.feeders = FeederSide(
            job, self.node_id, self.pipeline, samples,
            [self.connect(zmq.DEALER, c.endpoint(c.feeder_endpoint_name("ledger", f)),
                          self.on_feeder) for f in range(c.feeders)],
            self.send, self.pause, self.moved, self.renew)
        for endpoint in self.feeders.sample_queues[1:]:
            samples.connect(endpoint)
        self.pause(samples, True)  # until the first weights are here
        aggregator = self.connect(zmq.DEALER, c.endpoint("aggregator"), self.on_reply)
        tree = c.group_of(index)   # the aggregator its contributions go to
        self.dense = DenseSide(
            self.node_id, Replica(NetworkWeights(network, self.device), self.sync.local_lr),
            self.sync, aggregator, aggregator if tree == 0 else
            self.connect(zmq.DEALER, c.aggregator_endpoint(tree)), self.send,
            2 * self.heartbeat_s, self.group)
        self.shards = ShardSide(
            index, t.embeddings == "push", self.pipeline,
            [self.connect(zmq.DEALER, c.endpoint(f"ps-{i}"), functools.partial(self.on_shard, i))
             for i in range(c.shards)], self.send, self.reconnect, self.dense.due)
        self.weights = self.connect(zmq.SUB, c.endpoint("aggregator_pub"), self.on_broadcast)
        self.runner = Runner(job, self.node_id, network, self.device, slowdown, self.dense,
                             self.shards, self.group, self.send_ack, self.to_control,
                             self.set_state, self.wake, self.advance)

    # -- what the parts are given --------------------------------------------------------------
    def set_state(self, state: str) -> None:
        self.state = state

    def wake(self, at: float) -> None:
        self.wake_at = at

    def reconnect(self, sock: zmq.Socket) -> zmq.Socket:
        """``sock`` connected anew if its peer was made again elsewhere (a pod rescheduled)."""
        return self.renew(sock) if self.moved(sock) else sock

    def request_weights(self) -> None:
        self.dense.request_weights()

    def send_ack(self, ack: Ack) -> None:
        """The ack goes at the start of the loop's next turn (``flush_acks``; that turn's poll
        does not wait), once the sockets were read: a batch trains with the loop's sockets
        unread, so the sample pulled meanwhile is only read then, and its take can go with
        the ack."""
        self.feeders.acks_due.append(ack)
        if self.runner.parked is None:  # (a batch held back keeps its wake-up; the ack goes
            self.wake_at = time.monotonic()   # then)

    # -- messages --------------------------------------------------------------------------------
    def on_welcome(self) -> None:
        if self.group is None:
            self.request_weights()  # a group leader asks once its members answered

    def handle_command(self, env: Envelope) -> None:
        match env.msg:
            case ModelPlan() as plan if self.group is not None and self.group.leader is None:
                self.dense.replica = self.group.take_plan(plan, time.monotonic())
            case ShardBack(shard=i, generation=g):
                self.shards.restarted(i, g)
            case FeederBack(feeder=i, generation=g):
                if self.feeders.restarted(i, g):   # connected anew: pull as the gate says
                    self.feeders.gate(self.leaving)
            case PartMap() as m:
                if self.feeders.part_map(m) and self.state != "starting":
                    self.feeders.gate(self.leaving)
            case Settings() as m if self.settings.take(m):
                self.advance()  # max_local_rounds may have risen
            case Restore(generation=g) if self.dense.rounds.restore(g):
                self.dense.reconnect(self.reconnect)   # the aggregator made again elsewhere?
                self.weights = self.reconnect(self.weights)
                self.request_weights()  # until the restored weights are here: their
                                        # broadcast may leave before this SUB reconnects
            case Aggregate(round=r, participants=who) if self.node_id in who:
                self.dense.with_replica(functools.partial(self.aggregate, r))
            case _:
                pass

    def on_sample(self, _identity: bytes | None, env: Envelope) -> None:
        match env.msg:
            case SampleBatch() as s:
                self.runner.check(s)
                if self.feeders.pulled(s):
                    self.feeders.gate(self.leaving)
                    self.note_wait()
            case _:
                self.unexpected(env, "sample queue")

    def on_feeder(self, _identity: bytes | None, env: Envelope) -> None:
        match env.msg:
            case Grant(batch_id=b, granted=granted):
                if self.feeders.answered(b, granted):
                    self.advance()
            case Grants() as m:
                if sum(self.feeders.answered(b, granted) for b, granted in m.answers()):
                    self.advance()
            case _:
                self.unexpected(env, "feeder link")

    def on_shard(self, shard: int, _identity: bytes | None, env: Envelope) -> None:
        match env.msg:
            case Embeddings() as e:
                if self.shards.embeddings(shard, e):
                    self.advance()
            case _:
                self.unexpected(env, "shard link")

    def on_reply(self, _identity: bytes | None, env: Envelope) -> None:
        match env.msg:
            case Weights() as w if self.dense.replies_due:
                w.require_finite()  # refused before it changes anything (zbus.codec)
                if self.dense.answers_step():
                    self.runner.finish_step(w)
                    self.advance()
                else:
                    self.take_weights(w)
            case _:
                self.unexpected(env, "aggregator link")

    def on_broadcast(self, _identity: bytes | None, env: Envelope) -> None:
        match env.msg:
            case Weights() as w:
                w.require_finite()
                self.take_weights(w)
            case _:
                self.unexpected(env, "weights subscription")

    def on_group(self, _identity: bytes | None, env: Envelope) -> None:
        assert self.group is not None  # its socket exists only in a group
        self.group.heard(env)

    # -- weights and rounds ----------------------------------------------------------------------
    def take_weights(self, w: Weights) -> None:
        self.dense.with_replica(functools.partial(self.adopt, w))

    def adopt(self, w: Weights) -> None:
        """Weights of a round (or, of a newer generation, restored ones): the replica adopts
        them; the first ones make the worker ready."""
        if not self.dense.adopt(w):
            return
        if self.state == "starting":
            if self.group is None:   # (a group's members answer only in its forward)
                self.runner.warm_up()
            self.state = "ready"
            self.to_control(Ready(info={"device": str(self.device), "threads": self.threads,
                                        "parameters": self.dense.replica.size,
                                        "slowdown": self.runner.slowdown}))
            self.feeders.gate(self.leaving)
        round_ = self.dense.rounds.deferred_due(self.dense.replica)
        if round_ is not None:
            self.contribute(round_)
        self.advance()

    def aggregate(self, round_: int) -> None:
        """Aggregate(round_) names this worker: contribute, unless it is a repeat or the round
        waits for the one in flight."""
        if self.dense.rounds.called(self.dense.replica, round_):
            self.contribute(round_)

    def contribute(self, round_: int, done: bool = False) -> None:
        self.dense.contribute(round_, done)
        self.advance()  # batches of the next round may go now

    def ask_for_missed_weights(self, now: float) -> None:
        """A broadcast of weights can be missed: ask for the current ones while something
        waits for weights that must exist by now (``WorkerRounds.missed``)."""
        if self.state != "starting" and self.dense.missed(now, self.pipeline.eval_waiting()):
            self.request_weights()

    # -- batches ---------------------------------------------------------------------------------
    def run_next(self) -> None:
        """Run (train or score) the first batch that can go: granted, embeddings in, its round
        due. One batch per turn of the loop (``on_tick``, after every socket with something to
        read was read): between two batches the next ones are pulled and asked for and their
        grants and rows come in, so that they are ready when this one ends (run from the
        handlers, batches would follow each other with the sample queue unread, and the
        worker would pull its next batches only once it had run out of them)."""
        if not self.runner.free():
            return
        batch = self.pipeline.take_ready(self.dense.due)
        if batch is None:
            return
        self.feeders.running(batch.batch_id)
        self.waiting.note(None, time.monotonic())  # running, not waiting
        self.runner.run(batch)
        self.advance()

    def advance(self) -> None:
        """Ask for what the next batches lack and say what the worker waits for; a batch that
        can go runs at the end of the loop's turn (``run_next``)."""
        now = time.monotonic()
        if self.runner.free():
            batch = self.pipeline.wanting_embeddings(self.dense.due, now)
            if batch is not None:  # lacking only its embeddings, not asked for (mode pull)
                self.shards.look_up(batch)
            elif self.shards.push:
                self.shards.ask_overdue(now)
        self.ask_for_missed_weights(now)
        self.note_wait()
        if self.state != "starting":
            self.feeders.gate(self.leaving)
            if not (self.pipeline or self.feeders.idle_said or self.leaving
                    or not self.runner.free()):
                self.feeders.say_idle()

    def note_wait(self) -> None:
        """What the worker waits for from now on (``WaitClock``); nothing before it is ready,
        nor while a batch runs over its group."""
        reason = None if self.state == "starting" or self.runner.running() \
            else self.runner.holds() or self.pipeline.blocker(self.dense.due)
        self.waiting.note(reason, time.monotonic())

    # -- the clock and leaving -------------------------------------------------------------------
    def on_tick(self, now: float) -> None:
        self.feeders.flush_acks()
        if self.runner.unpark(now):
            self.advance()
        elif self.runner.parked is None:
            self.run_next()
        if self.runner.parked is None:  # another batch ready: the next poll only looks, then
            self.wake_at = now if self.feeders.acks_due or (   # runs it
                self.runner.free() and self.pipeline.ready(self.dense.due)) else None
        if self.group is not None:
            self.group.tick(now)
        if self.leaving:
            self.leave_when_done(now)
        self.ask_for_missed_weights(now)
        if self.shards.push:
            self.shards.ask_overdue(now)
        if self.feeders.starved(now, self.heartbeat_s):
            # starved for a while (the end of a pass): lazy does not hold the aggregation back
            report = self.sync.starved(self.dense.replica)
            if report is not None:
                self.feeders.idle_since = None
                self.to_control(report)
        super().on_tick(now)

    def group_failed(self, exc: GroupError) -> None:
        """A member is gone: this group cannot train. Leave; the feeder sends the batches it
        holds to the other groups."""
        log.error("%s: %s; the group leaves the job", self.node_id, exc)
        self.to_control(Leaving(reason=f"model-parallel group {self.index}: {exc}"))
        self.exit_code = 1
        self.stopping = True

    def on_signal(self, signum: int) -> None:
        if self.leaving or self.quiet_stop() or not self.welcomed or self.state == "starting":
            super().on_signal(signum)  # nothing to hand back, or asked twice
            return
        log.info("%s: asked to stop; finishing its batches, then leaving", self.node_id)
        self.signalled = signal.Signals(signum).name
        self.leaving = True
        self.leave_by = time.monotonic() + LEAVE_TIMEOUT_S

    def leave_when_done(self, now: float) -> None:
        self.pause(self.feeders.samples, True)
        self.feeders.flush_acks()  # not left for a turn that will not come
        if self.departing:
            return
        replica = self.dense.replica
        busy = not self.runner.free() or self.pipeline.holds_granted() or replica.in_flight
        if busy and now < self.leave_by:
            return
        self.departing = True
        if not busy and self.sync.deltas and replica.samples_since:
            self.dense.with_replica(self.leave_contributing)
        else:
            self.leave(len(self.pipeline) if busy else None)

    def leave_contributing(self) -> None:
        """The dense progress since the last contribution counts in the next round."""
        self.contribute(self.dense.replica.settled_round + 1, done=True)
        self.leave()

    def leave(self, unfinished: int | None = None) -> None:
        self.to_control(Leaving(reason="stopped" if unfinished is None else
                                f"stopped with {unfinished} batch(es) unfinished",
                                signal=self.signalled))
        self.stopping = True

    def close(self) -> None:
        self.dense.close()
        super().close()

    def counters(self) -> dict:
        group = {"late_group_messages": 0} if self.group is None else self.group.counters()
        return {**self.runner.counters(), **self.dense.counters(), **self.shards.counters(),
                **self.feeders.counters(), **group, "waiting_s": self.waiting.rounded(),
                "pipeline": len(self.pipeline)}


def main() -> None:
    role_main(Worker)


if __name__ == "__main__":
    main()
