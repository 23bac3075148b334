"""Batch plans and the feeder's ledger (pure; no sockets). Batch ids are laid out in
``roles.protocol.datapath``."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from roles.protocol.datapath import EVAL_SEQ, make_batch_id, split_batch_id


def sample_batch_bytes(batch_size: int, dense: int) -> int:
    """About the size of one SampleBatch on the wire: the sample queue's kernel buffers are
    sized to it, so that a worker cannot hold more than a batch or two it has not pulled."""
    return batch_size * (dense + 2) * 4 + 1024


def max_in_flight(workers: int, prefetch: int) -> int:
    """A feeder's bound on the batches unacknowledged at a time. Per worker, its prefetch and the
    one it trains, as many again that a slow worker may hold in socket buffers, and some in
    transit. It also bounds the acks a dead feeder can have lost in transit, so a worker
    keeps that many of its latest acks per feeder to send a restarted one again."""
    return max(1, workers) * (2 * prefetch + 6) + 2


def slice_ranges(rows: int, parts: int) -> list[list[int]]:
    """``parts`` contiguous [lo, hi) ranges covering 0..rows, sizes differing by one at most."""
    edges = [rows * i // parts for i in range(parts + 1)]
    return [[edges[i], edges[i + 1]] for i in range(parts)]


def interleave_by_label(rows: np.ndarray, labels: np.ndarray,
                        batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """``rows`` reordered so that every batch holds samples of one label, and where each batch
    starts: the rows of each label are cut into batches (in their given order) and the batches
    of the labels are interleaved evenly, each label's batches spread over the pass in
    proportion to its share (a label's last batch may be short)."""
    chunks: list[np.ndarray] = []
    keys: list[float] = []
    for value in np.unique(labels[rows]):
        mine = rows[labels[rows] == value]
        n = -(-len(mine) // batch_size)
        chunks += [mine[i * batch_size:(i + 1) * batch_size] for i in range(n)]
        keys += [(i + 0.5) / n for i in range(n)]
    if not chunks:
        return rows, np.zeros(1, dtype=np.int64)
    order = np.argsort(np.asarray(keys), kind="stable")
    sizes = np.array([len(chunks[i]) for i in order])
    return (np.concatenate([chunks[i] for i in order]),
            np.concatenate([[0], np.cumsum(sizes)]))


def even_starts(rows: int, batch_size: int) -> np.ndarray:
    return np.append(np.arange(0, rows, batch_size), rows)


@dataclass
class Plan:
    """The batches of one pass over a slice: training rows shuffled per epoch, or eval rows in
    order. Batch boundaries are explicit (``starts``), so that label-grouped batches can be
    shorter than ``batch_size`` at a label's end."""

    epoch: int
    slice: int
    eval: bool
    rows: np.ndarray
    starts: np.ndarray        # where each batch begins in rows (plus len(rows) at the end)
    first_seq: int = 0
    next: int = 0
    skip: set[int] = field(default_factory=set)  # batches done before (a resumed pass)

    @classmethod
    def training(cls, epoch: int, slice_: int, rows: np.ndarray, batch_size: int,
                 shuffle: bool, seed: int, labels: np.ndarray | None = None) -> Plan:
        """``labels`` given: label-grouped batches (``[train] batch_by_label``)."""
        rows = np.array(rows)
        if shuffle:
            np.random.default_rng((seed * 1000 + epoch) * 256 + slice_).shuffle(rows)
        if labels is None:
            starts = even_starts(len(rows), batch_size)
        else:
            rows, starts = interleave_by_label(rows, labels, batch_size)
        return cls(epoch, slice_, False, rows, starts)

    @classmethod
    def evaluation(cls, epoch: int, slice_: int, rows: np.ndarray, batch_size: int) -> Plan:
        rows = np.asarray(rows)
        return cls(epoch, slice_, True, rows, even_starts(len(rows), batch_size), EVAL_SEQ)

    @property
    def batches(self) -> int:
        return max(0, len(self.starts) - 1)

    def resume(self, low: int, above: list[int]) -> None:
        """Skip the batches a lost feeder had acknowledged: every one below ``low`` and those
        in ``above`` (batch numbers within the pass)."""
        self.next = max(self.next, low)
        self.skip = set(above)

    def batch_rows(self, i: int) -> np.ndarray:
        return self.rows[self.starts[i]:self.starts[i + 1]]

    def number_of(self, batch_id: int) -> int | None:
        """The batch's number within this plan, or None when it is not one of its batches."""
        epoch, slice_, seq = split_batch_id(batch_id)
        number = seq - self.first_seq
        if epoch != self.epoch or slice_ != self.slice or not 0 <= number < self.batches:
            return None
        return number

    def unsent(self, number: int) -> bool:
        return number >= self.next and number not in self.skip

    def claim(self, number: int) -> None:
        """Mark a batch as sent elsewhere (by this feeder's previous process)."""
        self.skip.add(number)

    def exhausted(self) -> bool:
        while self.next in self.skip:
            self.next += 1
        return self.next >= self.batches

    def take(self) -> tuple[int, np.ndarray]:
        """The next batch: its id and its rows."""
        self.exhausted()  # past skipped batches
        i = self.next
        self.next += 1
        return make_batch_id(self.epoch, self.slice, self.first_seq + i), self.batch_rows(i)


SENT, TAKEN, QUEUED = "sent", "taken", "queued"


@dataclass
class InFlight:
    rows: np.ndarray
    eval: bool
    round: int
    state: str = SENT        # sent (not taken yet), taken, queued (to be sent again)
    worker: str = ""         # who took it last; kept when queued again
    sends: int = 1


@dataclass
class Ledger:
    """Every batch sent and not yet acknowledged (at most ``max_in_flight``), who holds it, and
    the batches to send again.

    A batch is granted to one worker only (``take``) and only that worker's ack counts. When
    workers are lost (dead or gone), their batches are queued to be sent again under the same
    id, and so is every batch sent but not yet taken, since it may have been sitting in a lost
    worker's socket buffer; if the first copy turns up at a live worker after all, that worker
    gets the batch and the second copy is refused, so no batch is trained twice. A worker
    declared lost whose ack arrives late still has it counted, unless another worker took the
    batch meanwhile.

    Stragglers: at the end of a pass (or of a sync round) the feeder has nothing new to send,
    while batches may sit untaken in a slow worker's socket buffers. When a worker reports it is
    idle, the oldest batches sent once and not taken get a second copy; whichever copy is taken
    first is trained, the other refused.
    """

    max_in_flight: int
    in_flight: dict[int, InFlight] = field(default_factory=dict)
    resend: deque[int] = field(default_factory=deque)
    duplicate_acks: int = 0
    refused_takes: int = 0
    requeued: int = 0
    straggler_copies: int = 0

    def has_room(self) -> bool:
        return len(self.in_flight) < self.max_in_flight

    def sent(self, batch_id: int, rows: np.ndarray, eval: bool, round_: int = 0) -> None:
        self.in_flight[batch_id] = InFlight(rows, eval, round_)

    def peek(self, batch_id: int) -> InFlight | None:
        return self.in_flight.get(batch_id)

    def take(self, batch_id: int, worker: str) -> bool:
        """Grant the batch to ``worker`` unless another worker holds it (or it is done)."""
        entry = self.in_flight.get(batch_id)
        if entry is None or entry.state == TAKEN:
            self.refused_takes += 1
            return False
        entry.state, entry.worker = TAKEN, worker
        return True

    def acked(self, batch_id: int, worker: str) -> InFlight | None:
        """The batch's record, or None (counted) for an ack that is not the holder's."""
        entry = self.in_flight.get(batch_id)
        if entry is None or not entry.worker or entry.worker != worker:
            self.duplicate_acks += 1
            return None
        return self.in_flight.pop(batch_id)

    def requeue(self, lost: set[str]) -> int:
        """Queue again the batches of lost workers and every batch not yet taken."""
        count = 0
        for batch_id, entry in self.in_flight.items():
            if entry.state == SENT or (entry.state == TAKEN and entry.worker in lost):
                entry.state = QUEUED
                self.resend.append(batch_id)
                count += 1
        self.requeued += count
        return count

    def next_resend(self) -> tuple[int, InFlight] | None:
        """The next batch to send again (marked sent), or None."""
        while self.resend:
            batch_id = self.resend.popleft()
            entry = self.in_flight.get(batch_id)
            if entry is not None and entry.state == QUEUED:  # else taken or acked meanwhile
                entry.state = SENT
                entry.sends += 1
                return batch_id, entry
        return None

    def straggler(self) -> tuple[int, InFlight] | None:
        """The oldest batch sent once and not taken yet, to send a second copy of."""
        for batch_id, entry in self.in_flight.items():
            if entry.state == SENT and entry.sends == 1:
                entry.sends += 1
                self.straggler_copies += 1
                return batch_id, entry
        return None


@dataclass
class Pass:
    """One pass of a feeder over its slices (usually one; more after it took over a lost
    feeder's; none when it has no slice): their plans' batches, taken in turn."""

    epoch: int
    eval: bool
    plans: list[Plan]
    turn: int = 0

    @property
    def batches(self) -> int:
        return sum(p.batches for p in self.plans)

    def exhausted(self) -> bool:
        return all(p.exhausted() for p in self.plans)

    def take(self) -> tuple[int, np.ndarray]:
        for _ in range(len(self.plans)):
            plan = self.plans[self.turn % len(self.plans)]
            self.turn += 1
            if not plan.exhausted():
                return plan.take()
        raise IndexError("the pass is exhausted")

    def rows(self) -> np.ndarray:
        return np.concatenate([p.rows for p in self.plans]) if self.plans else \
            np.zeros(0, dtype=np.int64)

    def find(self, batch_id: int) -> tuple[Plan, int] | None:
        """The plan the batch belongs to, and its number there."""
        for plan in self.plans:
            number = plan.number_of(batch_id)
            if number is not None:
                return plan, number
        return None


@dataclass
class SliceProgress:
    """How far a training pass over one slice has got: every batch number below ``low`` and
    those in ``above`` acknowledged, with their samples and loss (a feeder tells control with
    every heartbeat, in its FeederProgress, so that control can hand the slice on from there if
    the feeder dies)."""

    epoch: int
    low: int = 0
    above: set[int] = field(default_factory=set)
    samples: int = 0
    loss_sum: float = 0.0
    weight_sum: float = 0.0

    def acked(self, number: int, samples: int, loss_sum: float, weight_sum: float) -> None:
        self.above.add(number)
        while self.low in self.above:
            self.above.discard(self.low)
            self.low += 1
        self.samples += samples
        self.loss_sum += loss_sum
        self.weight_sum += weight_sum

    def done(self, number: int) -> bool:
        return number < self.low or number in self.above

    def as_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "low": self.low,
                "above": sorted(self.above), "samples": self.samples,
                "loss_sum": self.loss_sum, "weight_sum": self.weight_sum}
