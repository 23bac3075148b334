"""A feeder: reads its parts of the data, sends each batch's sparse keys to the shards that own
them and its dense features, labels and weights to the sample queue, and keeps the ledger of
batches in flight (``roles.algorithms.feeding.ledger.Ledger``). It reports each finished training
pass (and, in sync mode round, each drained round: ``roles.algorithms.sync.feeder``) and scores
each evaluation pass. What its acknowledged batches add up to is its tally
(``roles.algorithms.feeding.tally``).

This module is its loop (``Feeder``): the sockets, the messages from control and the workers
dispatched to its parts, the sending of batches, the heartbeat's counters. The parts, each
given what it needs: ``loading`` (opening and indexing the data, the statistics pass),
``passes`` (the parts and the passes over them), ``ledger_side`` (takes, grants, acks, the ack
log, a restart's reclaiming), ``hold`` (whole-job checkpoints); ``streams``, the parts' streams.

Flow control: at most ``max_in_flight`` batches are unacknowledged at a time (see
``LedgerSide.in_flight_limit``), and a batch is only built when the sample queue can take it
(POLLOUT), so the keys and the samples of a batch always leave together and no buffer grows
without bound.

Keys go to shards by the key map (``roles.algorithms.feeding.key_routing``). With skew-aware
placement (``[placement] mode = "skew"``) the feeder counts the keys of the batches it sends per
allocation window and sends control the window's KeyCounts; when control publishes a new key
map it stops sending new batches, reports Drained once nothing is in flight, and routes by the
new map when control says it is active (the shards have handed their rows over).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from roles.algorithms.feeding.key_routing import KeyRouting
from roles.algorithms.feeding.ledger import InFlight
from roles.algorithms.feeding.tally import FeederTally, ListTally
from roles.algorithms.sync import feeder as sync_modes
from roles.checkpoint.files import checkpoint_store
from roles.checkpoint.model_files import ExportAnswers
from roles.checkpoint.stored_acks import StoredAcks
from roles.data.compiled import AVAILABLE
from roles.data.hashing import compiled_loop, missing_key
from roles.data.index import DataError
from roles.data.stream import Samples
from roles.feeder.hold import CheckpointHold
from roles.feeder.ledger_side import LedgerSide
from roles.feeder.loading import Loading
from roles.feeder.passes import Passes
from roles.feeder.stream_side import StreamSide
from roles.job.cli import MAX_WORKERS, role_main
from roles.job.settings import Job
from roles.protocol.checkpoint import Checkpoint
from roles.protocol.datapath import (
    Ack,
    AckTaking,
    DataStats,
    Holding,
    Idle,
    PartMap,
    SampleBatch,
    Taken,
    Taking,
    max_in_flight,
    sample_batch_bytes,
)
from roles.protocol.lifecycle import EpochStart, Evaluate, Export, Membership, ShardBack
from roles.protocol.operator import FeedingPaused
from roles.protocol.placement import Placement
from roles.protocol.stream import StreamEnd
from roles.storage.fs import StorageError
from zbus import sockets
from zbus.codec import Envelope, Message
from zbus.messages import Failure, Ready
from zbus.node import Node

log = logging.getLogger(__name__)
STORE_POLL_S = 0.02   # feeding waits for the ack log's copy in the store: looked at this often
CONNECT_POLL_S = 0.02   # a stream job's feeder looks this often whether its broker answered


class Feeder(Node):
    role = "feeder"
    fatal_errors = (DataError,)  # a file damaged or gone, a wrong schema: the job stops

    def __init__(self, job: Job, index: int = 0):
        super().__init__(job.cluster, index, job.fingerprint())
        if AVAILABLE:   # the keys' compiled loop, loaded before this node says hello: not
            compiled_loop()   # in the middle of its work, where it held the GIL for seconds
        self.job = job
        c, t = job.cluster, job.train
        self.samples = self.bind(zmq.PUSH, c.endpoint(c.feeder_endpoint_name("samples", index)),
                                 sndhwm=1,
                                 kernel_buffer=sample_batch_bytes(
                                     t.batch_size, len(job.dense_fields),
                                     len(job.layout().list_fields), len(job.tasks)))
        self.acks = self.bind(zmq.ROUTER, c.endpoint(c.feeder_endpoint_name("ledger", index)),
                              self.on_worker)
        self.shards = [self.connect(zmq.DEALER, c.endpoint(f"ps-{i}"), sndhwm=0)
                       for i in range(c.shards)]  # bounded by the ledger, never blocks
        self.sync = sync_modes.for_mode(job)
        group_by, layout = job.metrics.group_by, job.layout()   # (the GAUC's groups)
        self.tally = FeederTally(len(job.tasks), job.metrics.group_rows if group_by else 0,
                                 missing_key(layout.tables[layout.fields.index(group_by)])
                                 if group_by else None)
        self.loading = Loading(job, index, self.keep_alive, self.report, self.to_control,
                               self.set_state)
        self.exports = ExportAnswers(self.loading.export_part, self.report)
        self.ledger = LedgerSide(job, self.tally, self.sync, lambda: self.passes.current(),
                                 self.to_worker, self.to_shards, self.pause_acks, self.pump,
                                 self.started, reclaimed=self.keys_again)
        self.passes = Passes(job, index, self.loading, self.ledger, self.tally, self.sync,
                             self.set_state, self.report, self.pump, self.stream_trained)
        self.stream: StreamSide | None = None   # a stream job's events (docs/streams.md)
        self.hold = CheckpointHold(index, self.sync, self.loading, self.passes, self.ledger,
                                   self.report, self.pump)
        self.layout = job.layout()
        self.routing = KeyRouting(c.shards, job.placement, self.layout)
        self.shards_back: dict[int, int] = {}  # shard -> the restart generation acted on
        self.batches_sent = 0
        self.lists = ListTally(self.layout)   # ids per list field, in the batches sent
        self.batches_resent = 0
        self.samples_refused = 0     # sends the sample queue did not take (sent again)
        self.keys_again_sent = 0     # taken back from a dead process, keys sent again
        self.paused = False          # an operator paused feeding: no new batch goes out

    def set_state(self, state: str) -> None:
        self.state = state

    # -- start-up --------------------------------------------------------------------------
    def on_welcome(self) -> None:
        run_dir = Path(self.run_dir)
        feeders = run_dir / "feeders"
        failed = None if self.job.streaming else self.loading.open(run_dir, self.node_id)
        if failed is not None:
            self.fail(failed)
            return
        store = checkpoint_store(self.job, self.run_dir)
        store.discard_staged([f"*/{self.node_id}/*"])   # a killed process's, on this disk
        self.hold.open(store, self.node_id)
        info: dict[str, Any] = {"indexed": self.index == 0}
        rolled_back = False
        if self.rollback and self.restore_dir:
            try:
                info.update(self.hold.roll_back(self.restore_dir, self.node_id, feeders))
            except (OSError, ValueError, KeyError, StorageError) as exc:
                self.fail(f"cannot restore the checkpoint {self.restore_dir}: {exc}")
                return
            rolled_back = True
        if self.job.streaming:   # (after the roll-back: the stream is read from its position)
            failed = self.open_stream(run_dir, self.hold.stream_at if rolled_back else None)
            if failed is not None:
                self.fail(failed)
                return
        stored = StoredAcks(store, self.node_id, self.heartbeat_s,
                            max_in_flight(MAX_WORKERS, self.job.train.prefetch)) \
            if self.job.checkpoint.dir else None
        try:
            self.ledger.open_ack_log(feeders, self.node_id, rolled_back, stored)
            if self.stream is not None:
                self.stream.open_sent_log(feeders, self.node_id, rolled_back)
        except (OSError, ValueError, StorageError) as exc:   # started again, it tries again
            log.error("%s: cannot read or write its ack log in %s: %s", self.node_id,
                      self.job.checkpoint.dir, exc)
            self.exit_code = 1
            self.stopping = True
            return
        self.state = "ready"
        self.to_control(Ready(info=info))

    def open_stream(self, run_dir: Path, rewind: dict[str, Any] | None) -> str | None:
        """A stream job's source; ``rewind``: where the stream stood at the checkpoint the
        job went back to, every feeder's records made one (``roles.events.positions``)."""
        self.loading.open_stream(run_dir, self.node_id)
        assert self.loading.rejected_rows is not None
        self.stream = StreamSide(self.job, self.index, self.loading.rejected_rows)
        self.hold.stream = self.stream
        failed = self.stream.open(rewind, self.rollback_id)
        self.wake_at = time.monotonic()
        return failed

    def stream_trained(self) -> None:
        """A stream job's pass ends: the feeder's scores go to control before its report."""
        if self.stream is not None:
            self.tally.data.rows_read += self.stream.events_taken
            self.tally.data.rejected += self.stream.events_rejected
            self.report(self.stream.scores())

    # -- commands from control -------------------------------------------------------------
    def handle_command(self, env: Envelope) -> None:
        match env.msg:
            case Export() as m:
                self.exports.handle(m)
            case Membership(version=v, workers=workers) if self.ledger.newer_members(v):
                if self.stream is not None:   # the dead processes' batches they held
                    self.stream.workers_lost(self.ledger.members - set(workers),
                                             time.monotonic())
                self.ledger.membership(v, set(workers))
            case PartMap(version=v) as m if self.loading.opened() and self.passes.newer_map(v):
                self.take_parts(m)
            case DataStats() as m if not self.loading.prepared() and self.passes.has_map():
                self.loading.take_stats(m)
                if self.stream is not None:
                    assert self.loading.preparer is not None
                    self.stream.prepared(self.loading.preparer)
                elif not self.tally.batches_acked:   # a first start, not a restarted feeder
                    self.passes.warm(0)
            case EpochStart(epoch=e) if self.passes.may_train(e) and self.stream is not None:
                self.passes.begin_stream(self.stream.begin(e))
            case EpochStart(epoch=e) if self.passes.may_train(e):
                self.passes.start_training(e)
            case StreamEnd(epoch=e, reason=why) if self.stream is not None \
                    and not self.stream.ended and e == self.passes.epoch:
                log.info("the stream ends: %s", why)
                self.stream.end()
                self.pump()
                self.passes.maybe_pass_done()
            case Evaluate(epoch=e, round=r) if self.passes.may_evaluate(e):
                self.passes.start_evaluation(e, r)
            case Placement() as msg if self.routing.newer(msg):
                self.handle_placement(msg)
            case ShardBack(shard=i, generation=g) if g > self.shards_back.get(i, 0) \
                    and 0 <= i < len(self.shards):
                self.shards_back[i] = g
                if self.moved(self.shards[i]):   # made again elsewhere (a pod rescheduled)
                    self.shards[i] = self.renew(self.shards[i])
                count = self.resend_keys(i)
                log.warning("ps-%d restarted: the keys of %d batch(es) in flight sent again",
                            i, count)
            case Checkpoint() as m:
                self.hold.handle(m)
            case FeedingPaused(paused=paused) if paused != self.paused:
                self.paused = paused
                log.info("feeding %s by an operator", "paused" if paused else "resumed")
                self.pump()
            case _:
                pass  # other commands, and repeats of ones already acted on

    def take_parts(self, m: PartMap) -> None:
        first = not self.passes.has_map()
        try:
            if first:
                self.loading.adopt(m)
        except DataError as exc:
            self.fail(str(exc))
            return
        new = self.passes.take_parts(m)
        if self.stream is not None:   # one part, this feeder's own: its stats from its events
            return
        self.loading.hold_only(self.passes.parts.mine())
        if not self.loading.prepared():  # the statistics are still being gathered: summarise
            self.loading.want_statistics(*self.passes.training_parts())
            if first:   # read while the statistics are taken (the first epoch's parts)
                self.loading.hold_ahead(self.passes.opening(0))
            self.wake_at = time.monotonic()
        elif new:
            self.passes.take_over(new)

    # -- placement ---------------------------------------------------------------------------
    def handle_placement(self, msg: Placement) -> None:
        if msg.phase != "active":
            if self.routing.pause(msg.version):
                log.info("placement %d: pausing until the shards have moved keys", msg.version)
            self.maybe_placement_drained()
            return
        self.routing.activate(msg)
        log.info("placement %d active: %d keys placed off their bucket", msg.version,
                 len(msg.keys))
        self.pump()

    def maybe_placement_drained(self) -> None:
        """A new key map waits for this feeder: once nothing is in flight, say so."""
        drained = self.routing.drained(bool(self.ledger.in_flight()))
        if drained is not None:
            self.report(drained)

    # -- sending ---------------------------------------------------------------------------
    def on_writable(self, sock: sockets.Socket) -> None:
        self.pump()

    def may_send_new(self) -> bool:
        # sync mode round: the next round's batches wait until this round is acknowledged
        return (self.passes.current() is not None and not self.paused
                and self.routing.placing is None and not self.hold.holding()
                and not self.ledger.recovering() and not self.passes.at_tail()
                and self.ledger.has_room()
                and (self.stream is None or self.stream.ready(time.monotonic())))

    def pump(self) -> None:
        """Send batches again, then new ones (or, at the end of a pass or round, second copies
        of stragglers), while the queue takes them (POLLOUT)."""
        if not self.passes.at_tail():
            self.ledger.no_copies()
        if self.ledger.recovering():  # restarted: not before every worker has answered
            self.want_writable(self.samples, False)
            return
        while self.queue_takes():
            again = self.ledger.again()
            plan = self.passes.current()
            if again is not None:
                batch_id, entry = again
                if not self.send_batch(batch_id, entry.batch, entry.eval, entry.round)[2]:
                    self.ledger.unsent(batch_id)
                    break
                self.batches_resent += 1
            elif plan is not None and self.may_send_new():
                taken = plan.take()
                if taken is None:
                    break
                batch_id, batch = taken
                round_ = self.sync.round_of(plan.eval)
                keys, owner, queued = self.send_batch(batch_id, batch, plan.eval, round_)
                last = not plan.eval and plan.exhausted()
                if not plan.eval and (counts := self.routing.count(keys, owner, last)) \
                        is not None:
                    self.to_control(counts)
                if last and self.stream is None:
                    self.passes.all_taken()
                self.ledger.sent(batch_id, batch, plan.eval, round_)
                self.batches_sent += 1
                self.sync.sent(plan.eval)
                if not queued:
                    self.ledger.unsent(batch_id)
                    break
            else:
                break
        self.want_writable(self.samples, self.ledger.more_again() or self.may_send_new())

    def queue_takes(self) -> bool:
        """The sample queue can take a batch now (POLLOUT)."""
        return bool(int(self.samples.getsockopt(zmq.EVENTS)) & zmq.POLLOUT)

    def to_shards(self, msg: Message) -> None:
        for sock in self.shards:
            self.send(sock, msg)

    def send_keys(self, batch_id: int, batch: Samples, shards: range | list[int],
                  eval: bool) -> tuple[np.ndarray, np.ndarray]:
        keys, owner, messages = self.routing.batch_keys(batch_id, batch.keys, shards,
                                                        train=not eval)
        for shard, msg in zip(shards, messages, strict=True):
            self.send(self.shards[shard], msg)
        return keys, owner

    def keys_again(self, batch_id: int, entry: InFlight) -> None:
        """A restarted feeder takes back a batch its dead process had sent, for a worker to
        train: a shard restarted meanwhile (its host gone with the feeder's, say) lost its
        keys, which the dead process had sent it, so every shard that was restarted gets them
        again (one that holds them ignores them)."""
        if self.shards_back:
            self.send_keys(batch_id, entry.batch, sorted(self.shards_back), entry.eval)
            self.keys_again_sent += 1

    def resend_keys(self, shard: int) -> int:
        """A restarted shard lost the keys of the batches in flight: send them again."""
        in_flight = self.ledger.batches_in_flight()
        for batch_id, batch, eval in in_flight:
            self.send_keys(batch_id, batch, [shard], eval)
        return len(in_flight)

    def send_batch(self, batch_id: int, batch: Samples, eval: bool,
                   round_: int) -> tuple[np.ndarray, np.ndarray, bool]:
        """Send one batch: its keys to their shards, its samples to the queue; whether the
        queue took them. Never blocking: a PUSH socket can say it takes a message (POLLOUT)
        for a pipe that is going away (a worker closing one of its connections to the queue),
        and a blocking send then waits for a worker to take, the feeder's loop stopped (and,
        roles sharing one thread as in the tests' in-process cluster, every role). A batch
        not taken is sent again first (``Ledger.unsent``); its keys, sent again then, are
        taken once by each shard."""
        keys, owner = self.send_keys(batch_id, batch, range(len(self.shards)), eval)
        lengths = self.layout.lengths(batch.keys)
        self.lists.add(lengths)
        try:
            self.send(self.samples, SampleBatch(
                batch_id=batch_id, epoch=self.passes.epoch, eval=eval,
                min_round=self.passes.eval_round if eval else 0, round=round_,
                dense=batch.dense, labels=batch.labels.reshape(-1), weights=batch.weights,
                lengths=lengths), flags=zmq.NOBLOCK)
        except zmq.Again:
            self.samples_refused += 1
            return keys, owner, False
        return keys, owner, True

    # -- takes and acknowledgements --------------------------------------------------------
    def to_worker(self, identity: bytes, msg: Message) -> None:
        self.send(self.acks, msg, identity=identity)

    def pause_acks(self, paused: bool) -> None:
        self.pause(self.acks, paused)

    def on_worker(self, identity: bytes | None, env: Envelope) -> None:
        assert identity is not None, "a ROUTER socket's messages come with their sender"
        worker = identity.decode(errors="replace")
        match env.msg:
            case Taken(batch_id=b):
                self.ledger.taken(identity, b)
            case Taking(takes=takes):
                self.ledger.taking(identity, takes.tolist())
            case Ack() as ack:
                self.acked(worker, ack)
            case AckTaking() as m:
                try:  # the ack first: a copy of its batch may be among the takes
                    self.acked(worker, m.ack())
                finally:  # answered even when the ack is refused (ProtocolError)
                    self.ledger.taking(identity, m.takes.tolist())
            case Holding(held=held):
                if self.stream is not None:   # (its dead processes' batches, before the
                    self.stream.held_by(worker, held.tolist())   # recovery can end)
                self.ledger.holding(worker, held.tolist())
            case Idle():
                self.ledger.idle()
            case _:
                self.unexpected(env, "ledger")

    def acked(self, worker: str, ack: Ack) -> None:
        if self.stream is not None and self.stream.dead_acked(ack.batch_id, ack.samples):
            self.ledger.count(worker, ack)   # a dead process's batch, trained by the worker
            self.pump()
            return
        if self.ledger.ack(worker, ack):
            if self.stream is not None:
                self.stream.acked(ack.batch_id, ack.preds)
            self.passes.maybe_drained()
            self.maybe_placement_drained()
            self.hold.maybe_drained()
            self.pump()

    # -- the clock -------------------------------------------------------------------------------
    def on_tick(self, now: float) -> None:
        # sooner than a heartbeat only while the statistics are being summarised: a wake-up
        # left set once they are (restored with a checkpoint, say) would make the loop spin
        self.wake_at = time.monotonic() \
            if self.loading.summarising() and self.loading.summarise(now) else None
        part = self.hold.poll()
        if part is not None:
            self.report(part)
        if self.ledger.store_acks(now):   # the ack log's copy moved on: room may be free
            self.pump()
        if self.wake_at is None and self.ledger.storing():
            self.wake_at = now + STORE_POLL_S
        if self.stream is not None:
            self.stream_tick(now)
        super().on_tick(now)

    def stream_tick(self, now: float) -> None:
        """A stream job: the statistics once its first events are in, then the events read
        into batches; the loop looks again in a few milliseconds."""
        assert self.stream is not None
        if self.stream.connecting():   # the broker's consumer opens off the loop
            done, failed = self.stream.opened()
            if failed is not None:
                self.fail(failed)
                return
            if not done:
                self.wake_at = now + CONNECT_POLL_S
                return
        if self.stream.reader_failed():
            self.fail("the stream's reader thread ended (its log says why)")
            return
        stats = self.stream.statistics_due(now) if self.passes.has_map() else None
        if stats is not None:   # after control's part map, as a file's statistics are
            self.to_control(stats)
        if not self.ledger.recovering():   # every worker has said what it holds
            self.stream.recovered(now)
        if self.stream.poll(now) or self.stream.ready(now):
            self.pump()
        if self.stream.drained():   # read on past the end for a dead process's messages
            self.pump()
            self.passes.maybe_pass_done()
        wake = self.stream.wake()
        if wake is not None:
            self.wake_at = wake if self.wake_at is None else min(self.wake_at, wake)

    def heartbeat(self, final: bool = False) -> None:
        """The heartbeat, then how far the training pass has got (control hands a lost
        feeder's parts on from there)."""
        super().heartbeat(final)
        self.to_control(self.tally.progress_report())

    def counters(self) -> dict[str, Any]:
        return {"epoch": self.passes.epoch, "batches_sent": self.batches_sent,
                "batches_resent": self.batches_resent, "keys_again": self.keys_again_sent,
                "samples_refused": self.samples_refused,
                **self.tally.counters(),
                "parts_begun_ahead": self.passes.begun_ahead, **self.loading.held_counters(),
                "in_flight": self.ledger.in_flight(), "paused": self.paused,
                **self.ledger.counters(),
                "placement_version": self.routing.keymap.version,
                "placement_window": self.routing.counter.window,
                "placing": self.routing.placing is not None,
                **self.ledger.restart_counters(),
                "bytes_read": self.loading.bytes_read(), **self.lists.counters(),
                "progress": self.loading.figures(time.monotonic()),
                **(self.stream.counters() if self.stream is not None else {})}

    def on_crash(self, exc: Exception) -> None:
        if isinstance(exc, DataError):
            self.to_control(Failure(reason=f"cannot read the data: {exc}"))
        else:
            super().on_crash(exc)

    def release(self) -> None:
        self.ledger.close()    # the ack log's files
        self.loading.close()   # the reader threads
        if self.stream is not None:
            self.stream.close()
        super().release()


def main() -> None:
    role_main(Feeder)


if __name__ == "__main__":
    main()
