"""Batch plans and the feeder's ledger (pure; no sockets).

A batch id is unique across the whole job: ``epoch << 40 | feeder << 32 | seq``; within an
epoch the training batches come first (seq 0..) and the eval batches follow them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

MAX_EPOCHS = 1 << 12
MAX_FEEDERS = 1 << 8


def make_batch_id(epoch: int, feeder: int, seq: int) -> int:
    if not (0 <= epoch < MAX_EPOCHS and 0 <= feeder < MAX_FEEDERS and 0 <= seq < 1 << 32):
        raise ValueError(f"batch id out of range: epoch {epoch}, feeder {feeder}, seq {seq}")
    return epoch << 40 | feeder << 32 | seq


def split_batch_id(batch_id: int) -> tuple[int, int, int]:
    return batch_id >> 40, (batch_id >> 32) & 0xFF, batch_id & 0xFFFFFFFF


def sample_batch_bytes(batch_size: int, dense: int) -> int:
    """About the size of one SampleBatch on the wire: the sample queue's kernel buffers are
    sized to it, so that a worker cannot hold more than a batch or two it has not pulled."""
    return batch_size * (dense + 2) * 4 + 1024


@dataclass
class Plan:
    """The batches of one pass: training rows shuffled per epoch, or eval rows in order."""

    epoch: int
    feeder: int
    eval: bool
    rows: np.ndarray
    batch_size: int
    first_seq: int = 0
    next: int = 0

    @classmethod
    def training(cls, epoch: int, feeder: int, n_train: int, batch_size: int, shuffle: bool,
                 seed: int) -> Plan:
        rows = np.arange(n_train)
        if shuffle:
            np.random.default_rng(seed * 1000 + epoch).shuffle(rows)
        return cls(epoch, feeder, False, rows, batch_size)

    @classmethod
    def evaluation(cls, epoch: int, feeder: int, n_train: int, n_total: int,
                   batch_size: int) -> Plan:
        first = -(-n_train // batch_size)  # after the training batches' seqs
        return cls(epoch, feeder, True, np.arange(n_train, n_total), batch_size, first)

    @property
    def batches(self) -> int:
        return -(-len(self.rows) // self.batch_size)

    def exhausted(self) -> bool:
        return self.next >= self.batches

    def take(self) -> tuple[int, np.ndarray]:
        """The next batch: its id and its rows."""
        i = self.next
        self.next += 1
        rows = self.rows[i * self.batch_size:(i + 1) * self.batch_size]
        return make_batch_id(self.epoch, self.feeder, self.first_seq + i), rows


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
    """Every batch sent and not yet acknowledged (at most ``window``), who holds it, and the
    batches to send again.

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

    window: int
    in_flight: dict[int, InFlight] = field(default_factory=dict)
    resend: deque[int] = field(default_factory=deque)
    duplicate_acks: int = 0
    refused_takes: int = 0
    requeued: int = 0
    straggler_copies: int = 0

    def has_room(self) -> bool:
        return len(self.in_flight) < self.window

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
