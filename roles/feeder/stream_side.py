"""A stream job's feeder part (``StreamSide``): the broker's events into the training pass's
batches, and each message acknowledged to the broker once every event of it is trained
(docs/streams.md).

The reader thread (``roles.events.reader``) fetches and decodes; the feeder's loop, woken every
``POLL_S`` while it streams, takes what is read (``poll``): a message the tracker already holds
(delivered again while held) is left out; the rest's malformed events are set aside in
rejected.tsv as ``<topic>[<partition>]@<position>`` and their line; the accepted events are
prepared (the dense transform, time-decay weights counted from the newest event time seen) into
the ``EventBatcher`` the ``StreamPass`` takes batches from. Before control's statistics are in,
the first ``[stream] warmup_events`` events are held and summarised (``PartStats`` of this
feeder's one part): they make the dense transform as a file's first rows do, and are trained
first.

At each training ack (``acked``) the batch's events are told to the ``MessageTracker`` and the
messages it releases are acknowledged to the broker; the worker's scores of the batch, made by
the model before the batch trained it, go to the ``Progressive`` validation. Messages held
longer than half the broker's ack wait are said to be in progress. The broker's lag (messages
not acknowledged) is asked by the reader thread, never by the loop.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from roles.algorithms.feeding.dead_batches import DeadBatches
from roles.algorithms.feeding.event_batches import EventBatcher
from roles.algorithms.feeding.sent_log import SentLog
from roles.algorithms.feeding.stream_pass import StreamPass
from roles.algorithms.shared.metrics import ScoreHistogram
from roles.algorithms.shared.progressive import StreamProgress, Window
from roles.data.readers import RawBlock, Schema
from roles.data.rejected import RejectedRows
from roles.data.stats import Moments
from roles.data.stream import Preparer, Samples
from roles.data.transforms import signed_log1p
from roles.events import BrokerError, Consumer, Delivery, open_consumer
from roles.events.decode import Decoded, EventDecoder, message_name
from roles.events.opening import Opening
from roles.events.positions import GroupAcks
from roles.events.reader import EventReader
from roles.events.tracker import MessageTracker
from roles.events.watermark import Watermark
from roles.feeder.joining import LabelSide
from roles.job.settings import DECAY_UNITS, Job
from roles.protocol.datapath import PartStats, split_batch_id
from roles.protocol.stream import StreamScores

log = logging.getLogger(__name__)
POLL_S = 0.005         # the loop looks for events read this often while it streams
WARMUP_IDLE_S = 1.0    # the statistics are made from fewer events once none came this long
WARMUP_EMPTY_S = 10.0  # ... or from none, when none came at all this long
WORKING_EVERY_S = 5.0  # held messages older than this are said in progress (or a third of
                       # [stream] ack_wait_s, when that is less)
DRAIN_SLACK_S = 5.0    # past ack_wait_s: how long an ended stream reads on for a dead process's
                       # messages the broker is to deliver again
HELD_BATCHES = 8       # events waiting in the batcher, in batches, before the loop takes more


@dataclass
class _Held:
    """Events read before the statistics were in: prepared once they are."""

    block: RawBlock
    origin: np.ndarray   # int64 [n, 2]
    times: np.ndarray    # float64 [n]
    ids: np.ndarray | None   # int64 [n]: with labels on a topic of their own
    lines: np.ndarray | None = None   # int64 [n]: each event's line in its message


def finite(x: float) -> float | None:
    """A figure, None when it is not one (an AUC of one class only is NaN)."""
    return float(x) if np.isfinite(x) else None


def live_aucs(lifetime: ScoreHistogram, windows: Sequence[Window]) -> dict[str, float | None]:
    """A progressive validation's AUC over every event (``lifetime``) and its newest closed
    window's; None before any."""
    return {"progressive_auc": finite(lifetime.auc()) if lifetime.samples else None,
            "window_auc": finite(windows[-1].auc) if windows else None}


def _close_both(consumers: tuple[Consumer, Consumer | None]) -> None:
    for consumer in consumers:
        if consumer is not None:
            consumer.close()


def origin_of(deliveries: list[Delivery], message: np.ndarray) -> np.ndarray:
    """Each event's message as (partition, position), from its index in ``deliveries`` (one
    row a message, then indexed: a fetch's events come a hundred a message)."""
    each = np.array([(d.partition, d.position) for d in deliveries], dtype=np.int64)
    return each.reshape(-1, 2)[np.asarray(message, dtype=np.int64)]


def event_samples(preparer: Preparer, block: RawBlock,
                  weights: np.ndarray | None = None) -> Samples:
    """Events to samples, one each (none dropped nor merged): keys hashed as a file's rows,
    the dense transform, ``weights`` (None: 1)."""
    return Samples(preparer.keys(block), preparer.transform.apply(block.dense),
                   block.labels.astype(np.float32),
                   np.ones(len(block), dtype=np.float32) if weights is None else weights)


