"""A feeder: reads the data, sends each batch's sparse keys to the shards that own them and
its dense features, labels and weights to the sample queue, and keeps the ledger of batches
in flight (``roles.algorithms.batching.Ledger``). It reports each finished training pass (and, in
sync mode round, each drained round) and scores each evaluation pass.

Slices (``[cluster] feeders``, ``roles.control.feeding``): every feeder loads the whole data
(the same split and dense transform everywhere), then feeds only the training and eval rows of
the slices control's SliceMap gives it (a feeder given no slice waits for one); batch ids carry
the slice. Its heartbeat says how far each slice's pass has got, so that a live feeder can take
a lost one's slice on from there (the SliceMap's ``resume``). With ``[train] batch_by_label``
every training batch holds samples of one label.

Flow control: at most ``window`` batches are unacknowledged at a time (see ``window_for``),
and a batch is only built when the sample queue can take it (POLLOUT), so the keys and the
samples of a batch always leave together and no buffer grows without bound.

A worker asks to take the next batch it will run (Taken -> Grant): each batch is granted to one
worker, and only that worker's ack counts. When control's membership loses a worker, its
batches and every batch not yet taken are sent again under the same id; at the end of a pass,
an idle worker gets second copies of batches still untaken elsewhere (see the Ledger).

Skew-aware placement (``[placement] mode = "skew"``): the feeder counts the keys of the batches
it sends per allocation window (a SpaceSaving summary of the heaviest, pairs per bucket and per
shard) and sends control the window's KeyCounts. When control publishes a new key map it stops
sending new batches, reports Drained once nothing is in flight, and routes by the new map when
control says it is active (the shards have handed their rows over).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from pathlib import Path

import numpy as np
import zmq

from roles.algorithms.ack_log import AckLog
from roles.algorithms.batching import (
    TAKEN,
    InFlight,
    Ledger,
    Pass,
    Plan,
    SliceProgress,
    max_in_flight,
    sample_batch_bytes,
)
from roles.algorithms.placement import HeavyHitters, KeyMap
from roles.data.dataset import Dataset, load_dataset
from roles.data.readers import DataError, Rejected
from roles.job.cli import role_main
from roles.job.rundir import atomic_write
from roles.job.settings import Job
from roles.model.files import TRANSFORM, ExportAnswers, write_json
from roles.protocol.datapath import (
    Ack,
    BatchKeys,
    Grant,
    Holding,
    Idle,
    SampleBatch,
    SliceMap,
    Taken,
    split_batch_id,
)
from roles.protocol.dense_sync import RoundDrained
from roles.protocol.lifecycle import (
    EpochStart,
    EpochTrained,
    EvalReport,
    Evaluate,
    Export,
    Membership,
    ShardBack,
)
from roles.protocol.operator import Feeding
from roles.protocol.placement import Drained, KeyCounts, Placement
from zbus.codec import ProtocolError
from zbus.endpoints import node_index
from zbus.messages import Ready
from zbus.node import Node

log = logging.getLogger(__name__)
COUNT_EVERY = 16  # batches whose keys are counted together (skew-aware placement)


def write_rejected(path: Path, rejected: list[Rejected]) -> None:
    """rejected.tsv: file, line number, reason and the row as read, one rejected row a line."""
    def clean(text: str) -> str:
        return text.replace("\t", "\\t").replace("\n", "\\n")

    lines = ["file\tline\treason\trow"]
    lines += [f"{clean(r.file)}\t{r.line}\t{clean(r.reason)}\t{clean(r.text)}" for r in rejected]
    atomic_write(path, ("\n".join(lines) + "\n").encode())


class Feeder(Node):
    role = "feeder"

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
        self.ledger = Ledger(self.window_for(c.workers))
        self.shards = [self.connect(zmq.DEALER, c.endpoint(f"ps-{i}"), sndhwm=0)
                       for i in range(c.shards)]  # bounded by the window, never blocks
        self.round_batches = c.workers * t.round_iterations if t.sync == "round" else 0
        self.data: Dataset | None = None
        self.owner: np.ndarray | None = None
        self.plan: Pass | None = None
        self.slices: SliceMap | None = None  # control's assignment of the data to feeders
        self.row_acks: np.ndarray | None = None  # per training row: acks in this epoch
        # how far the epoch's training pass has got per slice, for the heartbeat (a lost
        # feeder's slice is taken on from there)
        self.progress: dict[int, SliceProgress] = {}
        self.shards_back: dict[int, int] = {}  # shard -> the restart generation acted on
        self.members: set[str] = set()
        self.members_version = -1
        self.epoch = -1
        self.evaluated = -1
        self.eval_round = 0
        self.sync_round = 1          # sync mode round: the round being fed
        self.round_sent = 0
        self.round_samples = 0
        self.epoch_started = 0.0
        self.loss_sum = 0.0
        self.weight_sum = 0.0
        self.epoch_samples = 0
        self.preds: np.ndarray | None = None
        self.samples_acked = 0
        self.batches_sent = 0
        self.batches_resent = 0
        self.batches_acked = 0
        self.copies_wanted = 0  # second copies of untaken batches that idle workers could use
        self.acked_by: Counter[str] = Counter()
        self.train_loss_sum = 0.0    # over the whole job, for the console's loss curve
        self.train_weight_sum = 0.0
        self.paused = False          # an operator paused feeding: no new batch goes out
        # a feeder killed and started again resumes from its ack log (roles.algorithms.ack_log)
        self.ack_log: AckLog | None = None
        self.restarted = False
        self.recovering: set[str] | None = None  # restarted: the workers that sent Holding
        self.deferred_takes: list[tuple[bytes, int]] = []
        p = job.placement
        self.skew = p.mode == "skew"
        self.keymap = KeyMap.hashed(c.shards, p.buckets_per_shard)
        self.window = 0              # the allocation window being counted
        self.window_batches = 0
        self.placing: int | None = None   # a key map version waiting for the feeder to drain
        self.drained_for = -1
        self.new_window()

    def new_window(self) -> None:
        self.heavy = HeavyHitters(self.job.placement.heavy_keys)
        self.uncounted: list[np.ndarray] = []   # batches' keys not yet in the summary
        self.bucket_pairs = np.zeros(len(self.keymap.buckets), dtype=np.int64)
        self.shard_pairs = np.zeros(self.keymap.shards, dtype=np.int64)

    def window_for(self, workers: int) -> int:
        return max_in_flight(workers, self.job.train.prefetch)

    # -- start-up --------------------------------------------------------------------------
    def on_welcome(self) -> None:
        self.state = "loading"
        started = time.monotonic()
        try:
            self.data = load_dataset(self.job)
        except (DataError, OSError) as exc:
            self.fail(f"cannot load data: {exc}")
            return
        d = self.data
        self.owner = self.keymap.owner_of(d.keys).astype(np.uint8)
        if d.rejected:
            path = Path(self.run_dir) / "rejected.tsv"
            write_rejected(path, d.rejected)
            log.warning("%d of %d rows rejected; they are listed in %s", len(d.rejected),
                        d.rows_read, path)
        log.info("loaded %d rows (%d train, %d eval, %d rejected) in %.1f s", len(d.labels),
                 d.n_train, d.n_eval, len(d.rejected), time.monotonic() - started)
        self.open_ack_log()
        self.state = "ready"
        self.to_control(Ready(info={
            "samples_in_data": d.n_train, "eval_samples": d.n_eval, "rows_read": d.rows_read,
            "rejected_rows": len(d.rejected), "oracle_auc": d.oracle_auc,
            "dropped_rows": d.dropped_rows, "merged_rows": d.merged_rows,
            "fields": len(d.fields), "dense": int(d.dense.shape[1]),
        }))

    def open_ack_log(self) -> None:
        """Acknowledged training batches are logged; a log already there means this is a
        restart: the job-wide counts come back from it, and the ledger socket waits until the
        pass under way is rebuilt (the first EpochStart or Evaluate)."""
        self.ack_log = AckLog(Path(self.run_dir) / "feeders" / f"{self.node_id}.acks")
        records = self.ack_log.records
        if not len(records):
            return
        self.restarted, self.recovering = True, set()
        self.batches_acked = len(records)
        self.samples_acked = int(records["samples"].sum())
        self.train_loss_sum = float(records["loss_sum"].sum())
        self.train_weight_sum = float(records["weight_sum"].sum())
        self.acked_by.update(self.ack_log.samples_by_worker())
        self.pause(self.acks, True)
        log.warning("restarted: %d acknowledged batches (%d samples) in the ack log, the last "
                    "of epoch %d; resuming from there", len(records), self.samples_acked,
                    self.ack_log.last_epoch())

    def pass_rebuilt(self) -> None:
        if self.restarted and self.recovering is not None:
            self.pause(self.acks, False)  # the workers' acks and Holding can be placed now

    def maybe_recovered(self) -> None:
        """Every live worker has sent what it holds of the dead process's batches: grant and
        send again (whatever nobody holds nor acknowledged goes out under its id)."""
        if self.recovering is None or self.members_version < 0 \
                or not self.members <= self.recovering:
            return
        self.recovering = None
        log.info("every worker has sent its acks and held batches: feeding resumes")
        for identity, batch_id in self.deferred_takes:
            self.grant(identity, batch_id)
        self.deferred_takes.clear()
        self.pump()

    def adoptable(self, batch_id: int) -> InFlight | None:
        """A batch of the pass under way that this process has not sent, so its dead
        predecessor did; None when it is not of the pass or was sent (or acknowledged) here
        already."""
        found = self.plan.find(batch_id) if self.restarted and self.plan is not None else None
        if found is None or not found[0].unsent(found[1]):
            return None
        plan, number = found
        return InFlight(plan.batch_rows(number), plan.eval, 0)

    def adopt(self, batch_id: int, entry: InFlight) -> InFlight:
        """Take an adoptable batch out of the pass into the ledger: a worker has it."""
        plan, number = self.plan.find(batch_id)
        plan.claim(number)
        self.ledger.in_flight[batch_id] = entry
        return entry

    # -- commands from control -------------------------------------------------------------
    def handle_command(self, env) -> None:
        match env.msg:
            case Export() as m:
                self.exports.handle(m)
            case Membership(version=v, workers=workers) if v > self.members_version:
                self.handle_membership(v, set(workers))
            case SliceMap(version=v) as m if self.slices is None or v > self.slices.version:
                self.take_slices(m)
            case EpochStart(epoch=e) if self.fed() and e > self.epoch:
                self.start_training(e)
            case Evaluate(epoch=e, round=r) if self.fed() and e > self.evaluated \
                    and e >= self.epoch:  # greater: restarted after its training pass
                self.start_evaluation(e, r)
            case Placement(version=v) as msg if self.skew and v > self.keymap.version:
                self.handle_placement(msg)
            case ShardBack(shard=i, generation=g) if g > self.shards_back.get(i, 0) \
                    and 0 <= i < len(self.shards):
                self.shards_back[i] = g
                count = self.resend_keys(i)
                log.warning("ps-%d restarted: the keys of %d batch(es) in flight sent again",
                            i, count)
            case Feeding(paused=paused) if paused != self.paused:
                self.paused = paused
                log.info("feeding %s by an operator", "paused" if paused else "resumed")
                self.pump()
            case _:
                pass  # other commands, and repeats of ones already acted on

    # -- placement ---------------------------------------------------------------------------
    def handle_placement(self, msg: Placement) -> None:
        if msg.phase != "active":
            if self.placing != msg.version:
                log.info("placement %d: pausing until the shards have moved keys", msg.version)
            self.placing = msg.version
            self.maybe_drained()
            return
        self.keymap = KeyMap.from_message(msg, self.keymap.shards,
                                          self.job.placement.buckets_per_shard)
        if self.data is not None:
            self.owner = self.keymap.owner_of(self.data.keys).astype(np.uint8)
        self.placing = None
        log.info("placement %d active: %d keys placed off their bucket", msg.version,
                 len(msg.keys))
        self.pump()

    def maybe_drained(self) -> None:
        if self.placing is not None and not self.ledger.in_flight \
                and self.drained_for != self.placing:
            self.drained_for = self.placing
            self.report(Drained(version=self.placing))

    def count_keys(self, keys: np.ndarray, owner: np.ndarray) -> None:
        """Count a new training batch's keys into the window; close the window when full.
        Keys go into the summary COUNT_EVERY batches at a time (one np.unique over many
        batches costs far less than one per batch)."""
        self.uncounted.append(keys)
        if len(self.uncounted) >= COUNT_EVERY:
            self.heavy.add(np.concatenate(self.uncounted))
            self.uncounted.clear()
        self.bucket_pairs += np.bincount(self.keymap.bucket_of(keys),
                                         minlength=len(self.bucket_pairs))
        self.shard_pairs += np.bincount(owner, minlength=len(self.shard_pairs))
        self.window_batches += 1
        every = self.job.placement.window_batches
        if (every and self.window_batches >= every) or (not every and self.plan.exhausted()):
            self.close_window()

    def close_window(self) -> None:
        h = self.heavy
        if self.uncounted:
            h.add(np.concatenate(self.uncounted))
        self.to_control(KeyCounts(window=self.window, version=self.keymap.version, size=h.size,
                                  pairs=h.total, keys=h.keys, counts=h.counts, errors=h.errors,
                                  bucket_pairs=self.bucket_pairs, shard_pairs=self.shard_pairs))
        self.window += 1
        self.window_batches = 0
        self.new_window()

    def export_part(self, where: Path) -> tuple[str, list[str]] | None:
        """The dense transform, so that the export scores raw rows as training saw them."""
        if self.data is None:
            return None
        t = self.data.transform
        where.mkdir(parents=True, exist_ok=True)
        write_json(where / TRANSFORM, {"dense": self.job.dense_fields, "log1p": t.log1p,
                                       "mean": t.mean.tolist(), "std": t.std.tolist()})
        return "transform", [TRANSFORM]

    def handle_membership(self, version: int, workers: set[str]) -> None:
        lost = self.members - workers
        self.members, self.members_version = workers, version
        self.ledger.window = self.window_for(len(workers))
        if lost:
            count = self.ledger.requeue(lost)
            log.warning("lost %s: %d batch(es) go out again", ", ".join(sorted(lost)), count)
        self.maybe_recovered()
        self.pump()

    # -- slices -------------------------------------------------------------------------------
    def fed(self) -> bool:
        """The data is loaded and control has said which slices are this feeder's (a feeder
        given no slice waits for one; one given none of them has nothing to feed)."""
        return self.data is not None and self.slices is not None

    def take_slices(self, m: SliceMap) -> None:
        d = self.data
        if d is not None and (m.train[-1][1] != d.n_train or m.eval[-1][1] != d.n_eval):
            raise ProtocolError("inconsistent", f"slices of {m.train[-1][1]} training and "
                                                f"{m.eval[-1][1]} eval rows; this feeder "
                                                f"loaded {d.n_train} and {d.n_eval}")
        before = None if self.slices is None else self.my_slices()
        self.slices = m
        mine = self.my_slices()
        log.info("slice map %d: this feeder feeds slice(s) %s", m.version,
                 ", ".join(f"{i} (training rows {m.train[i][0]}..{m.train[i][1]}, eval rows "
                           f"{m.eval[i][0]}..{m.eval[i][1]})" for i in mine) or "none")
        new = [] if before is None else [i for i in mine if i not in before]
        if new and self.data is not None:
            self.take_over(new)

    def take_over(self, new: list[int]) -> None:
        """Slices of a lost feeder: feed what it had left of the pass under way (or of the
        pass just reported, which control still waits for), from where it had got to."""
        d, plan = self.data, self.plan
        training = [i for i in new if self.resumable(i, self.epoch)]
        scoring = [i for i in new if self.slices.resume.get(str(i), {}).get("phase")
                   == "evaluating" and self.evaluated == self.epoch]
        log.warning("took over slice(s) %s of a lost feeder", new)
        if plan is not None and not plan.eval and training:
            plan.plans += [self.training_plan(i, self.epoch) for i in training]
        elif plan is None and training and self.state == "waiting":
            self.begin_pass(Pass(self.epoch, False, []), training)
        elif plan is not None and plan.eval and scoring:
            plan.plans += [self.eval_plan(i, self.epoch) for i in scoring]
        elif plan is None and scoring:
            self.plan = Pass(self.epoch, True, [self.eval_plan(i, self.epoch)
                                                for i in scoring])
            self.state = "evaluating"
            self.preds = np.full(d.n_eval, np.nan, dtype=np.float32)
        self.pump()
        self.maybe_pass_drained()

    def resumable(self, slice_: int, epoch: int) -> bool:
        r = self.slices.resume.get(str(slice_))
        return isinstance(r, dict) and r.get("epoch") == epoch and not r.get("reported")

    def training_plan(self, slice_: int, epoch: int,
                      logged: SliceProgress | None = None) -> Plan:
        """The slice's plan for the epoch. It resumes where this feeder's previous process
        had got to (``logged``, from its ack log), or where a lost feeder had (SliceMap)."""
        d, t = self.data, self.job.train
        plan = Plan.training(epoch, slice_, np.arange(*self.slices.train[slice_]),
                             t.batch_size, t.shuffle, t.seed,
                             d.labels if t.batch_by_label else None)
        progress = self.progress[slice_] = logged or SliceProgress(epoch)
        if not progress.low and not progress.above and self.resumable(slice_, epoch):
            r = self.slices.resume[str(slice_)]
            progress.low, progress.above = r["low"], set(r["above"])
            progress.samples, progress.loss_sum, progress.weight_sum = (
                int(r["samples"]), float(r["loss_sum"]), float(r["weight_sum"]))
        if progress.low or progress.above:
            plan.resume(progress.low, sorted(progress.above))
            self.epoch_samples += progress.samples
            self.loss_sum += progress.loss_sum
            self.weight_sum += progress.weight_sum
            done = [i for i in range(plan.batches) if progress.done(i)]
            for i in done:
                self.row_acks[plan.batch_rows(i)] += 1
            log.info("slice %d resumes epoch %d after %d acknowledged batches", slice_, epoch,
                     len(done))
        return plan

    def eval_plan(self, slice_: int, epoch: int) -> Plan:
        return Plan.evaluation(epoch, slice_, self.data.n_train + np.arange(
            *self.slices.eval[slice_]), self.job.train.batch_size)

    def my_slices(self) -> list[int]:
        return [i for i, owner in enumerate(self.slices.owners) if owner == self.index]

    def start_training(self, epoch: int) -> None:
        self.epoch = epoch
        self.row_acks = np.zeros(self.data.n_train, dtype=np.uint16)
        self.progress = {}
        # a restarted feeder: where its previous process had got to in this pass
        self.begin_pass(Pass(epoch, False, []), self.my_slices(),
                        self.ack_log.progress(epoch) if self.restarted else {})

    def begin_pass(self, pass_: Pass, slices: list[int] = (),
                   logged: dict[int, SliceProgress] | None = None) -> None:
        self.state = "training"
        self.loss_sum = self.weight_sum = 0.0
        self.epoch_samples = 0
        self.epoch_started = time.monotonic()
        self.plan = pass_
        pass_.plans += [self.training_plan(i, pass_.epoch, (logged or {}).get(i))
                        for i in slices]
        log.info("epoch %d: %d training batches", pass_.epoch, pass_.batches)
        self.pass_rebuilt()
        self.pump()
        self.maybe_pass_drained()

    def start_evaluation(self, epoch: int, round_: int) -> None:
        d = self.data
        self.epoch = epoch
        self.evaluated, self.eval_round, self.state = epoch, round_, "evaluating"
        self.plan = Pass(epoch, True, [self.eval_plan(i, epoch) for i in self.my_slices()])
        self.preds = np.full(d.n_eval, np.nan, dtype=np.float32)
        self.pass_rebuilt()
        self.pump()
        self.maybe_pass_drained()

    def maybe_pass_drained(self) -> None:
        """A pass with no batch (no slice) is over as soon as it starts."""
        if self.plan is not None and not self.ledger.in_flight and self.plan.exhausted():
            self.pass_drained()

    # -- sending ---------------------------------------------------------------------------
    def on_writable(self, sock: zmq.Socket) -> None:
        self.pump()

    def at_tail(self) -> bool:
        """Every batch of the pass (or, in sync mode round, of the round) has been sent."""
        return self.plan is not None and (self.plan.exhausted() or (
            not self.plan.eval and bool(self.round_batches)
            and self.round_sent >= self.round_batches))

    def may_send_new(self) -> bool:
        # sync mode round: the next round's batches wait until this round is acknowledged
        return (self.plan is not None and not self.paused and self.placing is None
                and self.recovering is None and not self.at_tail()
                and self.ledger.has_room())

    def pump(self) -> None:
        """Send batches again, then new ones (or, at the end of a pass or round, second copies
        of stragglers), while the queue takes them (POLLOUT)."""
        if not self.at_tail():
            self.copies_wanted = 0  # copies are for the end of a pass, when nothing is new
        if self.recovering is not None:  # restarted: not before every worker has answered
            self.want_writable(self.samples, False)
            return
        while self.samples.getsockopt(zmq.EVENTS) & zmq.POLLOUT:
            again = self.ledger.next_resend()
            if again is None and self.copies_wanted:
                again = self.ledger.straggler()
                self.copies_wanted = self.copies_wanted - 1 if again else 0
            if again is not None:
                batch_id, entry = again
                self.send_batch(batch_id, entry.rows, entry.eval, entry.round)
                self.batches_resent += 1
            elif self.may_send_new():
                batch_id, rows = self.plan.take()
                round_ = 0 if self.plan.eval or not self.round_batches else self.sync_round
                keys, owner = self.send_batch(batch_id, rows, self.plan.eval, round_)
                if self.skew and not self.plan.eval:
                    self.count_keys(keys, owner)
                self.ledger.sent(batch_id, rows, self.plan.eval, round_)
                self.batches_sent += 1
                self.round_sent += not self.plan.eval
            else:
                break
        self.want_writable(self.samples, bool(self.ledger.resend) or self.may_send_new()
                           or bool(self.copies_wanted))

    def send_keys(self, batch_id: int, rows: np.ndarray,
                  shards: range | list[int]) -> tuple[np.ndarray, np.ndarray]:
        d = self.data
        keys = d.keys[rows].ravel()
        owner = self.owner[rows].ravel()
        for shard in shards:
            positions = np.flatnonzero(owner == shard).astype(np.int32)
            self.send(self.shards[shard], BatchKeys(
                batch_id=batch_id, window=self.window, samples=len(rows),
                fields=len(d.fields), positions=positions, keys=keys[positions]))
        return keys, owner

    def resend_keys(self, shard: int) -> int:
        """A restarted shard lost the keys of the batches in flight: send them again."""
        for batch_id, entry in self.ledger.in_flight.items():
            self.send_keys(batch_id, entry.rows, [shard])
        return len(self.ledger.in_flight)

    def send_batch(self, batch_id: int, rows: np.ndarray, eval: bool,
                   round_: int) -> tuple[np.ndarray, np.ndarray]:
        """Send one batch: its keys to their shards, its samples to the queue."""
        d = self.data
        keys, owner = self.send_keys(batch_id, rows, range(len(self.shards)))
        self.send(self.samples, SampleBatch(
            batch_id=batch_id, epoch=self.epoch, eval=eval,
            min_round=self.eval_round if eval else 0, round=round_, dense=d.dense[rows],
            labels=d.labels[rows], weights=d.weights[rows]))
        return keys, owner

    # -- takes and acknowledgements --------------------------------------------------------
    def on_worker(self, identity: bytes | None, env) -> None:
        worker = identity.decode(errors="replace")
        match env.msg:
            case Taken(batch_id=b) if self.recovering is not None:
                self.deferred_takes.append((identity, b))
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
        if batch_id not in self.ledger.in_flight:
            entry = self.adoptable(batch_id)  # a restarted feeder: sent by its dead process
            if entry is not None:
                self.adopt(batch_id, entry)
        self.send(self.acks, Grant(batch_id=batch_id,
                                   granted=self.ledger.take(batch_id, worker)),
                  identity=identity)

    def handle_holding(self, worker: str, held: list[int]) -> None:
        """A worker's batches granted by the dead process: they stay that worker's."""
        for batch_id in held:
            entry = self.ledger.peek(batch_id)
            if entry is None and (entry := self.adoptable(batch_id)) is not None:
                self.adopt(batch_id, entry)
            if entry is not None:
                entry.state, entry.worker = TAKEN, worker
        if self.recovering is not None:
            self.recovering.add(worker)
            self.maybe_recovered()

    def handle_ack(self, worker: str, ack: Ack) -> None:
        sent = self.ledger.peek(ack.batch_id)
        adopted = self.adoptable(ack.batch_id) if sent is None else None
        sent = sent or adopted
        if sent is not None and (ack.samples != len(sent.rows)
                                 or (sent.eval and ack.preds.shape != sent.rows.shape)):
            # rejected before the ledger forgets the batch: a bad ack must not lose it
            raise ProtocolError("inconsistent", f"ack of batch {ack.batch_id} does not match "
                                                f"the batch sent ({len(sent.rows)} samples)")
        if adopted is not None:  # acknowledged to the dead process, sent again by the worker
            self.adopt(ack.batch_id, adopted)
            adopted.state, adopted.worker = TAKEN, worker
        entry = self.ledger.acked(ack.batch_id, worker)
        if entry is None:
            return  # not the holder's ack (a duplicate or a lost worker's), counted
        self.batches_acked += 1
        if entry.eval:
            self.preds[entry.rows - self.data.n_train] = ack.preds
        else:
            self.ack_log.append(ack.batch_id, ack.samples, ack.loss_sum, ack.weight_sum,
                                max(0, node_index(worker)))
            self.loss_sum += ack.loss_sum
            self.weight_sum += ack.weight_sum
            self.train_loss_sum += ack.loss_sum
            self.train_weight_sum += ack.weight_sum
            self.epoch_samples += ack.samples
            self.samples_acked += ack.samples
            self.round_samples += ack.samples
            self.acked_by[worker] += ack.samples
            if self.row_acks is not None:
                self.row_acks[entry.rows] += 1
            _, slice_, seq = split_batch_id(ack.batch_id)
            progress = self.progress.get(slice_)
            if progress is not None:
                progress.acked(seq, ack.samples, ack.loss_sum, ack.weight_sum)
        if not self.ledger.in_flight and self.plan is not None:
            self.pass_drained()
        self.maybe_drained()
        self.pump()

    def pass_drained(self) -> None:
        """Nothing is in flight: a sync round, and maybe the whole pass, is done."""
        plan = self.plan
        if self.round_batches and not plan.eval and self.round_sent:
            self.report(RoundDrained(round=self.sync_round, samples=self.round_samples))
            self.sync_round += 1
            self.round_sent = self.round_samples = 0
        if plan.exhausted():
            self.finish_pass()

    def finish_pass(self) -> None:
        plan, d = self.plan, self.data
        self.plan = None
        if plan.eval:
            rows = plan.rows() - d.n_train
            self.state = "ready"
            log.info("epoch %d eval: %d samples scored", plan.epoch, len(rows))
            self.report(EvalReport(epoch=plan.epoch, slices=[p.slice for p in plan.plans],
                                       labels=d.labels[d.n_train + rows],
                                       preds=self.preds[rows]))
        else:
            seconds = time.monotonic() - self.epoch_started
            log.info("epoch %d trained: %d samples in %.1f s", plan.epoch, self.epoch_samples,
                     seconds)
            self.state = "waiting"
            counts = self.row_acks[plan.rows()]
            self.report(EpochTrained(
                epoch=plan.epoch, samples=self.epoch_samples, batches=plan.batches,
                loss_sum=self.loss_sum, weight_sum=self.weight_sum, seconds=seconds,
                slices=[p.slice for p in plan.plans], rows=len(counts),
                rows_once=int((counts == 1).sum()), rows_repeated=int((counts > 1).sum()),
                rows_missed=int((counts == 0).sum())))

    def counters(self) -> dict:
        ledger = self.ledger
        return {"epoch": self.epoch, "batches_sent": self.batches_sent,
                "batches_resent": self.batches_resent, "batches_acked": self.batches_acked,
                "samples_acked": self.samples_acked, "in_flight": len(ledger.in_flight),
                "epoch_samples": self.epoch_samples, "paused": self.paused,
                "train_loss_sum": self.train_loss_sum, "train_weight_sum": self.train_weight_sum,
                "requeued_batches": ledger.requeued, "duplicate_acks": ledger.duplicate_acks,
                "refused_takes": ledger.refused_takes, "acked_by": dict(self.acked_by),
                "straggler_copies": ledger.straggler_copies,
                "window": ledger.window, "placement_version": self.keymap.version,
                "placement_window": self.window, "placing": self.placing is not None,
                "slices": {str(s): p.as_dict() for s, p in self.progress.items()},
                "restarted": self.restarted, "recovering": self.recovering is not None}

    def close(self) -> None:
        if self.ack_log is not None:
            self.ack_log.close()
        super().close()


def main() -> None:
    role_main(Feeder)


if __name__ == "__main__":
    main()
