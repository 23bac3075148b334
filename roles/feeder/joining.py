"""A stream job's labels from a topic of their own (``[stream.labels]``), joined in the feeder
(``LabelSide``, a part of ``StreamSide``): docs/streams.md, "Labels that arrive later".

Impressions (the job's topic, no label) are prepared as any event and wait in the join
(``roles.algorithms.feeding.label_join``) for the label with the same id
(``[stream.labels] id_field``) from the labels' topic, read by a reader of their own; each
leaves for the batcher with its label, or as a negative once ``window_s`` of event time has
passed. The join's clock is the newest event time seen on either topic; when neither brings an
event for ``IDLE_S``, it moves on at the wall clock's pace (a quiet stream's last impressions
still leave after their window).

Nothing is lost to a feeder's death: the broker is the join's durable state. An impression's
message is acknowledged once its events are trained (as without labels); a label's message once
each of its labels is trained with its impression (the batch names the label's message:
``EventBatcher``'s ``label_origin``) or has left untrained (late: its impression already
trained; unmatched after the window; a second label of an id; malformed). A killed feeder's
impressions and labels not yet trained come again from the broker and join again.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import deque
from dataclasses import dataclass

import numpy as np

from roles.algorithms.feeding.event_batches import Batch, lines_of
from roles.algorithms.feeding.label_join import Joined, LabelJoin
from roles.data.readers import Schema
from roles.data.rejected import RejectedRows
from roles.data.stream import Samples
from roles.events import BrokerError, Consumer, Delivery, open_consumer
from roles.events.decode import EventDecoder, message_name
from roles.events.reader import EventReader
from roles.events.tracker import MessageTracker
from roles.job.settings import Job

log = logging.getLogger(__name__)
IDLE_S = 1.0   # no event on either topic this long: the join's clock follows the wall clock
LABELS_FETCHED = 1000   # label messages asked for in one fetch


@dataclass
class Ready:
    """Impressions that left the join, for the batcher: their samples (labels set), their
    messages, event times and labels' messages (-1: expired, no label)."""

    samples: Samples
    origin: np.ndarray         # int64 [n, 2]
    times: np.ndarray          # float64 [n]
    label_origin: np.ndarray   # int64 [n, 2]
    lines: np.ndarray | None = None   # int64 [n]: each impression's line in its message


@dataclass
class _Block:
    first: int            # the handle of its first impression
    samples: Samples
    origin: np.ndarray
    times: np.ndarray
    ids: np.ndarray
    left: int             # its impressions still waiting
    lines: np.ndarray | None = None   # each impression's line in its message (None: not known)


class PendingImpressions:
    """Prepared impressions waiting in the join, by handle (a count of impressions ever
    added), a block as they came; a block is let go once it and every block before it has
    left (the join lets impressions go in arrival order but for those joined early: at most a
    window's blocks are held)."""

    def __init__(self) -> None:
        self.blocks: deque[_Block] = deque()
        self.next = 0
        self.held = 0

    def __len__(self) -> int:
        return self.held

    def add(self, samples: Samples, origin: np.ndarray, times: np.ndarray,
            ids: np.ndarray, lines: np.ndarray | None = None) -> np.ndarray:
        n = len(samples)
        handles = np.arange(self.next, self.next + n, dtype=np.int64)
        if n:
            self.blocks.append(_Block(self.next, samples, origin, times, ids, n, lines))
            self.next += n
            self.held += n
        return handles

    def take(self, joined: Joined) -> tuple[Samples, np.ndarray, np.ndarray, np.ndarray,
                                            np.ndarray, np.ndarray | None]:
        """The impressions ``joined`` names, labelled, in handle order: (samples, origin,
        times, ids, the order of ``joined``'s entries they come in, their lines in their
        messages, None where not known)."""
        order = np.argsort(joined.handles, kind="stable")
        handles, labels = joined.handles[order], joined.labels[order]
        firsts = np.fromiter((b.first for b in self.blocks), np.int64, len(self.blocks))
        at = np.searchsorted(firsts, handles, side="right") - 1
        if len(handles) and (at.min() < 0 or handles.max() >= self.next):
            raise ValueError("a handle the join was not given")
        parts, origins, times, ids, lines = [], [], [], [], []
        for k in np.unique(at).tolist():
            block = self.blocks[k]
            rows = handles[at == k] - block.first
            parts.append(block.samples.take(rows))
            origins.append(block.origin[rows])
            times.append(block.times[rows])
            ids.append(block.ids[rows])
            lines.append(None if block.lines is None else block.lines[rows])
            block.left -= len(rows)
        self.held -= len(handles)
        while self.blocks and self.blocks[0].left == 0:
            self.blocks.popleft()
        if not parts:
            return (Samples.empty(0, 0), np.zeros((0, 2), np.int64), np.zeros(0),
                    np.zeros(0, np.int64), order, np.zeros(0, np.int64))
        samples = parts[0] if len(parts) == 1 else Samples.join(parts)
        samples = dataclasses.replace(samples, labels=labels.astype(np.float32))
        return samples, np.concatenate(origins), np.concatenate(times), \
            np.concatenate(ids), order, lines_of(lines)