def select_rows(block: RawBlock, rows: np.ndarray) -> RawBlock:
    """The block's rows ``rows`` (its rejected rows stay with it)."""
    at = pa.array(rows, type=pa.int64())
    return RawBlock(block.labels[rows], block.dense[rows], [c.take(at) for c in block.sparse],
                    None if block.timestamps is None else block.timestamps[rows],
                    block.rows_read, block.rejected, block.bytes_read,
                    None if block.weights is None else block.weights[rows])


def messages_only(deliveries: list[Delivery], decoded: Decoded, kept: list[int],
                  topic: str) -> tuple[list[Delivery], Decoded]:
    """Of messages read and decoded, those at ``kept`` (indices into ``deliveries``): their
    events, and their rejected ones."""
    index = np.full(len(deliveries), -1, dtype=np.int64)
    index[kept] = np.arange(len(kept))
    rows = np.flatnonzero(index[decoded.message] >= 0)
    names = {message_name(topic, deliveries[i]) for i in kept}
    block = select_rows(decoded.block, rows)
    block.rejected = [r for r in block.rejected if r.file in names]
    return [deliveries[i] for i in kept], Decoded(
        block, index[decoded.message[rows]], decoded.line[rows], decoded.event_time_s[rows],
        len(rows) + len(block.rejected), None if decoded.ids is None else decoded.ids[rows])


