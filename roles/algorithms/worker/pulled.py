"""A worker's pulled batches (pure; no sockets).

``Pipeline``: the batches a worker has pulled from the sample queue and not yet run, in pull
order, each with its grant (Taken -> Grant: only the next ``grants_ahead`` to run are asked
for, so that the rest stay untaken and the feeder can hand copies of them to an idle worker at
the end of a pass) and its embeddings, one reply per shard. A batch runs once it is granted,
has its embeddings and its turn has come (its weights or its round: the caller's ``due``).

``WaitClock``: the time a worker spends with no batch it can run, by what the next batch waits
for (``Pipeline.blocker``): its sample, its grant, its embeddings, its weights (its round's, or
what its sync mode waits for), the aggregator's answer to its step, or its slowdown.

``WaitSample``: a uniform sample of how long batches waited for their embeddings (from when one
was the next to run, lacking only them), for the summary's quantiles.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Set
from dataclasses import dataclass

import numpy as np

from roles.job.fields import FieldLayout
from roles.protocol.datapath import Embeddings, SampleBatch
from zbus.codec import ProtocolError

Due = Callable[[SampleBatch], bool]


@dataclass
class PulledBatch:
    sample: SampleBatch
    replies: list[Embeddings | None]
    positions: list[np.ndarray | None]  # grid positions of each shard's reply
    asked: bool = False       # Taken sent to the feeder
    asked_at: float | None = None       # when (the round trip to the grant: TakeWindow)
    granted: bool = False
    looked_up_at: float | None = None   # when its Lookups went to the shards
    needed_at: float | None = None      # when it was the next to train, but for embeddings
    overdue_at: float | None = None     # mode push: when the shards whose rows were late
                                        # were last asked

    @property
    def batch_id(self) -> int:
        return self.sample.batch_id

    def has_embeddings(self) -> bool:
        return all(r is not None for r in self.replies)

    def complete(self) -> bool:
        return self.granted and self.has_embeddings()


class Pipeline:
    def __init__(self, shards: int, layout: FieldLayout):
        self.shards, self.layout, self.dim = shards, layout, layout.row_dim
        self.batches: dict[int, PulledBatch] = {}   # in pull order

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[PulledBatch]:
        return iter(list(self.batches.values()))

    def pulled(self, sample: SampleBatch) -> PulledBatch | None:
        """A batch from the queue; None when it is a second copy of one already here."""
        if sample.batch_id in self.batches:
            return None
        batch = PulledBatch(sample, [None] * self.shards, [None] * self.shards)
        self.batches[sample.batch_id] = batch
        return batch

    def to_ask(self, running: Set[int] = frozenset(), ahead: int = 1) -> PulledBatch | None:
        """Keep ``ahead`` batches asked for (Taken sent, granted or not yet) beside the one
        training: the first not asked for, while fewer are (it is marked asked), but for a
        copy of one ``running`` (taken out to run, its ack not sent yet). Such a copy is asked
        for once that ack is out, so that the feeder reads the ack first: a feeder that still
        counts the batch as this worker's does not answer a second Taken from its holder, and
        the pipeline would wait behind it for ever; after the ack it refuses the copy (or,
        feeding a lost feeder's part again, grants it: the batch is trained again)."""
        if sum(b.asked for b in self.batches.values()) >= ahead:
            return None
        batch = next((b for b in self.batches.values()
                      if not b.asked and b.batch_id not in running), None)
        if batch is not None:
            batch.asked = True
        return batch

    def next_granted(self) -> bool:
        """The first batch in pull order is granted: it runs next."""
        batch = next(iter(self.batches.values()), None)
        return batch is not None and batch.granted

    def granted(self, batch_id: int, granted: bool) -> bool:
        """The feeder's answer to Taken; a batch refused (another worker holds it) goes.
        False when the batch is not here."""
        if batch_id not in self.batches:
            return False
        if granted:
            self.batches[batch_id].granted = True
        else:
            del self.batches[batch_id]
        return True

    def embeddings(self, shard: int, e: Embeddings) -> PulledBatch | None:
        """A shard's rows for a batch; None when the batch is not here (refused meanwhile)."""
        batch = self.batches.get(e.batch_id)
        if batch is None:
            return None
        s = batch.sample
        if e.rows.shape[1:] != (self.dim,) or \
                e.grid != self.layout.bounds(len(s.weights), s.lengths)[-1]:
            raise ProtocolError("bad_shape", f"embeddings of batch {e.batch_id} do not fit "
                                             "the batch")
        batch.positions[shard] = e.positions()
        batch.replies[shard] = e
        return batch

    def first_ready(self, due: Due) -> PulledBatch | None:
        """The first batch that can run: granted, embeddings in, ``due``."""
        return next((b for b in self.batches.values() if b.complete() and due(b.sample)), None)

    def ready(self, due: Due) -> bool:
        return self.first_ready(due) is not None

    def take_ready(self, due: Due) -> PulledBatch | None:
        """The first batch that can run, taken out."""
        batch = self.first_ready(due)
        if batch is not None:
            del self.batches[batch.batch_id]
        return batch

    def wanting_embeddings(self, due: Due, now: float) -> PulledBatch | None:
        """Nothing can run: when the next batch lacks only its embeddings, it waits for them
        from ``now``; returned when it is not looked up yet (mode pull: ask now)."""
        batch = next(iter(self.batches.values()), None)
        if batch is None or batch.has_embeddings() or not batch.granted or not due(batch.sample):
            return None
        if batch.needed_at is None:
            batch.needed_at = now
        return batch if batch.looked_up_at is None else None

    def overdue(self, now: float, after: float) -> PulledBatch | None:
        """Mode push: the next batch, when it has waited ``after`` seconds for embeddings that
        the shards were to send unasked, and again every ``after`` seconds while they do not
        come (rows pushed to a worker not connected to the shard are dropped by ZeroMQ: a
        shard restarted at a new address can push before the worker has reconnected)."""
        batch = next(iter(self.batches.values()), None)
        if batch is None or batch.needed_at is None or batch.has_embeddings():
            return None
        if now - (batch.overdue_at if batch.overdue_at is not None else batch.needed_at) \
                < after:
            return None
        batch.overdue_at = now
        return batch

    def blocker(self, due: Due) -> str:
        """What the next batch waits for when none can run (``WaitClock``'s reasons)."""
        batch = next(iter(self.batches.values()), None)
        if batch is None:
            return "samples"
        if not batch.granted:
            return "grant"
        if not batch.has_embeddings():
            return "embeddings"
        return "weights" if not due(batch.sample) else "running"

    def lacking(self, shard: int) -> list[PulledBatch]:
        """The batches looked up whose rows from ``shard`` are not in (a restarted shard)."""
        return [b for b in self.batches.values()
                if b.looked_up_at is not None and b.replies[shard] is None]

    def holds_granted(self) -> bool:
        return any(b.granted for b in self.batches.values())

    def eval_waiting(self) -> bool:
        """An evaluation batch has all it needs but (maybe) its weights."""
        return any(b.complete() and b.sample.eval for b in self.batches.values())


WAIT_REASONS = ("samples", "grant", "embeddings", "weights", "step", "slowdown")


class WaitClock:
    """Seconds waited, by reason: each stretch between two notes counts for the reason noted
    at its start (None, or a reason not in ``WAIT_REASONS``: not waiting)."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(WAIT_REASONS, 0.0)
        self.reason: str | None = None
        self.since = 0.0

    def note(self, reason: str | None, now: float) -> None:
        if self.reason in self.seconds:
            self.seconds[self.reason] += max(0.0, now - self.since)
        self.reason, self.since = reason, now

    def rounded(self) -> dict[str, float]:
        return {k: round(v, 4) for k, v in self.seconds.items()}


class WaitSample:
    """Reservoir sampling: ``kept`` of the waits seen, each equally likely to be kept."""

    def __init__(self, kept: int, seed: int):
        self.kept = kept
        self.waits: list[float] = []   # seconds
        self.seen = 0
        self.rng = np.random.default_rng(seed)

    def add(self, seconds: float) -> None:
        self.seen += 1
        if len(self.waits) < self.kept:
            self.waits.append(seconds)
        else:
            slot = int(self.rng.integers(self.seen))
            if slot < self.kept:
                self.waits[slot] = seconds

    def milliseconds(self) -> list[float]:
        """The sample in ms, ascending."""
        return [round(float(w), 3) for w in np.sort(np.asarray(self.waits) * 1000)]