class LabelSide:
    """``job``'s labels topic, read and joined; ``rejected``: where malformed labels go."""

    def __init__(self, job: Job, rejected: RejectedRows):
        self.job, self.rejected = job, rejected
        self.config = job.stream.labels
        self.join = LabelJoin(self.config.window_s)
        self.pending = PendingImpressions()
        self.tracker = MessageTracker()           # the labels' messages
        self.waiting: dict[int, tuple[int, int]] = {}   # id -> message of a label held
        self.reader: EventReader | None = None
        self.labels_read = 0
        self.labels_rejected = 0
        self.messages_acked = 0
        self.last_event_at = time.monotonic()     # on either topic
        self.event_clock_at = -np.inf             # the newest event time seen, on either

    def decoder(self) -> EventDecoder:
        """The labels' decoder (ValueError: the job's settings cannot make one)."""
        d = self.job.data
        schema = Schema(label=d.label, dense=[], sparse=[], positive=tuple(d.positive),
                        negative=tuple(d.negative), timestamp=d.timestamp)
        return EventDecoder(schema, "json", self.config.topic, id_field=self.config.id_field)

    def connect(self, group: str) -> Consumer:
        """The labels' consumer (run off the loop: ``roles.events.opening``); BrokerError in
        one line when it cannot be opened."""
        s = self.job.stream
        try:
            return open_consumer(s.url, self.config.topic, f"{group}-labels", s.start,
                                 dict(s.options) or None, s.ack_wait_s)
        except (BrokerError, ValueError) as exc:
            raise BrokerError(f"cannot read the labels {s.url} {self.config.topic}: "
                              f"{exc}") from None

    def start(self, consumer: Consumer, decoder: EventDecoder, working_s: float) -> None:
        """Reading the labels' topic, once its consumer is open."""
        s = self.job.stream
        # a label is a message of its own, as clicks come: fetched a thousand at a time
        self.reader = EventReader(consumer, decoder, max_messages=10_000,
                                  fetch_messages=LABELS_FETCHED, working_s=working_s)
        log.info("joining labels from %s %s by %r within %g s of event time", s.url,
                 self.config.topic, self.config.id_field, self.config.window_s)

    # -- in ------------------------------------------------------------------------------------
    def impressions(self, samples: Samples, origin: np.ndarray, times: np.ndarray,
                    ids: np.ndarray, now: float, lines: np.ndarray | None = None
                    ) -> tuple[Ready | None, np.ndarray]:
        """Prepared impressions in (``lines``: each one's line in its message, for the log
        of sent batches): (what leaves the join now, the messages of duplicates (int64
        [d, 2]), whose events are done with)."""
        self.saw(times, now)
        handles = self.pending.add(samples, origin, times, ids, lines)
        joined, duplicates = self.join.add_impressions(ids, times, handles)
        dup_origin = np.zeros((0, 2), np.int64)
        if len(duplicates):   # left out of the join: not trained
            gone = Joined(duplicates, np.zeros(len(duplicates), np.float32))
            _, dup_origin, _, _, _, _ = self.pending.take(gone)
        return self._leaving(joined)[0], dup_origin

    def poll(self, now: float, running: bool) -> Ready | None:
        """The labels read since the last poll, joined; and when both topics are quiet the
        join's clock moved on, once it is ``running`` (not while the feeder waits for its
        statistics: its impressions are not in the join yet)."""
        out = []
        if self.reader is not None:
            for deliveries, decoded in self.reader.take():
                out.append(self._labels(deliveries, decoded, now))
        if running and now - self.last_event_at >= IDLE_S and np.isfinite(self.event_clock_at):
            out.append(self._leaving(self.join.advance(
                self.event_clock_at + (now - self.last_event_at)))[0])
        self._release_unmatched()
        return _joined([r for r in out if r is not None])

    def _labels(self, deliveries: list[Delivery], decoded, now: float) -> Ready | None:
        fresh = self.tracker.add(deliveries, now)
        keep = np.zeros(len(deliveries), dtype=bool)
        keep[fresh] = True
        self.labels_read += decoded.events
        rows = keep[decoded.message]
        named = {message_name(self.config.topic, deliveries[i]) for i in fresh}
        rejected = [r for r in decoded.rejected if r.file in named]
        if rejected:
            self.rejected.append(rejected)
            self.labels_rejected += len(rejected)
        message = decoded.message[rows]
        ids, times = decoded.ids[rows], decoded.event_time_s[rows]
        labels = decoded.block.labels[rows]
        per_message = np.bincount(message, minlength=len(deliveries))
        for i in fresh:
            self.tracker.events(deliveries[i], int(per_message[i]))
        if not len(ids):
            return None
        self.saw(times, now)
        where = [(deliveries[i].partition, deliveries[i].position) for i in message.tolist()]
        held_before = self.join.labels.find(ids) >= 0
        arriving: dict[int, tuple[int, int]] = {}
        for i, o in zip(ids.tolist(), where, strict=True):
            arriving.setdefault(i, o)   # (the first label of an id is the one joined)
        ready, joined_now = self._leaving(self.join.add_labels(ids, labels, times), arriving)
        # each label: trained with its impression (the batch names its message), held (its
        # message remembered), or done with now (late, a second label of an id)
        first = np.zeros(len(ids), dtype=bool)
        first[np.unique(ids, return_index=True)[1]] = True
        held_now = self.join.labels.find(ids) >= 0
        done = []
        for k, (i, o) in enumerate(zip(ids.tolist(), where, strict=True)):
            if first[k] and i in joined_now:
                continue
            if first[k] and held_now[k] and not held_before[k]:
                self.waiting[i] = o
                continue
            done.append(o)
        self._done(done)
        return ready

    def _leaving(self, joined: Joined, arriving: dict[int, tuple[int, int]] | None = None
                 ) -> tuple[Ready | None, set[int]]:
        """Impressions that left the join, each with its label's message: one the join held
        (``waiting``), or one of the labels ``arriving`` now (id -> message), or none (expired
        as a negative). Also: the ids joined with an arriving label."""
        if not len(joined):
            return None, set()
        samples, origin, times, ids, _, lines = self.pending.take(joined)
        label_origin = np.full((len(ids), 2), -1, dtype=np.int64)
        joined_now = set()
        for k, i in enumerate(ids.tolist()):
            o = self.waiting.pop(i, None)
            if o is None and arriving is not None and (o := arriving.get(i)) is not None:
                joined_now.add(i)
            if o is not None:
                label_origin[k] = o
        return Ready(samples, origin, times, label_origin, lines), joined_now

    def saw(self, times: np.ndarray, now: float) -> None:
        """Events (of either topic) came now, of these event times."""
        self.last_event_at = now
        if len(times):
            self.event_clock_at = max(self.event_clock_at, float(times.max()))

    def _release_unmatched(self) -> None:
        self._done([o for i in self.join.unmatched_ids().tolist()
                    if (o := self.waiting.pop(i, None)) is not None])

    def _done(self, messages: list[tuple[int, int]]) -> None:
        self.tracker.trained_rows(np.asarray(messages, np.int64).reshape(-1, 2))
        self._acknowledge()

    # -- out -----------------------------------------------------------------------------------
    def trained(self, batch: Batch) -> None:
        """A batch was trained: the labels it names are done with."""
        if batch.label_messages:
            self.tracker.trained(batch.label_messages, batch.label_counts)
            self._acknowledge()

    def _acknowledge(self) -> None:
        released = self.tracker.done()
        if released:
            if self.reader is not None:
                self.reader.done(released)
            self.messages_acked += len(released)

    def overdue(self, now: float, every: float) -> None:
        """Label messages held long: said in progress to the broker."""
        late = self.tracker.overdue(now, every)
        if late and self.reader is not None:
            self.reader.working(late)

    def end(self) -> None:
        if self.reader is not None:
            self.reader.stop_fetching()

    def failed(self) -> bool:
        return self.reader is not None and not self.reader.alive()

    def counts(self) -> dict[str, int]:
        c = self.join.counts
        return {"joined": c.joined, "expired_negative": c.expired_negative,
                "labels_late": c.labels_late, "labels_unmatched": c.labels_unmatched,
                "duplicate_impressions": c.duplicate_impressions,
                "duplicate_labels": c.duplicate_labels, "labels_read": self.labels_read,
                "labels_rejected": self.labels_rejected,
                "impressions_waiting": len(self.pending), "labels_waiting": len(self.waiting),
                "label_messages_acked": self.messages_acked}

    def close(self) -> None:
        if self.reader is not None:
            self.reader.shut("the labels'")


def _joined(parts: list[Ready]) -> Ready | None:
    if not parts:
        return None
    if len(parts) == 1:
        return parts[0]
    return Ready(Samples.join([p.samples for p in parts]),
                 np.concatenate([p.origin for p in parts]),
                 np.concatenate([p.times for p in parts]),
                 np.concatenate([p.label_origin for p in parts]),
                 lines_of([p.lines for p in parts]))
