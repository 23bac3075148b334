"""The feeder's ledger of batches in flight and its progress per part (pure; no sockets).
Which feeder reads which part is ``roles.algorithms.feeding.parts``; how many batches may be in
flight, how large one is on the wire and the batch-id layout are protocol facts
(``roles.protocol.datapath``); a pass's batches come from ``roles.algorithms.feeding.passes``."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from roles.data.stream import Samples

SENT, TAKEN, QUEUED = "sent", "taken", "queued"


@dataclass
class InFlight:
    batch: Samples
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

    def sent(self, batch_id: int, batch: Samples, eval: bool, round_: int = 0) -> None:
        self.in_flight[batch_id] = InFlight(batch, eval, round_)

    def peek(self, batch_id: int) -> InFlight | None:
        return self.in_flight.get(batch_id)

    def holder(self, batch_id: int) -> str | None:
        """The worker the batch is granted to (None: not in flight or not taken)."""
        entry = self.in_flight.get(batch_id)
        return entry.worker if entry is not None and entry.state == TAKEN else None

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

    def unsent(self, batch_id: int) -> None:
        """The sample queue did not take the batch after all (its send would have blocked):
        it is the first to send again, as if it had not been sent."""
        entry = self.in_flight.get(batch_id)
        if entry is not None and entry.state != TAKEN:
            entry.state = QUEUED
            entry.sends = max(0, entry.sends - 1)
            self.resend.appendleft(batch_id)

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
class PartProgress:
    """How far a training pass over one part has got: every batch number below ``low`` and
    those in ``above`` acknowledged, with their samples and loss (a feeder tells control with
    every heartbeat, in its FeederProgress, so that control can hand the part on from there if
    the feeder dies)."""

    epoch: int
    low: int = 0
    above: set[int] = field(default_factory=set)
    samples: int = 0
    loss_sum: float = 0.0
    weight_sum: float = 0.0

    def acked(self, number: int, samples: int, loss_sum: float, weight_sum: float) -> None:
        if number >= self.low:   # (below: one counted done already, by ``skip_below``)
            self.above.add(number)
        while self.low in self.above:
            self.above.discard(self.low)
            self.low += 1
        self.samples += samples
        self.loss_sum += loss_sum
        self.weight_sum += weight_sum

    def done(self, number: int) -> bool:
        return number < self.low or number in self.above

    def skip_below(self, first: int) -> None:
        """Numbers below ``first`` will never be acknowledged (a restarted stream feeder: its
        dead processes' batches not acked are the broker's again), so they are no hole that
        keeps ``low`` back and ``above`` growing with every ack after it."""
        if first > self.low:
            self.low = first
            self.above = {n for n in self.above if n >= first}

    @classmethod
    def of(cls, resume: dict[str, Any]) -> PartProgress:
        """From what PartMap's ``resume`` (or FeederProgress) carries."""
        return cls(int(resume["epoch"]), int(resume["low"]), set(resume["above"]),
                   int(resume["samples"]), float(resume["loss_sum"]),
                   float(resume["weight_sum"]))
