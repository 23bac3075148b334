"""A feeder: reads its parts of the data, sends each batch's sparse keys to the shards that own
them and its dense features, labels and weights to the sample queue, and keeps the ledger of
batches in flight (``roles.algorithms.feeding.ledger.Ledger``). It reports each finished training
pass (and, in sync mode round, each drained round: ``roles.algorithms.sync.feeder``) and scores
each evaluation pass. What its acknowledged batches add up to is its tally
(``roles.algorithms.feeding.tally``).

The data is streamed (``roles.data``): feeder 0 indexes the files once (``roles.data.index``:
cached) and tells control (DataIndex); control gives every feeder its parts (PartMap). Each
feeder then summarises its training parts' dense columns from a bounded read
(``roles.data.stats``; PartStats), control merges them (DataStats), and every pass reads the
feeder's parts chunk by chunk through a shuffle buffer (``roles.data.stream``): its memory does
not grow with the data. Batch ids are (epoch, part, batch number), the same whichever feeder
reads a part. With every heartbeat it tells control how far each part's pass has got
(FeederProgress), so that a live feeder can take a lost one's part on from there (the
PartMap's ``resume``). With ``[train] batch_by_label`` every training batch holds samples of
one label.

Flow control: at most ``max_in_flight`` batches are unacknowledged at a time (see
``in_flight_limit``), and a batch is only built when the sample queue can take it (POLLOUT), so
the keys and the samples of a batch always leave together and no buffer grows without bound.

A worker asks to take the next batch it will run (Taken -> Grant): each batch is granted to one
worker, and only that worker's ack counts. In mode ``push`` (``[train] embeddings``) the grant
also tells every shard to send the batch's embeddings to that worker (Deliver): the worker
asks no shard for them. When control's membership loses a worker, its
batches and every batch not yet taken are sent again under the same id; at the end of a pass,
an idle worker gets second copies of batches still untaken elsewhere (see the Ledger).
A feeder killed and started again on its run resumes from its ack log and reclaims the batches
its dead process had sent (``roles.algorithms.feeding.reclaim``).

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

import numpy as np
import zmq

from roles.algorithms.feeding.ack_log import AckLog
from roles.algorithms.feeding.key_routing import KeyRouting
from roles.algorithms.feeding.ledger import Ledger, PartProgress
from roles.algorithms.feeding.parts import FeederParts
from roles.algorithms.feeding.passes import FeedingPass, PartStream
from roles.algorithms.feeding.reclaim import Reclaim
from roles.algorithms.feeding.tally import FeederTally
from roles.algorithms.shared.metrics import auc
from roles.algorithms.shared.progress import Every, Progress
from roles.algorithms.sync import feeder as sync_modes
from roles.checkpoint.feeder import FeederCheckpoints
from roles.checkpoint.files import read_manifest
from roles.data.index import DataError, Part
from roles.data.rejected import RejectedRows
from roles.data.source import DataSource
from roles.data.statistics_pass import StatisticsPass
from roles.data.stream import Preparer, Samples, Weighting
from roles.data.transforms import DenseTransform
from roles.feeder.streams import PartStreams
from roles.job.cli import role_main
from roles.job.settings import DECAY_UNITS, Job
from roles.model.files import TRANSFORM, ExportAnswers, write_json
from roles.protocol.checkpoint import Checkpoint, CheckpointDrained, Snapshotted
from roles.protocol.datapath import (
    Ack,
    DataIndex,
    DataStats,
    Deliver,
    Grant,
    Holding,
    Idle,
    PartMap,
    SampleBatch,
    Taken,
    max_in_flight,
    sample_batch_bytes,
)
from roles.protocol.lifecycle import EpochStart, Evaluate, Export, Membership, ShardBack
from roles.protocol.operator import FeedingPaused
from roles.protocol.placement import Placement
from zbus.codec import ProtocolError
from zbus.endpoints import node_index
from zbus.messages import Failure, Ready
from zbus.node import Node

log = logging.getLogger(__name__)
STATS_SLICE_S = 0.2   # the statistics pass works this long per turn of the loop
PROGRESS_LOG_S = 5.0  # data loading is logged this often


class Feeder(Node):
    role = "feeder"
    fatal_errors = (DataError,)  # a file damaged or gone, a wrong schema: the job stops

    def __init__(self, job: Job, index: int = 0):
        super().__init__(job.cluster, index, job.fingerprint())
        self.exports = ExportAnswers(self.export_part, self.report)
        self.job = job
        c, t = job.cluster, job.train
        self.samples = self.bind(zmq.PUSH, c.endpoint(c.feeder_endpoint_name("samples", index)),
                                 sndhwm=1,
                                 kernel_buffer=sample_batch_bytes(t.batch_size,
                                                                  len(job.dense_fields)))
        self.acks = self.bind(zmq.ROUTER, c.endpoint(c.feeder_endpoint_name("ledger", index)),
                              self.on_worker)
        self.ledger = Ledger(self.in_flight_limit(c.workers))
        self.shards = [self.connect(zmq.DEALER, c.endpoint(f"ps-{i}"), sndhwm=0)
                       for i in range(c.shards)]  # bounded by the ledger, never blocks
        self.sync = sync_modes.for_mode(job)
        self.tally = FeederTally()
        self.source: DataSource | None = None
        self.preparer: Preparer | None = None      # once control's DataStats are in
        self.transform: DenseTransform | None = None
        self.statistics: StatisticsPass | None = None  # this feeder's share of it
        self.streams: PartStreams | None = None
        self.plan: FeedingPass | None = None
        self.parts = FeederParts(index)             # control's assignment of the parts
        self.rejected_rows: RejectedRows | None = None
        self.shards_back: dict[int, int] = {}  # shard -> the restart generation acted on
        self.push = job.train.embeddings == "push"  # grants tell the shards (Deliver)
        self.members: set[str] = set()
        self.members_version = -1
        self.epoch = -1
        self.evaluated = -1
        self.eval_round = 0
        self.epoch_started = 0.0
        self.batches_sent = 0
        self.batches_resent = 0
        self.first_acked = False
        self.copies_wanted = 0  # second copies of untaken batches that idle workers could use
        self.repeated_takes = 0  # a worker's Taken for a batch granted to it already
        self.paused = False          # an operator paused feeding: no new batch goes out
        # a feeder killed and started again resumes from its ack log
        # (roles.algorithms.feeding.ack_log)
        self.ack_log: AckLog | None = None
        self.reclaim = Reclaim(self.ledger)
        self.rolled_back = False     # the whole job went back to a checkpoint: its log is it
        self.checkpoints: FeederCheckpoints | None = None
        self.checkpoint_hold = 0     # a checkpoint being cut: no new batch goes out
        self.checkpoint_drained = 0  # the newest cut reported drained
        self.routing = KeyRouting(c.shards, job.placement)
        self.loading: Progress | None = None   # indexing, then the statistics pass
        self.loading_log = Every(PROGRESS_LOG_S, 0.0)

    def in_flight_limit(self, workers: int) -> int:
        return max_in_flight(workers, self.job.train.prefetch)

    # -- start-up --------------------------------------------------------------------------
    def on_welcome(self) -> None:
        started = time.monotonic()
        feeders = Path(self.run_dir) / "feeders"
        self.rejected_rows = RejectedRows(Path(self.run_dir) / "rejected.tsv",
                                          feeders / f"{self.node_id}.rejected-parts")
        try:
            self.source = DataSource(self.job)
            self.statistics = StatisticsPass(self.source, self.job.data,
                                             len(self.job.dense_fields))
            self.streams = PartStreams(self.job, self.source, self.rejected_rows)
            if self.index == 0:   # the index keeper
                self.state = "indexing"
                files, parts, n_train = self.source.index(self.indexing())
                self.source.files = files
                oracle = self.source.oracle_scores(parts)
                self.report(DataIndex(n_train=n_train, oracle_auc=-1.0 if oracle is None
                                      else auc(*oracle), body=PartMap.body_of(
                                          DataSource.describe(files)),
                                      parts=np.array([p.as_list() for p in parts],
                                                     dtype=np.int64).reshape(-1, 7)))
                log.info("indexed %d file(s): %d rows in %d parts (%d training rows) in "
                         "%.1f s", len(files), sum(p.rows for p in parts), len(parts), n_train,
                         time.monotonic() - started)
        except (DataError, OSError) as exc:
            self.fail(f"cannot read the data: {exc}")
            return
        self.loading = None
        self.checkpoints = FeederCheckpoints(self.run_dir, self.node_id)
        info: dict = {"indexed": self.index == 0}
        if self.rollback and self.restore_dir:
            try:
                info.update(self.roll_back(Path(self.restore_dir), feeders))
            except (OSError, ValueError, KeyError) as exc:
                self.fail(f"cannot restore the checkpoint {self.restore_dir}: {exc}")
                return
        self.open_ack_log(feeders)
        self.state = "ready"
        self.to_control(Ready(info=info))

    def roll_back(self, where: Path, feeders: Path) -> dict:
        """The whole job goes back to a checkpoint: this feeder's ack log as it was there."""
        manifest = read_manifest(where)
        if manifest is None:
            raise ValueError("not a complete checkpoint")
        files = manifest["parts"].get(self.node_id, [])
        position, retrained = self.checkpoints.roll_back(files, feeders)
        if "sync_round" in position and isinstance(self.sync, sync_modes.RoundFeeding):
            self.sync.round = int(position["sync_round"])
        self.rolled_back = True
        log.warning("back to checkpoint %d: the %d samples acknowledged after it are trained "
                    "again", manifest["number"], retrained)
        return {"checkpoint": manifest["number"], "retrained_samples": retrained}

    def indexing(self):
        """Told of the bytes indexed (in the loop, which waits meanwhile): the progress goes
        to the log and, with the heartbeats still sent, to control."""
        started = time.monotonic()
        self.loading = progress = Progress("indexing the data", "bytes",
                                           self.source.data_bytes() or None, started)
        self.loading_log = Every(PROGRESS_LOG_S, started)

        def advance(count: int) -> None:
            now = time.monotonic()
            progress.update(progress.done + count, now)
            self.keep_alive(now)
            if self.loading_log.due(now):
                log.info("%s", progress.line(now))
        return advance

    def loading_progress(self, rows: int, now: float) -> None:
        """The statistics pass read ``rows`` more rows."""
        if self.loading is None:
            return
        self.loading.update(self.loading.done + rows, now)
        if self.loading_log.due(now):
            log.info("%s", self.loading.line(now))

    def open_ack_log(self, directory: Path) -> None:
        """Acknowledged training batches are logged; a log already there means this is a
        restart: the job-wide counts come back from it, and the ledger socket waits until the
        pass under way is rebuilt (the first EpochStart or Evaluate)."""
        self.ack_log = AckLog(directory, self.node_id)
        done = self.ack_log.restart()
        if done is None:
            return
        self.tally.restore(done)
        if self.rolled_back:  # nothing was in flight at the cut: no worker holds a batch
            return
        self.reclaim.restart()
        self.pause(self.acks, True)
        log.warning("restarted: %d acknowledged batches (%d samples) in the ack log, the last "
                    "of epoch %d; resuming from there", done["batches"], done["samples"],
                    done["last_epoch"])

    def pass_rebuilt(self) -> None:
        if self.reclaim.recovering:
            self.pause(self.acks, False)  # the workers' acks and Holding can be placed now

    def maybe_recovered(self) -> None:
        """Every live worker has sent what it holds of the dead process's batches: grant and
        send again (whatever nobody holds nor acknowledged goes out under its id)."""
        takes = self.reclaim.recovered(self.members if self.members_version >= 0 else None)
        if takes is None:
            return
        log.info("every worker has sent its acks and held batches: feeding resumes")
        for identity, batch_id in takes:
            self.grant(identity, batch_id)
        self.pump()

    # -- commands from control -------------------------------------------------------------
    def handle_command(self, env) -> None:
        match env.msg:
            case Export() as m:
                self.exports.handle(m)
            case Membership(version=v, workers=workers) if v > self.members_version:
                self.handle_membership(v, set(workers))
            case PartMap(version=v) as m if self.source is not None and (
                    self.parts.map is None or v > self.parts.map.version):
                self.take_parts(m)
            case DataStats() as m if self.preparer is None and self.parts.map is not None:
                self.take_stats(m)
            case EpochStart(epoch=e) if self.fed() and e > self.epoch:
                self.start_training(e)
            case Evaluate(epoch=e, round=r) if self.fed() and e > self.evaluated \
                    and e >= self.epoch:  # greater: restarted after its training pass
                self.start_evaluation(e, r)
            case Placement() as msg if self.routing.newer(msg):
                self.handle_placement(msg)
            case ShardBack(shard=i, generation=g) if g > self.shards_back.get(i, 0) \
                    and 0 <= i < len(self.shards):
                self.shards_back[i] = g
                count = self.resend_keys(i)
                log.warning("ps-%d restarted: the keys of %d batch(es) in flight sent again",
                            i, count)
            case Checkpoint() as m:
                self.handle_checkpoint(m)
            case FeedingPaused(paused=paused) if paused != self.paused:
                self.paused = paused
                log.info("feeding %s by an operator", "paused" if paused else "resumed")
                self.pump()
            case _:
                pass  # other commands, and repeats of ones already acted on

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

    # -- checkpoints ---------------------------------------------------------------------------
    def handle_checkpoint(self, m: Checkpoint) -> None:
        """Hold new batches from ``drain`` until ``resume`` (or ``abort``); at ``write``, take
        this feeder's part (``roles.checkpoint.feeder``)."""
        if m.phase in ("resume", "abort"):
            if self.checkpoint_hold and m.number >= self.checkpoint_hold:
                self.checkpoint_hold = 0
                self.pump()
            return
        if m.number <= self.checkpoints.written and m.phase == "write":
            return
        if m.number > max(self.checkpoint_drained, self.checkpoints.written):
            self.checkpoint_hold = m.number
        if m.phase == "drain":
            self.maybe_checkpoint_drained()
        elif m.phase == "write" and not self.ledger.in_flight:
            pause = self.checkpoints.begin(m.number, self.ack_log, self.position(),
                                           self.transform_json() if self.index == 0 else None)
            self.report(Snapshotted(number=m.number, pause_s=round(pause, 6), waited_s=0.0))

    def maybe_checkpoint_drained(self) -> None:
        if self.checkpoint_hold > self.checkpoint_drained and not self.ledger.in_flight:
            self.checkpoint_drained = self.checkpoint_hold
            self.report(CheckpointDrained(number=self.checkpoint_hold))

    def position(self) -> dict:
        where: dict = {"epoch": self.epoch}
        if isinstance(self.sync, sync_modes.RoundFeeding):
            where["sync_round"] = self.sync.round
        return where

    def transform_json(self) -> dict | None:
        t = self.transform
        return None if t is None else {"dense": self.job.dense_fields, "log1p": t.log1p,
                                       "mean": t.mean.tolist(), "std": t.std.tolist()}

    def maybe_placement_drained(self) -> None:
        """A new key map waits for this feeder: once nothing is in flight, say so."""
        drained = self.routing.drained(bool(self.ledger.in_flight))
        if drained is not None:
            self.report(drained)

    def export_part(self, where: Path) -> tuple[str, list[str]] | None:
        """The dense transform, so that the export scores raw rows as training saw them."""
        transform = self.transform_json()
        if transform is None:
            return None
        where.mkdir(parents=True, exist_ok=True)
        write_json(where / TRANSFORM, transform)
        return "transform", [TRANSFORM]

    def handle_membership(self, version: int, workers: set[str]) -> None:
        lost = self.members - workers
        self.members, self.members_version = workers, version
        self.ledger.max_in_flight = self.in_flight_limit(len(workers))
        if lost:
            count = self.ledger.requeue(lost)
            log.warning("lost %s: %d batch(es) go out again", ", ".join(sorted(lost)), count)
        self.maybe_recovered()
        self.pump()

    # -- parts and their statistics ------------------------------------------------------------
    def fed(self) -> bool:
        """Control has said which parts are this feeder's and how to transform them (a feeder
        given no part has nothing to feed)."""
        return self.preparer is not None and self.parts.map is not None

    def take_parts(self, m: PartMap) -> None:
        first = self.parts.map is None
        try:
            if first and self.source is not None and not self.source.synthetic:
                self.source.adopt(m.files())
        except DataError as exc:
            self.fail(str(exc))
            return
        new = self.parts.take(m)
        log.info("part map %d: this feeder reads part(s) %s", m.version,
                 self.parts.describe(self.parts.mine()))
        if self.preparer is None:  # the statistics are still being gathered: summarise
            training = [p for p in self.parts.parts if not p.eval]
            mine = [self.part(n) for n in self.parts.mine(eval=False)]
            self.statistics.want(mine, len(training))
            whole = self.job.data.decay_base > 1.0
            self.loading = Progress("statistics of the data", "rows", sum(
                p.rows if whole else min(p.rows, self.statistics.sample) for p in mine) or None,
                time.monotonic())
            self.loading_log = Every(PROGRESS_LOG_S, time.monotonic())
            self.wake_at = time.monotonic()
        elif new:
            self.take_over(new)

    def summarise(self, now: float) -> None:
        """The statistics pass, a slice of time per turn of the loop (heartbeats go on)."""
        self.state = "summarising"
        report = self.statistics.run(now + STATS_SLICE_S)
        if self.statistics.shown:
            self.rejected_rows.append(self.statistics.shown)
            self.statistics.shown = []
        if report is not None:
            self.to_control(report)
            self.loading_progress(int(report.counts[:, 0].sum()), time.monotonic())
        self.wake_at = time.monotonic() if self.statistics.pending else None

    def take_stats(self, m: DataStats) -> None:
        data = self.job.data
        self.transform = DenseTransform(log1p=m.log1p, mean=np.array(m.mean),
                                        std=np.array(m.std))
        unit = DECAY_UNITS[data.decay_unit]
        weighting = Weighting(data.decay_base, unit, data.drop_below, data.merge,
                              None if m.newest < 0 else m.newest // unit)
        self.preparer = Preparer(self.job.sparse_fields, self.transform, weighting)
        self.loading = None
        if self.statistics is not None:
            self.statistics.clear()
        self.state = "ready"
        log.info("statistics of the training data in: %d rows read, %d rejected",
                 m.rows_read, m.rejected)

    # -- passes ------------------------------------------------------------------------------
    def take_over(self, new: list[int]) -> None:
        """Parts of a lost feeder: feed what it had left of the pass under way (or of the
        pass just reported, which control still waits for), from where it had got to."""
        plan = self.plan
        training = [i for i in new if self.parts.handed_over(i) and not self.parts.parts[i].eval]
        scoring = [i for i in new if self.parts.scoring(i) and self.evaluated == self.epoch]
        log.warning("took over part(s) %s of a lost feeder", new)
        if plan is not None and not plan.eval and training:
            for i in training:
                plan.add(self.training_stream(i, self.epoch))
        elif plan is None and training and self.state == "waiting":
            self.begin_pass(FeedingPass(self.epoch, False), training)
        elif plan is not None and plan.eval and scoring:
            for i in scoring:
                plan.add(self.eval_stream(i))
        elif plan is None and scoring:
            self.plan = FeedingPass(self.epoch, True, [self.eval_stream(i) for i in scoring])
            self.state = "evaluating"
            self.tally.new_evaluation()
        self.pump()
        self.maybe_pass_done()

    def part(self, number: int) -> Part:
        return self.parts.parts[number]

    def training_stream(self, number: int, epoch: int,
                        logged: PartProgress | None = None) -> PartStream:
        """The part's batches for the epoch, resumed where this feeder's previous process had
        got to (``logged``, from its ack log) or a lost feeder had (PartMap)."""
        progress = logged or self.parts.resumed(number, epoch) or PartProgress(epoch)
        done = self.tally.part_planned(number, progress)
        if done is not None:
            log.info("part %d resumes epoch %d after %d acknowledged batches", number, epoch,
                     done)
        return self.streams.training(self.part(number), epoch, progress, self.preparer,
                                     self.tally.data, self.tally.batches.made)

    def eval_stream(self, number: int) -> PartStream:
        return self.streams.evaluation(self.part(number), self.preparer, self.tally.data)

    def start_training(self, epoch: int) -> None:
        self.epoch = epoch
        self.tally.new_epoch(epoch)
        self.ack_log.fold(before=epoch)  # earlier epochs were reported: their totals suffice
        # a new order of its parts every epoch; a restarted feeder: where its previous process
        # had got to in this pass
        parts = self.streams.order(self.parts.mine(eval=False), epoch)
        self.begin_pass(FeedingPass(epoch, False, open=self.job.data.parts_open), parts,
                        self.ack_log.progress(epoch)
                        if self.reclaim.restarted or self.rolled_back else {})

    def begin_pass(self, pass_: FeedingPass, parts: list[int],
                   logged: dict[int, PartProgress] | None = None) -> None:
        self.state = "training"
        self.tally.new_pass()
        self.epoch_started = time.monotonic()
        self.plan = pass_
        for n in parts:
            pass_.add(self.training_stream(n, pass_.epoch, (logged or {}).get(n)))
        log.info("epoch %d: training on %d part(s)", pass_.epoch, len(pass_.streams))
        self.pass_rebuilt()
        self.pump()
        self.maybe_pass_done()

    def start_evaluation(self, epoch: int, round_: int) -> None:
        self.epoch = epoch
        self.evaluated, self.eval_round, self.state = epoch, round_, "evaluating"
        self.tally.new_evaluation()
        self.plan = FeedingPass(epoch, True, [self.eval_stream(n)
                                              for n in self.parts.mine(eval=True)])
        self.pass_rebuilt()
        self.pump()
        self.maybe_pass_done()

    def maybe_pass_done(self) -> None:
        """A pass with no batch (no part) is over as soon as it starts."""
        if self.plan is not None and not self.ledger.in_flight and self.plan.exhausted():
            self.all_acked()

    # -- sending ---------------------------------------------------------------------------
    def on_writable(self, sock: zmq.Socket) -> None:
        self.pump()

    def at_tail(self) -> bool:
        """Every batch of the pass (or, in sync mode round, of the round) has been sent."""
        return self.plan is not None and (self.plan.exhausted() or (
            not self.plan.eval and self.sync.round_full()))

    def may_send_new(self) -> bool:
        # sync mode round: the next round's batches wait until this round is acknowledged
        return (self.plan is not None and not self.paused and self.routing.placing is None
                and not self.checkpoint_hold and not self.reclaim.recovering
                and not self.at_tail() and self.ledger.has_room())

    def pump(self) -> None:
        """Send batches again, then new ones (or, at the end of a pass or round, second copies
        of stragglers), while the queue takes them (POLLOUT)."""
        if not self.at_tail():
            self.copies_wanted = 0  # copies are for the end of a pass, when nothing is new
        if self.reclaim.recovering:  # restarted: not before every worker has answered
            self.want_writable(self.samples, False)
            return
        while self.samples.getsockopt(zmq.EVENTS) & zmq.POLLOUT:
            again = self.ledger.next_resend()
            if again is None and self.copies_wanted:
                again = self.ledger.straggler()
                self.copies_wanted = self.copies_wanted - 1 if again else 0
            if again is not None:
                batch_id, entry = again
                self.send_batch(batch_id, entry.batch, entry.eval, entry.round)
                self.batches_resent += 1
            elif self.may_send_new():
                taken = self.plan.take()
                if taken is None:
                    break
                batch_id, batch = taken
                round_ = self.sync.round_of(self.plan.eval)
                keys, owner = self.send_batch(batch_id, batch, self.plan.eval, round_)
                if not self.plan.eval and (counts := self.routing.count(
                        keys, owner, self.plan.exhausted())) is not None:
                    self.to_control(counts)
                self.ledger.sent(batch_id, batch, self.plan.eval, round_)
                self.batches_sent += 1
                self.sync.sent(self.plan.eval)
            else:
                break
        self.want_writable(self.samples, bool(self.ledger.resend) or self.may_send_new()
                           or bool(self.copies_wanted))

    def send_keys(self, batch_id: int, batch: Samples,
                  shards: range | list[int]) -> tuple[np.ndarray, np.ndarray]:
        keys, owner, messages = self.routing.batch_keys(batch_id, batch.keys, shards)
        for shard, msg in zip(shards, messages, strict=True):
            self.send(self.shards[shard], msg)
        return keys, owner

    def resend_keys(self, shard: int) -> int:
        """A restarted shard lost the keys of the batches in flight: send them again."""
        for batch_id, entry in self.ledger.in_flight.items():
            self.send_keys(batch_id, entry.batch, [shard])
        return len(self.ledger.in_flight)

    def send_batch(self, batch_id: int, batch: Samples, eval: bool,
                   round_: int) -> tuple[np.ndarray, np.ndarray]:
        """Send one batch: its keys to their shards, its samples to the queue."""
        keys, owner = self.send_keys(batch_id, batch, range(len(self.shards)))
        self.send(self.samples, SampleBatch(
            batch_id=batch_id, epoch=self.epoch, eval=eval,
            min_round=self.eval_round if eval else 0, round=round_, dense=batch.dense,
            labels=batch.labels, weights=batch.weights))
        return keys, owner

    # -- takes and acknowledgements --------------------------------------------------------
    def on_worker(self, identity: bytes | None, env) -> None:
        worker = identity.decode(errors="replace")
        match env.msg:
            case Taken(batch_id=b) if self.reclaim.recovering:
                self.reclaim.deferred_takes.append((identity, b))
            case Taken(batch_id=b):
                self.grant(identity, b)
            case Ack() as ack:
                self.handle_ack(worker, ack)
            case Holding(held=held):
                self.handle_holding(worker, held.tolist())
            case Idle():
                self.copies_wanted += self.job.train.prefetch + 1
                self.pump()
            case _:
                self.unexpected(env, "ledger")

    def grant(self, identity: bytes, batch_id: int) -> None:
        worker = identity.decode(errors="replace")
        if self.ledger.holder(batch_id) == worker:
            # its Taken again: after a restart one can come queued for the dead process and
            # once more after FeederBack; the first was answered, and a second grant could
            # run a later copy of the batch twice, a refusal drop the batch the ledger counts
            self.repeated_takes += 1
            return
        self.reclaim.taking(self.plan, batch_id)  # restarted: sent by its dead process?
        granted = self.ledger.take(batch_id, worker)
        self.send(self.acks, Grant(batch_id=batch_id, granted=granted), identity=identity)
        entry = self.ledger.peek(batch_id)
        if granted and self.push and entry is not None and node_index(worker) >= 0:
            deliver = Deliver(batch_id=batch_id, worker=node_index(worker), train=not entry.eval)
            for sock in self.shards:  # the shards send its rows to the worker, unasked
                self.send(sock, deliver)

    def handle_holding(self, worker: str, held: list[int]) -> None:
        """A worker's batches granted by the dead process: they stay that worker's."""
        self.reclaim.holding(self.plan, worker, held)
        if self.reclaim.recovering:
            self.maybe_recovered()

    def handle_ack(self, worker: str, ack: Ack) -> None:
        sent = self.ledger.peek(ack.batch_id)
        reclaimed = self.reclaim.reclaimable(self.plan, ack.batch_id) if sent is None else None
        sent = sent or reclaimed
        if sent is not None and (ack.samples != len(sent.batch)
                                 or (sent.eval and ack.preds.shape != (len(sent.batch),))):
            # rejected before the ledger forgets the batch: a bad ack must not lose it
            raise ProtocolError("inconsistent", f"ack of batch {ack.batch_id} does not match "
                                                f"the batch sent ({len(sent.batch)} samples)")
        if reclaimed is not None:  # acknowledged to the dead process, sent again by the worker
            self.reclaim.reclaim(self.plan, ack.batch_id, reclaimed, worker)
        entry = self.ledger.acked(ack.batch_id, worker)
        if entry is None:
            return  # not the holder's ack (a duplicate or a lost worker's), counted
        if entry.eval:
            self.tally.eval_acked(entry.batch.labels, ack.preds)
        else:
            self.ack_log.append(ack.batch_id, ack.samples, ack.loss_sum, ack.weight_sum,
                                max(0, node_index(worker)))
            self.tally.train_acked(worker, ack.batch_id, ack.samples, ack.loss_sum,
                                   ack.weight_sum)
            self.sync.acked(ack.samples)
            if not self.first_acked:
                self.first_acked = True
                log.info("first batch acknowledged: %.1f s after start",
                         time.monotonic() - self.started)
        if not self.ledger.in_flight and self.plan is not None:
            self.all_acked()
        self.maybe_placement_drained()
        self.maybe_checkpoint_drained()
        self.pump()

    def all_acked(self) -> None:
        """Nothing is in flight: a sync round, and maybe the whole pass, is done."""
        drained = self.sync.all_acked(self.plan.eval)
        if drained is not None:
            self.report(drained)
        if self.plan.exhausted():
            self.finish_pass()

    def finish_pass(self) -> None:
        plan, self.plan = self.plan, None
        if plan.eval:
            self.state = "ready"
            log.info("epoch %d eval: %d samples scored", plan.epoch, self.tally.scores.samples)
            self.report(self.tally.eval_report(plan))
        else:
            seconds = time.monotonic() - self.epoch_started
            log.info("epoch %d trained: %d samples in %.1f s", plan.epoch,
                     self.tally.epoch_samples, seconds)
            self.state = "waiting"
            self.report(self.tally.epoch_trained(plan, seconds))

    # -- the clock -------------------------------------------------------------------------------
    def on_tick(self, now: float) -> None:
        if self.statistics is not None and self.statistics.pending and self.preparer is None:
            self.summarise(now)
        part = self.checkpoints.poll() if self.checkpoints is not None else None
        if part is not None:
            self.report(part)
        super().on_tick(now)

    def heartbeat(self, final: bool = False) -> None:
        """The heartbeat, then how far the training pass has got (control hands a lost
        feeder's parts on from there)."""
        super().heartbeat(final)
        self.to_control(self.tally.progress_report())

    def counters(self) -> dict:
        ledger = self.ledger
        return {"epoch": self.epoch, "batches_sent": self.batches_sent,
                "batches_resent": self.batches_resent, **self.tally.counters(),
                "in_flight": len(ledger.in_flight), "paused": self.paused,
                "requeued_batches": ledger.requeued, "duplicate_acks": ledger.duplicate_acks,
                "refused_takes": ledger.refused_takes, "repeated_takes": self.repeated_takes,
                "straggler_copies": ledger.straggler_copies,
                "max_in_flight": ledger.max_in_flight,
                "placement_version": self.routing.keymap.version,
                "placement_window": self.routing.counter.window,
                "placing": self.routing.placing is not None,
                "restarted": self.reclaim.restarted, "recovering": self.reclaim.recovering,
                "bytes_read": self.source.bytes_read if self.source is not None else 0,
                "progress": None if self.loading is None
                else self.loading.figures(time.monotonic())}

    def on_crash(self, exc: Exception) -> None:
        if isinstance(exc, DataError):
            self.to_control(Failure(reason=f"cannot read the data: {exc}"))
        else:
            super().on_crash(exc)

    def close(self) -> None:
        if self.ack_log is not None:
            self.ack_log.close()
        if self.streams is not None:
            self.streams.close()
        super().close()


def main() -> None:
    role_main(Feeder)


if __name__ == "__main__":
    main()
