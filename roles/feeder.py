"""The feeder: reads the data, sends each batch's sparse keys to the shards that own them and
its dense features, labels and weights to the sample queue, and keeps the ledger of batches
in flight. It reports each finished training pass and scores each evaluation pass.

Flow control: at most ``window`` batches are unacknowledged at a time, and a batch is only
built when the sample queue can take it (POLLOUT), so the keys and the samples of a batch are
always sent together and the shards never hold keys of more than ``window`` batches.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from pathlib import Path

import numpy as np
import zmq

from roles.batching import Ledger, Plan
from roles.cli import role_main
from roles.data.dataset import Dataset, load_dataset
from roles.data.hashing import shard_of
from roles.data.readers import DataError, Rejected
from roles.job import Job
from roles.metrics import auc, logloss
from roles.rundir import atomic_write
from zbus.node import Node
from zbus.wire import (
    Ack,
    BatchKeys,
    EpochStart,
    EpochTrained,
    EvalReport,
    Evaluate,
    ProtocolError,
    Ready,
    SampleBatch,
)

log = logging.getLogger(__name__)


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
        self.job = job
        c = job.cluster
        self.window = c.workers * (job.train.prefetch + 2) + 2
        self.samples = self.bind(zmq.PUSH, c.endpoint("samples"), sndhwm=job.train.prefetch)
        self.acks = self.bind(zmq.ROUTER, c.endpoint("ledger"), self.on_ack)
        self.shards = [self.connect(zmq.DEALER, c.endpoint(f"ps-{i}"),
                                    sndhwm=4 * self.window) for i in range(c.shards)]
        self.data: Dataset | None = None
        self.owner: np.ndarray | None = None
        self.ledger = Ledger(self.window)
        self.plan: Plan | None = None
        self.epoch = -1
        self.evaluated = -1
        self.eval_round = 0
        self.epoch_started = 0.0
        self.loss_sum = 0.0
        self.weight_sum = 0.0
        self.epoch_samples = 0
        self.preds: np.ndarray | None = None
        self.samples_acked = 0
        self.batches_sent = 0
        self.batches_acked = 0
        self.acked_by: Counter[str] = Counter()

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
        self.owner = shard_of(d.keys, self.job.cluster.shards).astype(np.uint8)
        if d.rejected:
            path = Path(self.run_dir) / "rejected.tsv"
            write_rejected(path, d.rejected)
            log.warning("%d of %d rows rejected; they are listed in %s", len(d.rejected),
                        d.rows_read, path)
        log.info("loaded %d rows (%d train, %d eval, %d rejected) in %.1f s", len(d.labels),
                 d.n_train, d.n_eval, len(d.rejected), time.monotonic() - started)
        self.state = "ready"
        self.to_control(Ready(info={
            "samples_in_data": d.n_train, "eval_samples": d.n_eval, "rows_read": d.rows_read,
            "rejected_rows": len(d.rejected), "oracle_auc": d.oracle_auc,
            "fields": len(d.fields), "dense": int(d.dense.shape[1]),
        }))

    # -- commands from control -------------------------------------------------------------
    def handle_command(self, env) -> None:
        match env.msg:
            case EpochStart(epoch=e) if self.data is not None and e > self.epoch:
                self.start_training(e)
            case Evaluate(epoch=e, round=r) if self.data is not None and e > self.evaluated \
                    and e == self.epoch:
                self.start_evaluation(e, r)
            case _:
                pass  # other commands, and repeats of ones already acted on

    def start_training(self, epoch: int) -> None:
        d = self.data
        self.epoch, self.state = epoch, "training"
        self.plan = Plan.training(epoch, self.index, d.n_train, self.job.train.batch_size,
                                  self.job.train.shuffle, self.job.train.seed)
        self.loss_sum = self.weight_sum = 0.0
        self.epoch_samples = 0
        self.epoch_started = time.monotonic()
        log.info("epoch %d: %d training batches", epoch, self.plan.batches)
        self.pump()

    def start_evaluation(self, epoch: int, round_: int) -> None:
        d = self.data
        self.evaluated, self.eval_round, self.state = epoch, round_, "evaluating"
        self.plan = Plan.evaluation(epoch, self.index, d.n_train, len(d.labels),
                                    self.job.train.batch_size)
        self.preds = np.full(d.n_eval, np.nan, dtype=np.float32)
        self.pump()

    # -- sending ---------------------------------------------------------------------------
    def on_writable(self, sock: zmq.Socket) -> None:
        self.pump()

    def pump(self) -> None:
        """Send batches while the plan has some, the window has room and the queue takes them."""
        while (self.plan is not None and not self.plan.exhausted() and self.ledger.has_room()
               and self.samples.getsockopt(zmq.EVENTS) & zmq.POLLOUT):
            self.send_batch(*self.plan.take())
        self.want_writable(self.samples, self.plan is not None and not self.plan.exhausted()
                           and self.ledger.has_room())

    def send_batch(self, batch_id: int, rows: np.ndarray) -> None:
        d, plan = self.data, self.plan
        keys = d.keys[rows].ravel()
        owner = self.owner[rows].ravel()
        for shard, sock in enumerate(self.shards):
            positions = np.flatnonzero(owner == shard).astype(np.int32)
            self.send(sock, BatchKeys(batch_id=batch_id, samples=len(rows),
                                      fields=len(d.fields), positions=positions,
                                      keys=keys[positions]))
        self.send(self.samples, SampleBatch(
            batch_id=batch_id, epoch=plan.epoch, eval=plan.eval,
            min_round=self.eval_round if plan.eval else 0, dense=d.dense[rows],
            labels=d.labels[rows], weights=np.ones(len(rows), dtype=np.float32)))
        self.ledger.sent(batch_id, rows, plan.eval)
        self.batches_sent += 1

    # -- acknowledgements ------------------------------------------------------------------
    def on_ack(self, identity: bytes | None, env) -> None:
        match env.msg:
            case Ack() as ack:
                self.handle_ack(identity.decode(errors="replace"), ack)
            case _:
                self.unexpected(env, "ledger")

    def handle_ack(self, worker: str, ack: Ack) -> None:
        sent = self.ledger.peek(ack.batch_id)
        if sent is not None and (ack.samples != len(sent.rows)
                                 or (sent.eval and ack.preds.shape != sent.rows.shape)):
            # rejected before the ledger forgets the batch: a bad ack must not lose it
            raise ProtocolError("inconsistent", f"ack of batch {ack.batch_id} does not match "
                                                f"the batch sent ({len(sent.rows)} samples)")
        entry = self.ledger.acked(ack.batch_id)
        if entry is None:
            return  # not in flight: a duplicate, counted by the ledger
        self.batches_acked += 1
        if entry.eval:
            self.preds[entry.rows - self.data.n_train] = ack.preds
        else:
            self.loss_sum += ack.loss_sum
            self.weight_sum += ack.weight_sum
            self.epoch_samples += ack.samples
            self.samples_acked += ack.samples
            self.acked_by[worker] += ack.samples
        self.pump()
        if self.plan is not None and self.plan.exhausted() and not self.ledger.in_flight:
            self.finish_pass()

    def finish_pass(self) -> None:
        plan, d = self.plan, self.data
        self.plan = None
        if plan.eval:
            labels = d.labels[d.n_train:]
            result = EvalReport(epoch=plan.epoch, auc=auc(labels, self.preds),
                                logloss=logloss(labels, self.preds), samples=len(labels))
            log.info("epoch %d eval: auc %.4f logloss %.4f", plan.epoch, result.auc,
                     result.logloss)
            self.state = "ready"
            self.to_control(result)
        else:
            seconds = time.monotonic() - self.epoch_started
            log.info("epoch %d trained: %d samples in %.1f s", plan.epoch, self.epoch_samples,
                     seconds)
            self.state = "waiting"
            self.to_control(EpochTrained(epoch=plan.epoch, samples=self.epoch_samples,
                                         batches=plan.batches, loss_sum=self.loss_sum,
                                         weight_sum=self.weight_sum, seconds=seconds))

    def counters(self) -> dict:
        return {"epoch": self.epoch, "batches_sent": self.batches_sent,
                "batches_acked": self.batches_acked,
                "samples_acked": self.samples_acked, "in_flight": len(self.ledger.in_flight),
                "duplicate_acks": self.ledger.duplicate_acks, "acked_by": dict(self.acked_by),
                "window": self.window}


def main() -> None:
    role_main(Feeder)


if __name__ == "__main__":
    main()
