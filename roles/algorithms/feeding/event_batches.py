"""A stream's events cut into training batches (``EventBatcher``): pure, owned by a feeder.

Events come prepared (``Samples``), each with the message it came from (partition, position),
in the order they were read. A batch leaves when ``batch_size`` events wait, or, partial, once
its oldest event has waited ``linger_s`` (``[stream] linger_ms``): a quiet stream's events are
not held back for a batch that fills slowly. Each batch says which messages its events came
from and how many of each (``Batch.messages``, ``Batch.counts``): what the feeder tells its
``MessageTracker`` once the batch is trained. An event whose label came in a message of its
own (``[stream.labels]``) also names that message (``label_origin``; -1 where none): a batch
says those too (``Batch.label_messages``, ``label_counts``). Events stay in arrival order (a
stream is not shuffled: its order is its time).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from roles.data.stream import Samples


@dataclass(frozen=True)
class Batch:
    samples: Samples
    messages: list[tuple[int, int]]   # (partition, position) of the messages it draws on
    counts: list[int]                 # its events from each
    event_time_s: np.ndarray          # float64 [n]: each event's time
    label_messages: list[tuple[int, int]] = field(default_factory=list)   # the labels' messages
    label_counts: list[int] = field(default_factory=list)
    # its events' lines in their messages, as runs of consecutive lines: (partition, position,
    # first line, last line), what the feeder's log of sent batches records
    runs: list[tuple[int, int, int, int]] = field(default_factory=list)


@dataclass
class _Chunk:
    samples: Samples
    origin: np.ndarray   # int64 [n, 2]: (partition, position)
    times: np.ndarray    # float64 [n]
    label_origin: np.ndarray | None   # int64 [n, 2], -1 where the label came with the event
    arrived: float       # when it was added (the loop's clock)
    lines: np.ndarray | None = None   # int64 [n]: each event's line in its message
    at: int = 0          # events of it already batched


class EventBatcher:
    def __init__(self, batch_size: int, linger_s: float):
        if batch_size < 1 or linger_s < 0:
            raise ValueError("a batch holds at least one event; linger_s is not negative")
        self.batch_size, self.linger_s = batch_size, linger_s
        self._chunks: deque[_Chunk] = deque()
        self._waiting = 0

    def __len__(self) -> int:
        return self._waiting

    def add(self, samples: Samples, origin: np.ndarray, times: np.ndarray, now: float,
            label_origin: np.ndarray | None = None, lines: np.ndarray | None = None) -> None:
        """Events read, in order: ``origin`` [n, 2] (partition, position), ``times`` their
        event times, ``label_origin`` [n, 2] their labels' messages (-1: none), ``lines``
        their lines in their messages (None: not known; the batches then say no ``runs``)."""
        if len(samples) != len(origin) or len(samples) != len(times) or \
                (label_origin is not None and len(label_origin) != len(samples)) or \
                (lines is not None and len(lines) != len(samples)):
            raise ValueError("one origin and one time per event")
        if len(samples):
            self._chunks.append(_Chunk(
                samples, np.asarray(origin, np.int64).reshape(-1, 2),
                np.asarray(times, np.float64),
                None if label_origin is None else np.asarray(label_origin, np.int64).reshape(
                    -1, 2), now, None if lines is None else np.asarray(lines, np.int64)))
            self._waiting += len(samples)

    def drop(self, partitions: set[int]) -> np.ndarray:
        """Set aside the waiting events of messages of ``partitions`` none of whose events
        is in a batch yet (a message a batch has begun stays whole, to be trained); their
        (partition, position) rows [n, 2], one per event."""
        begun = None
        if self._chunks and self._chunks[0].at:
            head = self._chunks[0]
            begun = head.origin[head.at - 1]
        out: list[np.ndarray] = []
        kept: deque[_Chunk] = deque()
        for chunk in self._chunks:
            left = np.arange(chunk.at, len(chunk.samples))
            origin = chunk.origin[left]
            gone = np.isin(origin[:, 0], list(partitions))
            if begun is not None:
                gone &= ~((origin[:, 0] == begun[0]) & (origin[:, 1] == begun[1]))
            if gone.any():
                out.append(origin[gone])
                self._waiting -= int(gone.sum())
                if gone.all() and not chunk.at:
                    continue
                # the rows batched already stay (``at`` says where the begun message is)
                at = np.concatenate([np.arange(chunk.at), left[~gone]])
                chunk = _Chunk(chunk.samples.take(at), chunk.origin[at], chunk.times[at],
                               None if chunk.label_origin is None else chunk.label_origin[at],
                               chunk.arrived, None if chunk.lines is None else chunk.lines[at],
                               chunk.at)
                if chunk.at == len(chunk.samples):
                    continue
            kept.append(chunk)
        self._chunks = kept
        return np.concatenate(out) if out else np.zeros((0, 2), np.int64)

    def due(self) -> float | None:
        """When the waiting events' partial batch leaves (None: nothing waits)."""
        return self._chunks[0].arrived + self.linger_s if self._chunks else None

    def take(self, now: float, flush: bool = False) -> Batch | None:
        """The next batch: full, or partial once due (or whatever waits with ``flush``)."""
        if not self._waiting:
            return None
        due = self.due()
        if self._waiting < self.batch_size and not flush and due is not None and now < due:
            return None
        want = min(self.batch_size, self._waiting)
        parts, origins, times, labelled, lined = [], [], [], [], []
        while want:
            chunk = self._chunks[0]
            n = min(want, len(chunk.samples) - chunk.at)
            rows = slice(chunk.at, chunk.at + n)
            parts.append(chunk.samples.take(rows))
            origins.append(chunk.origin[rows])
            times.append(chunk.times[rows])
            if chunk.label_origin is not None:
                labelled.append(chunk.label_origin[rows])
            lined.append(None if chunk.lines is None else chunk.lines[rows])
            chunk.at += n
            want -= n
            if chunk.at == len(chunk.samples):
                self._chunks.popleft()
        samples = parts[0] if len(parts) == 1 else Samples.join(parts)
        self._waiting -= len(samples)
        origin = np.concatenate(origins)
        lines = lines_of(lined)
        where, counts, runs = _tally(origin, lines)
        label_where, label_counts = _messages(np.concatenate(labelled)) if labelled else ([], [])
        return Batch(samples, where, counts, np.concatenate(times), label_where, label_counts,
                     runs)


