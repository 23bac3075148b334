"""The training pass of a stream job (``StreamPass``): what a feeder's ledger takes its batches
from, as it takes a file pass's (``roles.algorithms.feeding.passes.FeedingPass``, the same
interface), but one that does not end by itself: ``take`` gives None while no batch is ready
(the loop tries again when events come or a partial batch is due), and the pass is exhausted
only once the stream is ended (``end``: ``[train] until_events`` reached, ``until_s`` past, or
control's word) and every event read has been batched.

Batch ids are (epoch, this feeder's part, seq), and no two processes of a feeder give one id to
two batches: a restarted feeder numbers its batches on from above every seq its dead process can
have handed out (``resume``), so that a shard never takes a new batch for one it applied (and
refuses its rows' gradients) and a late ack of a dead process's batch never counts for a new
one. Each batch's composition (its messages and
their counts, ``Batch``) is kept until its ack (``acked``), for the tracker. A stream batch
cannot be made again (its events are the broker's, not a file's): ``peek`` finds none, so a
restarted feeder reclaims nothing by peeking; its dead process's messages come again from the
broker, and the log of sent batches (``record``, before a batch goes) says which of their
events were trained (``restarted``; ``roles.algorithms.feeding.dead_batches``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from roles.algorithms.feeding.event_batches import Batch, EventBatcher
from roles.algorithms.feeding.ledger import PartProgress
from roles.data.stream import Samples
from roles.protocol.datapath import make_batch_id, split_batch_id


class StreamPass:
    eval = False

    def __init__(self, epoch: int, part: int, batcher: EventBatcher):
        self.epoch, self.part, self.batcher = epoch, part, batcher
        self.next_seq = 0
        self.ended = False
        self.now = 0.0                      # the loop's clock, set before each take
        self.sent: dict[int, Batch] = {}    # seq -> its composition, until acknowledged
        self.trained_before = 0             # samples its dead processes' acked batches held
        # the feeder's log of sent batches (each one's runs of lines), written before it goes
        self.record: Callable[[int, Sequence[tuple[int, int, int, int]]], None] | None = None
        # told, on a restart, which of its dead processes' batches were acknowledged: every
        # seq below ``low`` and those in ``above`` (the ack log's progress of the pass)
        self.restarted: Callable[[int, frozenset[int]], None] | None = None
        # a dead process of this feeder sent batches (its log of sent batches is on disk):
        # a restart, even with none of them acknowledged
        self.sent_before = False

    @property
    def parts(self) -> list[int]:
        return [self.part]

    def add(self, stream: object) -> None:
        raise ValueError("a stream job's parts are not handed over: the broker gives a lost "
                         "feeder's messages to the feeders left")

    def end(self) -> None:
        """No more events: what waits goes out in a last, partial batch."""
        self.ended = True

    def resume(self, logged: PartProgress | None, in_flight: int) -> int | None:
        """A restarted feeder: its dead processes' acked batches are ``logged`` (the ack log's
        progress of this pass, None when none was acked); at most ``in_flight`` of the batches
        they handed out were unacknowledged at any time (the ledger's bound, at the most
        workers a job can have). So every seq handed out is below the highest acked one plus
        ``in_flight`` plus one: the numbering goes on from there. Returns the first seq of
        this process (None: not a restart)."""
        if logged is None:
            return None
        self.trained_before = logged.samples
        if self.restarted is not None:   # (before the log's numbers below are skipped)
            self.restarted(logged.low, frozenset(logged.above))
        highest = max([logged.low - 1, *logged.above])
        self.next_seq = max(self.next_seq, highest + 1 + in_flight)
        return self.next_seq

    def take(self) -> tuple[int, Samples] | None:
        batch = self.batcher.take(self.now, flush=self.ended)
        if batch is None:
            return None
        seq = self.next_seq
        self.next_seq += 1
        if self.record is not None and batch.runs:
            self.record(seq, batch.runs)
        self.sent[seq] = batch
        return make_batch_id(self.epoch, self.part, seq), batch.samples

    def exhausted(self) -> bool:
        return self.ended and not len(self.batcher)

    def acked(self, batch_id: int) -> Batch | None:
        """The composition of an acknowledged batch of this pass (None: not one of its, or
        told already)."""
        epoch, part, seq = split_batch_id(batch_id)
        if epoch != self.epoch or part != self.part:
            return None
        return self.sent.pop(seq, None)

    def stream_of(self, batch_id: int) -> None:
        return None

    def peek(self, batch_id: int) -> Samples | None:
        return None

    def claim(self, batch_id: int) -> None:
        pass
