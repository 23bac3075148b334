"""A stream feeder's log of the batches it sent (``SentLog``): which events each one holds, so
that a feeder killed and started again knows which events of the messages the broker delivers
again were trained (docs/streams.md, exactly once).

A batch's events are named by runs of consecutive lines of their messages: one fixed-size
record per run (the batch's seq, the message's partition and position, its first and last
line), all of a batch's records appended with one ``os.write`` on a file opened ``O_APPEND``
before the batch goes to the ledger, as the ack log's records are: in the kernel once the call
returns, so that they survive the process being killed (not the machine losing power: a whole
job's checkpoint covers that). A partial record at the end is cut off when read.

The log is kept in segments of ``per_segment`` batches, each process writing segments of its
own (numbered on from the last one on disk). Only the newest batches can still be needed: a
batch is acknowledged within the ledger's bound on batches in flight, and its messages to the
broker within moments of that, so when a segment fills, the segments before the one before it
are removed: the log's disk stays bounded (about 7 MB a segment of 65,536 batches).

The messages acknowledged to the broker are recorded too (``mark_messages_acked``, a record of
seq -1 each): a restarted feeder waits at the stream's end for those of its dead processes'
messages the broker has not had acknowledged, to acknowledge them (docs/streams.md).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

RECORD = np.dtype([("seq", "<i8"), ("partition", "<i4"), ("position", "<i8"),
                   ("first", "<i4"), ("last", "<i4")])
PER_SEGMENT = 65_536   # batches a segment
UNACKED, ACKED = -1, -2   # a record's partition: a mark (``mark_unacked``, ``mark_acked``),
                         # not a run
MESSAGE_ACKED = -1       # a record's seq: a message acknowledged to the broker, not a run


class SentLog:
    def __init__(self, directory: Path, node: str, per_segment: int = PER_SEGMENT):
        directory.mkdir(parents=True, exist_ok=True)
        self.directory, self.node, self.per_segment = directory, node, per_segment
        on_disk = self.segments()
        self.number = (on_disk[-1] + 1) if on_disk else 0
        self.batches = 0       # in the segment being written
        self.fd: int | None = None

    def _path(self, number: int) -> Path:
        return self.directory / f"{self.node}.sent.{number:06d}"

    def segments(self) -> list[int]:
        prefix = f"{self.node}.sent."
        return sorted(int(p.name[len(prefix):]) for p in self.directory.glob(prefix + "*")
                      if p.name[len(prefix):].isdigit())

    def read(self) -> np.ndarray:
        """Every record on disk (of this process and the dead ones before it), oldest first."""
        parts = []
        for number in self.segments():
            data = self._path(number).read_bytes()
            whole = len(data) - len(data) % RECORD.itemsize   # (a crash mid-write)
            parts.append(np.frombuffer(data[:whole], dtype=RECORD))
        return np.concatenate(parts) if parts else np.zeros(0, dtype=RECORD)

    def append(self, seq: int, runs: Sequence[tuple[int, int, int, int]]) -> None:
        """Batch ``seq``'s runs (partition, position, first line, last line), before it is
        sent."""
        if self.fd is not None and self.batches >= self.per_segment:
            self._next_segment()
        self.append_records(np.array([(seq, *run) for run in runs], dtype=RECORD))
        self.batches += 1

    def mark_unacked(self, seqs: Sequence[int]) -> None:
        """Dead batches not acknowledged when this process started (a record of partition -1
        each): the ack log counts every number below this process's first as done (so that
        its holes do not keep it growing), and a process started after this one dies reads
        here which of them were not."""
        if seqs:
            self.append_records(np.array([(s, UNACKED, -1, 0, 0) for s in seqs], dtype=RECORD))

    def mark_acked(self, seq: int) -> None:
        """A dead batch a worker acknowledged to this process (the ack log counts it, but its
        number is below this process's first, all of which it counts done)."""
        self.append_records(np.array([(seq, ACKED, -1, 0, 0)], dtype=RECORD))

    def mark_messages_acked(self, messages: Sequence[tuple[int, int]]) -> None:
        """These messages (partition, position) are acknowledged to the broker."""
        if messages:
            self.append_records(np.array([(MESSAGE_ACKED, p, q, -1, -1) for p, q in messages],
                                         dtype=RECORD))

    def append_records(self, records: np.ndarray) -> None:
        if self.fd is None:
            self._next_segment()
        os.write(self.fd, records.tobytes())   # type: ignore[arg-type]

    def _next_segment(self) -> None:
        filled = self.fd is not None
        if self.fd is not None:
            os.close(self.fd)
            self.number += 1
        self.fd = os.open(self._path(self.number), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.batches = 0
        if not filled:   # a process's first segment: a dead one's may still be needed
            return
        for number in self.segments():   # all but this one and the one before it
            if number < self.number - 1:
                self._path(number).unlink(missing_ok=True)

    def clear(self) -> None:
        """Every segment removed (a job gone back to a checkpoint: nothing was in flight)."""
        self.close()
        for number in self.segments():
            self._path(number).unlink(missing_ok=True)
        self.number, self.batches = 0, 0

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
