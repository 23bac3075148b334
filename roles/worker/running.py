"""A worker's batches, run one at a time: trained (forward, backward, the sync mode's step) or
scored, on the worker's own network or over the model-parallel group it leads, then their
results sent (each shard its gradient rows, the ack to the batch's feeder).

A batch's arithmetic is ``roles.model.compute``. Over a group the batch is a task of the
group's (``roles.worker.group_link``): its forward and backward wait for the members through
the worker's loop, and the next batch starts once it is done. In mode step the batch ends with
the aggregator's answer to its gradient (``awaiting_step``). ``--slowdown N`` (a test and demo
aid) holds a finished batch's results back for (N - 1) x the time it took (``parked``), idling
rather than burning CPU, like a slower machine.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from roles.algorithms.worker.pulled import PulledBatch
from roles.job.settings import Job
from roles.model.compute import BatchCompute
from roles.model.network import bf16_is_native, logit_shift, task_weights
from roles.model.networks import device_error
from roles.protocol.datapath import Ack, SampleBatch
from roles.protocol.dense_sync import StepGrad, Weights
from roles.worker.dense import DenseSide
from roles.worker.group_link import GroupLink, Wait
from roles.worker.shards import ShardSide
from zbus.codec import Message, ProtocolError

log = logging.getLogger(__name__)


@dataclass
class Done:
    """A batch run: what it sends (now, or after its slowdown)."""
    batch: PulledBatch
    loss: float
    weight_sum: float
    grads: list[np.ndarray] | None = None   # training: each shard's gradient rows
    step: StepGrad | None = None            # mode step: the gradient the aggregator answers
    probs: np.ndarray | None = None         # evaluation: the scores
    train_probs: np.ndarray | None = None   # training, a stream job's: scores before the step


class Runner:
    def __init__(self, job: Job, name: str, network: torch.nn.Module, device: torch.device,
                 slowdown: float, dense: DenseSide, shards: ShardSide, group: GroupLink | None,
                 ack: Callable[[Ack], None], to_control: Callable[[Message], None],
                 set_state: Callable[[str], None], wake: Callable[[float], None],
                 advance: Callable[[], None]):
        t = job.train
        self.job, self.network, self.device = job, network, device
        self.dense, self.shards, self.group = dense, shards, group
        self.ack, self.to_control, self.set_state = ack, to_control, set_state
        self.wake, self.advance = wake, advance
        self.n_dense = len(job.dense_fields)
        self.slowdown = max(1.0, slowdown)
        self.compute = BatchCompute(job.layout(), device, t.precision,
                                    score_training=job.streaming,
                                    task_weights=task_weights(job),
                                    logit_shift=logit_shift(job))
        if t.precision == "bf16" and not bf16_is_native(device):
            log.warning("%s: [train] precision = \"bf16\" but %s has no bfloat16 arithmetic: "
                        "autocast emulates it, slower than fp32", name, device)
        self.parked: Done | None = None
        self.parked_until = 0.0
        self.awaiting_step: Done | None = None
        self.step_sent_at = 0.0
        self.counts = {"samples_trained": 0, "batches_trained": 0, "eval_samples": 0,
                       "batches_scored": 0, "compute_s": 0.0, "step_wait_s": 0.0}

    def check(self, s: SampleBatch) -> None:
        """A batch pulled fits the network (refused as the codec refused it before)."""
        s.require_finite()
        if s.dense.shape[1] != self.n_dense:
            raise ProtocolError("bad_shape", f"batch with {s.dense.shape[1]} dense "
                                             f"features, model has {self.n_dense}")
        if s.tasks != len(self.job.tasks):
            raise ProtocolError("bad_shape", f"batch with {s.tasks} label(s) a sample, the job "
                                             f"has {len(self.job.tasks)}")
        wrong = self.compute.sparse.check_lengths(s.lengths)
        if wrong is not None:
            raise ProtocolError("bad_shape", f"batch {s.batch_id}: {wrong}")

    def warm_up(self) -> None:
        """torch's first calls made before the first batch (``BatchCompute.warm_up``)."""
        try:
            self.compute.warm_up(self.network, self.job.train.batch_size, self.n_dense)
        except Exception as exc:   # it ran on the CPU at build: not on this device
            raise device_error(self.job, exc, self.device) from exc

    # -- what holds it ---------------------------------------------------------------------------
    def grouped(self) -> bool:
        """It runs its batches over its group (the plan is here)."""
        return self.group is not None and self.group.leader is not None

    def running(self) -> bool:
        """A task of the group's is under way (a batch, or the weights)."""
        return self.group is not None and self.group.busy()

    def holds(self) -> str | None:
        """What a finished batch waits for: the aggregator's answer, or its slowdown."""
        return "step" if self.awaiting_step else "slowdown" if self.parked else None

    def free(self) -> bool:
        """The next batch may start."""
        return self.awaiting_step is None and self.parked is None and not self.running()

    # -- a batch ---------------------------------------------------------------------------------
    def run(self, batch: PulledBatch) -> None:
        started = time.monotonic()
        if self.group is not None and self.grouped():
            self.group.run(self.over_group(self.group, batch, started))
        elif batch.sample.eval:
            self.scored(batch, self.compute.score(self.network, batch), started)
        else:
            self.trained(batch, *self.compute.train(self.network, batch), started)

    def over_group(self, group: GroupLink, batch: PulledBatch, started: float) -> Iterator[Wait]:
        """A task of the group's: the batch's forward (and backward) over the group."""
        train = not batch.sample.eval
        b = self.compute.group_batch(batch, train)
        logits = yield from group.forward(b.inputs, train)
        if train:
            yield from group.backward(self.compute.group_loss(b, logits))
            self.trained(batch, *self.compute.group_result(b), None, started)
        else:
            self.scored(batch, self.compute.group_scores(logits), started)
        self.advance()

    def trained(self, batch: PulledBatch, loss: float, weight_sum: float,
                grads: list[np.ndarray], probs: np.ndarray | None, started: float) -> None:
        step = self.dense.sync.after_backward(self.dense.replica, weight_sum)
        self.release(Done(batch, loss, weight_sum, grads=grads, step=step,
                          train_probs=None if probs is None
                          else probs.astype(np.float32).reshape(-1)),
                     time.monotonic() - started)

    def scored(self, batch: PulledBatch, probs: np.ndarray, started: float) -> None:
        self.counts["eval_samples"] += len(batch.sample.weights)
        self.counts["batches_scored"] += 1
        self.set_state("evaluating")
        self.release(Done(batch, 0.0, 0.0, probs=probs.astype(np.float32).reshape(-1)),
                     time.monotonic() - started)

    def release(self, done: Done, took: float) -> None:
        """Send a finished batch's messages, now or, slowed down, after (slowdown - 1) x took."""
        self.counts["compute_s"] += took
        if self.slowdown > 1:
            self.parked = done
            self.parked_until = time.monotonic() + (self.slowdown - 1) * took
            self.wake(self.parked_until)
            return
        self.deliver(done)

    def unpark(self, now: float) -> bool:
        """The batch held back, sent once its time is up: False while it is not."""
        if self.parked is None or now < self.parked_until:
            return False
        done, self.parked = self.parked, None
        self.deliver(done)
        return True

    def deliver(self, done: Done) -> None:
        if done.grads is not None:
            self.shards.send_grads(done.batch.batch_id, done.grads)
        if done.step is not None:  # the aggregator's answer ends the batch
            self.dense.send_step(done.step)
            self.awaiting_step = done
            self.step_sent_at = time.monotonic()
        elif done.probs is None:
            self.finish(done)
        else:
            s = done.batch.sample
            self.ack(Ack(batch_id=s.batch_id, samples=len(s.weights), loss_sum=0.0,
                         weight_sum=0.0, preds=done.probs))

    def finish_step(self, w: Weights) -> None:
        """Mode step: the aggregator's answer, the new weights, ends the batch."""
        if self.awaiting_step is None or w.params.shape != (self.dense.replica.size,):
            raise ProtocolError("bad_shape", "step weights that do not fit")
        done, self.awaiting_step = self.awaiting_step, None
        self.counts["step_wait_s"] += time.monotonic() - self.step_sent_at
        self.dense.replica.replace(w.params)
        self.finish(done)

    def finish(self, done: Done) -> None:
        """A training batch is over: its ack, the replica's count, the mode's report."""
        n = len(done.batch.sample.weights)
        self.ack(Ack(batch_id=done.batch.sample.batch_id, samples=n, loss_sum=done.loss,
                     weight_sum=done.weight_sum,
                     preds=np.zeros(0, dtype=np.float32) if done.train_probs is None
                     else done.train_probs))
        self.counts["samples_trained"] += n
        self.counts["batches_trained"] += 1
        self.dense.replica.trained(n, done.weight_sum)
        self.set_state("training")
        report = self.dense.sync.trained(self.dense.replica)
        if report is not None:
            self.to_control(report)

    def counters(self) -> dict:
        return {**self.counts, "slowdown": self.slowdown, "device": str(self.device)}