def lines_of(parts: list[np.ndarray | None]) -> np.ndarray | None:
    """The events' lines in their messages, part after part; None unless every part knows
    its own (a batch then says no ``runs``)."""
    known = [x for x in parts if x is not None]
    return np.concatenate(known) if known and len(known) == len(parts) else None


def _tally(origin: np.ndarray, lines: np.ndarray | None
           ) -> tuple[list[tuple[int, int]], list[int], list[tuple[int, int, int, int]]]:
    """The messages of ``origin`` [n, 2] (partition, position) in order, the events of each,
    and (with ``lines``, each event's line in its message) the runs of consecutive lines of one
    message: (partition, position, first line, last line). One pass where the events come in
    that order already (a stream's usual case: one sort of a few hundred rows cost more than
    the rest of a batch's making), else sorted first."""
    if not len(origin):
        return [], [], []
    p, q = origin[:, 0], origin[:, 1]
    same = (p[1:] == p[:-1]) & (q[1:] == q[:-1])
    ahead = (p[1:] > p[:-1]) | ((p[1:] == p[:-1]) & (q[1:] > q[:-1]))
    if not (ahead | (same if lines is None else same & (lines[1:] > lines[:-1]))).all():
        order = np.lexsort((q, p) if lines is None else (lines, q, p))
        p, q = p[order], q[order]
        lines = None if lines is None else lines[order]
        same = (p[1:] == p[:-1]) & (q[1:] == q[:-1])
    starts = np.flatnonzero(np.concatenate(([True], ~same)))
    counts = np.diff(np.append(starts, len(p)))
    messages = list(zip(p[starts].tolist(), q[starts].tolist(), strict=True))
    if lines is None:
        return messages, counts.tolist(), []
    first = np.flatnonzero(np.concatenate(([True], ~same | (lines[1:] != lines[:-1] + 1))))
    last = np.append(first[1:], len(lines)) - 1
    runs = list(zip(p[first].tolist(), q[first].tolist(), lines[first].tolist(),
                    lines[last].tolist(), strict=True))
    return messages, counts.tolist(), runs


def _messages(origin: np.ndarray) -> tuple[list[tuple[int, int]], list[int]]:
    """The messages named (rows of -1 name none), and their events in ``origin``."""
    where, counts, _ = _tally(origin[origin[:, 0] >= 0], None)
    return where, counts
