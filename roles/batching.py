"""Batch plans and the feeder's ledger (pure; no sockets).

A batch id is unique across the whole job: ``epoch << 40 | feeder << 32 | seq``; within an
epoch the training batches come first (seq 0..) and the eval batches follow them.
"""

from __future__ import annotations

import time
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


@dataclass
class InFlight:
    rows: np.ndarray
    eval: bool
    sent_at: float


@dataclass
class Ledger:
    """Batches sent and not yet acknowledged, at most ``window`` of them."""

    window: int
    in_flight: dict[int, InFlight] = field(default_factory=dict)
    duplicate_acks: int = 0

    def has_room(self) -> bool:
        return len(self.in_flight) < self.window

    def sent(self, batch_id: int, rows: np.ndarray, eval: bool) -> None:
        self.in_flight[batch_id] = InFlight(rows, eval, time.monotonic())

    def peek(self, batch_id: int) -> InFlight | None:
        return self.in_flight.get(batch_id)

    def acked(self, batch_id: int) -> InFlight | None:
        """The batch's record, or None (and counted) for an ack of no batch in flight."""
        entry = self.in_flight.pop(batch_id, None)
        if entry is None:
            self.duplicate_acks += 1
        return entry