class StreamSide:
    """``index``: this feeder's; ``rejected``: where malformed events are set aside."""

    def __init__(self, job: Job, index: int, rejected: RejectedRows):
        self.job, self.index, self.rejected = job, index, rejected
        s = job.stream
        self.config = s
        self.group = s.group or job.name
        self.batcher = EventBatcher(job.train.batch_size, s.linger_ms / 1000.0)
        self.tracker = MessageTracker()
        self.marks: dict[int, Watermark] = {}   # per partition: what is acknowledged
        # a consumer the feeders share (JetStream's): what this one acknowledged above the
        # group's floor, its record of the stream at a checkpoint (roles.events.positions);
        # made with the consumer
        self.group_acks: GroupAcks | None = None
        self.skip: dict[tuple[int, int], int] = {}   # gone back to a checkpoint: trained then
                                                     # (a message's first events; -1: all)
        self.progressive = StreamProgress(len(job.tasks), s.window_events)
        # labels on a topic of their own, joined here (roles.feeder.joining)
        self.labels = LabelSide(job, rejected) if s.labels.topic else None
        self.reader: EventReader | None = None   # once the consumer is open (``opened``)
        self.opening: Opening[tuple[Consumer, Consumer | None]] | None = None
        self.decoders: tuple[EventDecoder, EventDecoder | None] | None = None
        self.preparer: Preparer | None = None
        self.held: list[_Held] = []           # before the statistics
        self.moments = Moments.empty(len(job.dense_fields))
        self.warm_read = self.warm_rejected = 0
        self.newest_ts: int | None = None
        self.warm_started = 0.0
        self.last_event_at = 0.0
        self.stats_sent = False
        self.plan: StreamPass | None = None
        self.ended = False
        self.working_at = 0.0
        self.events_rejected = 0
        self.events_taken = 0            # read and taken by the loop (rejected ones too)
        self.events_trained = 0
        self.messages_acked = 0
        self.newest_trained_s = 0.0       # event time of the newest event trained
        self.newest_read_s = 0.0
        self.decay_newest = -np.inf      # decay counts from the newest event time seen
        # a restarted feeder (roles.algorithms.feeding.dead_batches): the log of sent batches
        self.sent_log: SentLog | None = None
        self.dead: DeadBatches | None = None
        self.dead_settled = False
        self.dead_events_left_out = 0    # events the dead processes' acked batches trained
        self.dead_batches_acked = 0      # dead processes' batches acknowledged to this one
        self.rewound = False             # gone back to a checkpoint: its counts restored
        # the stream ended: reading on, until then, for the dead processes' messages the
        # broker is to deliver again (``end``)
        self.drain_until: float | None = None
        self.started_at = time.monotonic()
        self.revokes_seen = 0            # the consumer's revokes this loop has answered
        self.messages_set_aside = 0      # read, then revoked before any event was trained
        self.moved: set[int] = set()     # partitions revoked: their record starts anew

    # -- opening ---------------------------------------------------------------------------
    def open(self, rewind: dict[str, Any] | None = None, rewind_id: str = "") -> str | None:
        """Begin connecting to the broker, off the loop (``opened`` says when it has, and
        reading begins then); why not, in one line, when the job's settings cannot make a
        decoder. ``rewind``: the job went back to a checkpoint (the roll back
        ``rewind_id``), where the stream stood as every feeder's ``position`` gave it: read
        again from its first position not done, leaving out what was trained then."""
        s, d = self.config, self.job.data
        positions = None if rewind is None else self.rewind(rewind)
        tasks = self.job.tasks
        schema = Schema(label="" if self.labels else tasks[0],
                        more_labels=() if self.labels else tuple(tasks[1:]),
                        dense=self.job.dense_fields,
                        sparse=self.job.sparse_fields, positive=tuple(d.positive),
                        negative=tuple(d.negative), timestamp=d.timestamp,
                        lists=self.job.list_fields)
        labels = self.labels
        try:
            decoder = EventDecoder(schema, s.format, s.topic, s.columns,
                                   s.labels.id_field if labels else "")
            label_decoder = labels.decoder() if labels is not None else None
        except ValueError as exc:
            return f"cannot read the stream {s.url} {s.topic}: {exc}"

        def connect() -> tuple[Consumer, Consumer | None]:
            try:
                consumer = open_consumer(s.url, s.topic, self.group, s.start,
                                         dict(s.options) or None, s.ack_wait_s, positions,
                                         rewind_id=rewind_id, rewind_leads=self.index == 0)
            except (BrokerError, ValueError) as exc:
                raise BrokerError(f"cannot read the stream {s.url} {s.topic}: {exc}") from None
            try:
                return consumer, labels.connect(self.group) if labels is not None else None
            except BaseException:
                consumer.close()
                raise

        self.decoders = (decoder, label_decoder)
        self.opening = Opening(connect, _close_both, "stream-open")
        return None

    def connecting(self) -> bool:
        """``open`` has begun and ``opened`` has not yet said it is over."""
        return self.opening is not None

    def opened(self) -> tuple[bool, str | None]:
        """Whether ``open``'s connecting is over, and why it failed (one line); reading
        begins once it is."""
        if self.opening is None:
            return True, None
        done, consumers, failed = self.opening.result()
        if not done:
            return False, None
        self.opening = None
        if consumers is None:
            return True, failed or "the broker's consumer did not open"
        consumer, label_consumer = consumers
        assert self.decoders is not None
        decoder, label_decoder = self.decoders
        s = self.config
        self.group_acks = GroupAcks() if consumer.shared else None
        self.reader = EventReader(consumer, decoder, max_messages=1000, fetch_messages=100,
                                  working_s=self.working_every())
        self.warm_started = time.monotonic()
        log.info("reading %s %s as %s (%s), from %s", s.url, s.topic, self.group, s.format,
                 s.start)
        if self.labels is not None:
            assert label_consumer is not None and label_decoder is not None
            self.labels.start(label_consumer, label_decoder, self.working_every())
        return True, None

    def position(self) -> dict[str, Any] | None:
        """Where the stream stands at a checkpoint's cut (nothing is in flight then): per
        partition the first position not acknowledged, those acknowledged above it, and the
        held messages partly trained (their first events: batches keep the stream's order),
        with the counts so far. None with labels on a topic of their own (the join trains out
        of order: not recorded, docs/limits.md)."""
        if self.labels is not None:
            return None
        partitions: dict[str, dict[str, Any]]
        if self.group_acks is not None:   # the group's floor, and what this feeder did above
            self.group_acks.floor_at(self.acked_below())
            partitions = {"0": self.group_acks.record()}
        else:
            partitions = {str(p): {"floor": m.floor, "done": m.done_above(), "partial": []}
                          for p, m in self.marks.items()}
        for p, position, trained in self.tracker.partly_trained():
            partitions.setdefault(str(p), {"floor": None, "done": [], "partial": []})[
                "partial"].append([position, trained])
        return {"partitions": partitions, "events_trained": self.trained(),
                "events_taken": self.events_taken, "events_rejected": self.events_rejected,
                "messages_acked": self.messages_acked}

    def rewind(self, at: dict[str, Any]) -> dict[int, int]:
        """The counts and the events to leave out, as ``position`` gave them; the positions
        to read again from, by partition."""
        self.events_trained = int(at.get("events_trained", 0))
        self.rewound = True
        self.events_taken = int(at.get("events_taken", 0))
        self.events_rejected = int(at.get("events_rejected", 0))
        self.messages_acked = int(at.get("messages_acked", 0))
        start: dict[int, int] = {}
        for key, part in at.get("partitions", {}).items():
            p = int(key)
            if part.get("floor") is not None:
                start[p] = int(part["floor"])
            self.skip.update(((p, int(q)), -1) for q in part.get("done", []))
            self.skip.update(((p, int(q)), int(k)) for q, k in part.get("partial", []))
        log.warning("back to a checkpoint: the stream is read again from %s (%d message(s) "
                    "above it trained then, whole or in part)",
                    ", ".join(f"[{p}]@{q}" for p, q in sorted(start.items())) or
                    "its start", len(self.skip))
        return start

    # -- the statistics --------------------------------------------------------------------
    def statistics_due(self, now: float) -> PartStats | None:
        """This feeder's PartStats once its first ``warmup_events`` events are read (or fewer,
        once none came for a while)."""
        if self.stats_sent or self.reader is None:   # (none read before the consumer opens)
            return None
        enough = self.warm_read >= self.config.warmup_events
        idle = self.warm_read and now - self.last_event_at >= WARMUP_IDLE_S
        empty = not self.warm_read and now - self.warm_started >= WARMUP_EMPTY_S
        if not (enough or idle or empty):
            return None
        self.stats_sent = True
        m = self.moments
        accepted = sum(len(h.block) for h in self.held)
        log.info("statistics of the stream's first %d event(s) (%d rejected)", self.warm_read,
                 self.warm_rejected)
        return PartStats(
            first_rejected="", parts=np.array([self.index], dtype=np.int64),
            counts=np.array([[self.warm_read, accepted, self.warm_rejected, 0,
                              -1 if self.newest_ts is None else self.newest_ts]],
                            dtype=np.int64),
            moments=np.array([[m.count, m.mean, m.m2]], dtype=np.float64).reshape(
                1, 3, len(self.job.dense_fields)))

    def prepared(self, preparer: Preparer) -> None:
        """Control's statistics are in: the events held are prepared, to be trained first."""
        self.preparer = preparer
        held, self.held = self.held, []
        now = time.monotonic()
        for h in held:
            self.admit(self.prepare(h.block), h.origin, h.times, h.ids, now, h.lines)

    # -- reading ---------------------------------------------------------------------------
    def working_every(self) -> float:
        """How long a message is held (read, or taken) before it is said in progress: well
        within the broker's ack wait."""
        return min(WORKING_EVERY_S, self.config.ack_wait_s / 3)

    def poll(self, now: float) -> bool:
        """Take what the reader has read (while the batcher has room); whether any event
        came. Held messages due an in-progress ack get one."""
        if self.reader is None:
            return False
        every = self.working_every()
        if now - self.working_at >= every:   # held, waiting or ended alike
            self.working_at = now
            overdue = self.tracker.overdue(now, every)
            if overdue:
                self.reader.working(overdue)
            if self.labels is not None:
                self.labels.overdue(now, every)
        self.answer_revoke()
        came = False
        if self.labels is not None and not self.ended:
            ready = self.labels.poll(now, running=self.preparer is not None)
            if ready is not None:
                self.batcher.add(ready.samples, ready.origin, ready.times, now,
                                 ready.label_origin, ready.lines)
                came = True
        if (self.ended and self.drain_until is None) or self.full():
            return came
        for deliveries, decoded in self.reader.take():
            came |= self.take(deliveries, decoded, now)
        return came

    def answer_revoke(self) -> None:
        """A rebalance revokes partitions (Kafka): what this feeder has read of them and not
        begun to train (held for the statistics, waiting in the batcher, read and not taken)
        is set aside untrained, and the consumer told to forget it (the revoke's answer,
        which it waits for): the partitions' next owner reads it from their commit. What a
        batch has begun is trained here, the revoke waiting for it (``roles.events.kafka``).
        This feeder's record of each of them starts anew once it comes back (from a commit).
        With labels on a topic of their own (one feeder) nothing is set aside."""
        assert self.reader is not None
        count, partitions = self.reader.revoking()
        if count == self.revokes_seen or not partitions:
            return
        self.revokes_seen = count
        if self.labels is not None:
            self.moved |= partitions
            self.reader.forget([], count)
            return
        now = time.monotonic()
        untracked = []   # read, and not to be trained here (the stream ended)
        for deliveries, decoded in self.reader.take():   # (all it read: it waits in the revoke)
            if not self.ended or self.drain_until is not None:
                self.take(deliveries, decoded, now)
            untracked += [d for d in deliveries if d.partition in partitions and
                          not self.tracker.holds(d.partition, d.position)]
        self.moved |= partitions   # (after the take: those were delivered before the revoke)
        rows = [self.batcher.drop(set(partitions))]
        kept = []
        for h in self.held:
            gone = np.isin(h.origin[:, 0], list(partitions))
            if gone.any():
                rows.append(h.origin[gone])
                at = np.flatnonzero(~gone)
                if not len(at):
                    continue
                h = _Held(select_rows(h.block, at), h.origin[at], h.times[at],
                          None if h.ids is None else h.ids[at],
                          None if h.lines is None else h.lines[at])
            kept.append(h)
        self.held = kept
        origin = np.concatenate(rows)
        messages = np.unique(origin, axis=0) if len(origin) else origin
        aside, malformed = self.tracker.forget([(int(p), int(q)) for p, q in messages])
        self.events_taken -= len(origin) + malformed
        self.events_rejected -= malformed   # (its next owner counts them: rejected.tsv has
        if not self.stats_sent:             # them from each, as read)
            self.warm_read -= len(origin) + malformed
            self.warm_rejected -= malformed
        for d in aside:
            mark = self.marks.get(d.partition)
            if mark is not None:
                mark.forget([d.position])
        self.reader.forget(aside + untracked, count)
        self.messages_set_aside += len(aside)
        if aside:
            log.info("partition(s) %s revoked: %d message(s) read and not begun set aside "
                     "(%d event(s)), for their next owner", sorted(partitions), len(aside),
                     len(origin) + malformed)

    def full(self) -> bool:
        """Enough waits: before the statistics, the warm-up's events; after, 8 batches."""
        if self.preparer is None:
            return self.warm_read >= self.config.warmup_events
        return len(self.batcher) >= HELD_BATCHES * self.job.train.batch_size

    def reader_failed(self) -> bool:
        return (self.reader is not None and not self.reader.alive()) or \
            (self.labels is not None and self.labels.failed())

    def take(self, deliveries: list[Delivery], decoded: Decoded, now: float) -> bool:
        if self.drain_until is not None:   # ended: only the dead processes' messages come in
            assert self.dead is not None
            theirs = [i for i, d in enumerate(deliveries)
                      if (d.partition, d.position) in self.dead.runs]
            if not theirs:
                return False
            deliveries, decoded = messages_only(deliveries, decoded, theirs, self.config.topic)
        fresh = self.tracker.add(deliveries, now)
        rejected = decoded.rejected
        if not fresh:   # every message delivered again while held
            return False
        for i in fresh:
            d = deliveries[i]
            if d.partition in self.moved:   # back after a revoke: from its commit on
                self.moved.discard(d.partition)
                self.marks[d.partition] = Watermark()
            self.marks.setdefault(d.partition, Watermark()).delivered(d.position)
        keep = np.zeros(len(deliveries), dtype=bool)
        keep[fresh] = True            # delivered again while held: left out
        rows = keep[decoded.message]
        skipped = self.skipped(deliveries, fresh, decoded.message, rows)
        parked = self.settle_dead(deliveries, fresh, decoded, rows)
        counted = rows.copy()         # the events this process or a worker holding them trains
        for at in parked.values():
            counted[at] = True
        if not rows.all():
            kept = {message_name(self.config.topic, deliveries[i])
                    for i in fresh if i not in skipped}
            rejected = [r for r in rejected if r.file in kept]
            at = np.flatnonzero(rows)
            block = select_rows(decoded.block, at)
            message, times = decoded.message[at], decoded.event_time_s[at]
            ids = None if decoded.ids is None else decoded.ids[at]
        else:
            block, message, times = decoded.block, decoded.message, decoded.event_time_s
            ids = decoded.ids
        lines = decoded.line[rows]
        self.events_taken += int(counted.sum()) + len(rejected)
        if rejected:
            self.rejected.append(rejected)
            self.events_rejected += len(rejected)
        per_message = np.bincount(decoded.message[counted], minlength=len(deliveries))
        malformed = Counter(r.file for r in rejected) if rejected else None
        for i in fresh:
            self.tracker.events(deliveries[i], int(per_message[i]), 0 if malformed is None else
                                malformed[message_name(self.config.topic, deliveries[i])])
        released = self.tracker.done()   # messages whose every event was set aside
        if released:
            self.acknowledge(released)
        for seq, at in parked.items():
            assert self.dead is not None
            self.dead.park(seq, _Held(select_rows(decoded.block, at),
                                      origin_of(deliveries, decoded.message[at]),
                                      decoded.event_time_s[at],
                                      None if decoded.ids is None else decoded.ids[at],
                                      decoded.line[at]))
        if not len(block):
            return bool(rejected) or bool(parked)
        self.accept(block, origin_of(deliveries, message), times, ids, lines, len(rejected),
                    now)
        return True

    def accept(self, block: RawBlock, origin: np.ndarray, times: np.ndarray,
               ids: np.ndarray | None, lines: np.ndarray | None, rejected: int,
               now: float) -> None:
        """Events taken, to be trained by this process: held until the statistics are in
        (summarised meanwhile), then prepared into the batcher."""
        self.last_event_at = now
        self.newest_read_s = max(self.newest_read_s, float(times.max()))
        if self.labels is not None:
            self.labels.saw(times, now)
        if self.preparer is None:   # before the statistics: summarised and held
            self.summarise(block, rejected)
            self.held.append(_Held(block, origin, times, ids, lines))
        else:
            self.admit(self.prepare(block), origin, times, ids, now, lines)

    def admit(self, samples: Samples, origin: np.ndarray, times: np.ndarray,
              ids: np.ndarray | None, now: float, lines: np.ndarray | None = None) -> None:
        """Prepared events to the batcher; with labels on a topic of their own, to the join
        first (what leaves it goes on to the batcher; a second impression of an id is done
        with, untrained)."""
        if self.labels is None or ids is None:
            self.batcher.add(samples, origin, times, now, lines=lines)
            return
        ready, duplicates = self.labels.impressions(samples, origin, times, ids, now, lines)
        if len(duplicates):
            self.tracker.trained_rows(duplicates)
            released = self.tracker.done()
            if released:
                self.acknowledge(released)
        if ready is not None:
            self.batcher.add(ready.samples, ready.origin, ready.times, now, ready.label_origin,
                             ready.lines)

    def skipped(self, deliveries: list[Delivery], fresh: list[int], message: np.ndarray,
                rows: np.ndarray) -> set[int]:
        """A job gone back to a checkpoint: the events of ``fresh`` messages that it had
        trained (all of a message done then, a message's first events) are left out of
        ``rows`` (in place); the messages left out whole (their rejected events too)."""
        whole: set[int] = set()
        if not self.skip:
            return whole
        for i in fresh:
            d = deliveries[i]
            k = self.skip.pop((d.partition, d.position), None)
            if k is None:
                continue
            mine = np.flatnonzero(message == i)
            rows[mine if k < 0 else mine[:k]] = False
            if k < 0:
                whole.add(i)
        return whole

    def settle_dead(self, deliveries: list[Delivery], fresh: list[int], decoded: Decoded,
                    rows: np.ndarray) -> dict[int, np.ndarray]:
        """A restarted feeder: of the events of ``fresh`` messages still in ``rows``, those its
        dead processes' acknowledged batches trained are left out (in place), and those of
        dead batches a worker may still train are left out too and returned, per dead batch
        (to be parked under it)."""
        parked: dict[int, list[np.ndarray]] = {}
        if self.dead is None or not self.dead.runs:
            return {}
        for i in fresh:
            d = deliveries[i]
            if (d.partition, d.position) not in self.dead.runs:   # (most: cheap)
                continue
            self.dead.came(d.partition, d.position)
            mine = np.flatnonzero((decoded.message == i) & rows)
            if not len(mine):
                continue
            trained, held = self.dead.fates(self.dead.owners(d.partition, d.position,
                                                             decoded.line[mine]))
            rows[mine[trained]] = False
            self.dead_events_left_out += int(trained.sum())
            for seq, m in held.items():
                rows[mine[m]] = False
                parked.setdefault(seq, []).append(mine[m])
        return {seq: np.concatenate(at) for seq, at in parked.items()}

    def summarise(self, block: RawBlock, rejected: int) -> None:
        values = block.dense
        if len(values):
            self.moments = self.moments.merge(Moments.of(
                signed_log1p(values) if self.job.data.log1p else values))
        self.warm_read += len(block) + rejected
        self.warm_rejected += rejected
        if block.timestamps is not None and len(block.timestamps):
            top = int(block.timestamps.max())
            self.newest_ts = top if self.newest_ts is None else max(self.newest_ts, top)

    def prepare(self, block: RawBlock) -> Samples:
        """Events to samples: keys hashed as a file's rows, the dense transform, and with
        ``[data] decay_base`` > 1 the weight decay_base^-age, age counted in ``decay_unit``
        from the newest event time seen so far (nothing is dropped nor merged: each event is
        trained once as it comes)."""
        assert self.preparer is not None
        weights = None
        d = self.job.data
        if d.decay_base > 1.0 and block.timestamps is not None and len(block.timestamps):
            t = block.timestamps.astype(np.float64)
            self.decay_newest = max(self.decay_newest, float(t.max()))
            age = (self.decay_newest - t) / DECAY_UNITS[d.decay_unit]
            weights = np.power(d.decay_base, -age).astype(np.float32)
        return event_samples(self.preparer, block, weights)

    # -- the pass --------------------------------------------------------------------------
    def begin(self, epoch: int) -> StreamPass:
        self.plan = StreamPass(epoch, self.index, self.batcher)
        if self.sent_log is not None:
            self.plan.record = self.sent_log.append
            self.plan.restarted = self.restarted
            self.plan.sent_before = bool(self.sent_log.segments())
        return self.plan

    # -- a restarted feeder: its dead processes' batches (exactly once) --------------------------
    def open_sent_log(self, directory: Path, node: str, rolled_back: bool) -> None:
        """The log of sent batches, beside the ack log (with labels on a topic of their own
        too: a joined impression keeps its line through the join)."""
        self.sent_log = SentLog(directory, node)
        if rolled_back:   # gone back to a checkpoint: nothing was in flight
            self.sent_log.clear()

    def restarted(self, low: int, above: frozenset[int]) -> None:
        """The pass resumes on the ack log of dead processes (every seq below ``low`` and
        those in ``above`` acknowledged): their sent batches, from the log, sort the events
        the broker delivers again. Those not acknowledged are marked so in the log, for a
        process that follows this one."""
        assert self.sent_log is not None
        records = self.sent_log.read()
        if not len(records):
            return
        self.dead = DeadBatches(records, low, above)
        unsettled = self.dead.unsettled()
        self.sent_log.mark_unacked(unsettled)
        log.warning("restarted: %d batch(es) its dead process(es) sent are in its log of sent "
                    "batches, %d of them not acknowledged: their events are trained by the "
                    "worker that holds them, or anew", len(self.dead), len(unsettled))

    def dead_acked(self, batch_id: int, samples: int) -> bool:
        """A worker's ack of a batch a dead process sent, not yet known trained: it is now
        (True); its events parked here are done."""
        if self.dead is None or self.plan is None:
            return False
        epoch, part, seq = split_batch_id(batch_id)
        if epoch != self.plan.epoch or part != self.plan.part:
            return False
        parked = self.dead.acked(seq)
        if parked is None:
            return False
        assert self.sent_log is not None
        self.sent_log.mark_acked(seq)
        for h in parked:
            self.tracker.trained_rows(h.origin)
        released = self.tracker.done()
        if released:
            self.acknowledge(released)
        self.events_trained += samples
        self.dead_batches_acked += 1
        return True

    def held_by(self, worker: str, batch_ids: list[int]) -> None:
        """A worker's Holding: the dead processes' batches it will train."""
        if self.dead is not None and self.plan is not None:
            mine = [split_batch_id(b) for b in batch_ids]
            self.dead.hold(worker, [seq for e, p, seq in mine
                                    if e == self.plan.epoch and p == self.plan.part])

    def workers_lost(self, workers: set[str], now: float) -> None:
        if self.dead is not None:
            self.release(self.dead.lost(workers), now)

    def recovered(self, now: float) -> None:
        """Every live worker has answered: the dead batches nobody holds are trained anew."""
        if self.dead is not None and not self.dead_settled:
            self.dead_settled = True
            self.release(self.dead.recovered(), now)

    def release(self, parked: list[_Held], now: float) -> None:
        for h in parked:
            self.accept(h.block, h.origin, h.times, h.ids, h.lines, 0, now)

    def end(self) -> None:
        """Control's word: no more events are taken (those read and not taken are left to
        the broker, unacknowledged); what waits goes out. A restarted feeder whose dead
        processes' messages the broker has not delivered again yet (NATS waits ack_wait_s)
        reads on for them first, taking those only (``drained``): their events trained then
        are left out and the message acknowledged, where ending now would leave it to a
        later run of the group to train again."""
        if self.ended:
            return
        self.ended = True
        awaited = len(self.dead.awaited) if self.dead is not None else 0
        if awaited and self.reader is not None:
            wait_s = self.config.ack_wait_s + DRAIN_SLACK_S
            self.drain_until = time.monotonic() + wait_s
            log.info("the stream ends: first %d message(s) of its dead process(es), not "
                     "acknowledged to the broker, are read again (up to %g s), to leave out "
                     "what was trained of them and acknowledge it", awaited, wait_s)
            return
        self.finish()

    def drained(self) -> bool:
        """Reading on after the end (``end``) is over: every awaited message came, or the
        time is up. True once, when the stream is then ended."""
        if self.drain_until is None:
            return False
        left = len(self.dead.awaited) if self.dead is not None else 0
        if left and time.monotonic() < self.drain_until:
            return False
        if left:
            log.warning("%d message(s) of its dead process(es) did not come again: left "
                        "unacknowledged (a later run of the group trains what was trained of "
                        "them again)", left)
        self.finish()
        return True

    def finish(self) -> None:
        self.drain_until = None
        if self.plan is not None:
            self.plan.end()
        if self.reader is not None:
            self.reader.stop_fetching()
        if self.labels is not None:
            self.labels.end()
        log.info("the stream ends here: %d event(s) trained, %d wait in batches",
                 self.events_trained, len(self.batcher))

    def ready(self, now: float) -> bool:
        """A batch can be taken now."""
        if self.plan is None:
            return False
        self.plan.now = now
        waiting = len(self.batcher)
        if not waiting:
            return False
        due = self.batcher.due()
        return waiting >= self.job.train.batch_size or self.ended or \
            (due is not None and now >= due)

    def wake(self) -> float | None:
        """When the loop must look again (None: only on messages)."""
        if self.reader is None or (self.ended and self.drain_until is None
                                   and not len(self.batcher)):
            return None
        return time.monotonic() + POLL_S

    def acked(self, batch_id: int, preds: np.ndarray) -> None:
        """A training batch was acknowledged: its events are trained."""
        if self.plan is None:
            return
        batch = self.plan.acked(batch_id)
        if batch is None:
            return
        self.tracker.trained(batch.messages, batch.counts)
        released = self.tracker.done()
        if released:
            self.acknowledge(released)
        if self.labels is not None:
            self.labels.trained(batch)
        n = len(batch.samples)
        self.events_trained += n
        if len(batch.event_time_s):
            self.newest_trained_s = max(self.newest_trained_s, float(batch.event_time_s.max()))
        if preds.size == batch.samples.labels.size:   # (several labels: [n, tasks] flattened)
            self.progressive.add(batch.samples.labels, preds, batch.event_time_s)

    def acknowledge(self, released: list[Delivery]) -> None:
        """To the broker, by the reader's thread (the consumer's calls all on one thread)."""
        if self.reader is not None:
            self.reader.done(released)
        if self.sent_log is not None:   # (a restart after this one does not wait for them)
            self.sent_log.mark_messages_acked([(d.partition, d.position) for d in released])
        self.messages_acked += len(released)
        for d in released:
            mark = self.marks.get(d.partition)
            if mark is not None:
                mark.done(d.position)
        if self.group_acks is not None:
            self.group_acks.floor_at(self.acked_below())
            for d in released:
                self.group_acks.done(d.position)

    def acked_below(self) -> int | None:
        """The shared consumer's group floor as its server last said it."""
        return self.reader.consumer.acked_below if self.reader is not None else None

    # -- figures -----------------------------------------------------------------------------
    def trained(self) -> int:
        """Events trained in this pass: this process's, and a restarted one's dead processes'
        (their acks in the ack log)."""
        before = self.plan.trained_before if self.plan is not None and not self.rewound else 0
        return self.events_trained + before

    def counters(self) -> dict[str, object]:
        r = self.reader
        lag_messages = r.lag_messages if r is not None else None
        per_message = (r.events_read / r.messages_read) if r is not None and r.messages_read \
            else 1.0
        lifetime = self.progressive.first.lifetime   # (a histogram made anew: once)
        first = live_aucs(lifetime, self.progressive.first.windows)
        return {"stream": {
            "events_read": r.events_read if r is not None else 0,
            "messages_read": r.messages_read if r is not None else 0,
            "events_taken": self.events_taken,
            "events_trained": self.trained(), "events_rejected": self.events_rejected,
            "messages_acked": self.messages_acked, "messages_held": len(self.tracker),
            "duplicates_left_out": self.tracker.duplicates,
            "messages_set_aside": self.messages_set_aside,
            "lag_messages": lag_messages,
            "lag_events": None if lag_messages is None else round(lag_messages * per_message),
            "lag_s": (0.0 if not lag_messages else
                      round(max(0.0, time.time() - self.newest_trained_s), 3))
            if self.newest_trained_s and lag_messages is not None else None,
            "broker_down_since": r.broker_down_since if r is not None else None,
            "acks_refused": r.acks_refused if r is not None else 0,
            **first,
            "progressive_logloss": finite(lifetime.logloss()) if lifetime.samples else None,
            "windows_closed": self.progressive.first.closed, "ended": self.ended,
            "dead_batches_acked": self.dead_batches_acked,
            "dead_events_left_out": self.dead_events_left_out,
            "join": self.labels.counts() if self.labels is not None else None,
            "tasks": self.task_figures(first)}}

    def task_figures(self, first: dict[str, float | None]
                     ) -> dict[str, dict[str, float | None]] | None:
        """With several labels, each one's progressive AUC (every event that has it) and its
        newest closed window's, by label (``first``: the first label's, worked out already;
        None with one label: the job's figures are its)."""
        if self.progressive.each is None:
            return None
        return {name: first if t == 0 else live_aucs(p.lifetime, p.windows)
                for t, (name, p) in enumerate(zip(self.job.tasks, self.progressive.by_task,
                                                  strict=True))}

    def final_lag(self) -> tuple[int, int, float]:
        """The broker's lag as the pass ends (messages, events, seconds; -1: unknown), once
        every acknowledgement is settled (the loop waits for it, once). Nothing waiting is a
        lag of 0 seconds; otherwise the seconds since the newest event trained."""
        r = self.reader
        if r is None:
            return -1, -1, -1.0
        lag = r.final_lag()
        if lag is None:
            return -1, -1, -1.0
        per_message = r.events_read / r.messages_read if r.messages_read else 1.0
        seconds = 0.0 if not lag else max(0.0, time.time() - self.newest_trained_s)
        return lag, round(lag * per_message), round(seconds, 3)

    def scores(self) -> StreamScores:
        """This feeder's scores and counts for control's summary (at the pass's end)."""
        h = self.progressive.first.lifetime
        bins = np.flatnonzero(h.counts.reshape(-1))
        each = self.progressive.each
        task_counts = each.counts().reshape(-1) if each is not None else np.zeros(0, np.int64)
        task_bins = np.flatnonzero(task_counts)
        lag_messages, lag_events, lag_s = self.final_lag()
        return StreamScores(
            events_read=self.events_taken,
            events_trained=self.trained(), events_rejected=self.events_rejected,
            messages_acked=self.messages_acked, lag_messages=lag_messages,
            lag_events=lag_events, lag_s=lag_s, loss_sum=h.loss_sum,
            windows=[w.as_dict() for w in self.progressive.first.windows],
            bins=bins.astype(np.int64), counts=h.counts.reshape(-1)[bins].astype(np.int64),
            task_loss_sums=[] if each is None else each.loss_sums().tolist(),
            task_prob_sums=[] if each is None else each.prob_sums().tolist(),
            task_windows=self.progressive.task_windows(),
            task_bins=task_bins.astype(np.int64),
            task_counts=task_counts[task_bins].astype(np.int64),
            join=self.labels.counts() if self.labels is not None else {})

    def close(self) -> None:
        if self.opening is not None:   # (what it opens, it closes)
            self.opening.abandon()
        if self.sent_log is not None:
            self.sent_log.close()
        if self.labels is not None:
            self.labels.close()
        if self.reader is not None:
            self.reader.shut("the stream's")
