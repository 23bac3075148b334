"""A feeder's pass over its parts (pure; no sockets): each part's batches come from a stream
(``roles.data.stream``) in their replayable order; ``open`` parts are read at a time, their
batches taken in turn (so that consecutive batches come from different places of the data),
the next part joining when one is done (and warmed before: the next ``open // 2`` parts'
batches begin to be made while the others are read, so that their first do not hold the pass
up; this holds 1.5 times the shuffle buffer at most). Batches acknowledged
before (by this feeder's previous process, or by a lost feeder whose part this is now) are made
again and skipped, never sent. A restarted feeder may need a batch its dead process sent before
the stream gets to it (a worker holds it, or acknowledges it): ``peek`` makes it now — the
batches before it wait, made, to be sent in their turn — and ``claim`` takes it out of the pass.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

from roles.algorithms.feeding.ledger import PartProgress
from roles.data.stream import Samples
from roles.protocol.datapath import make_batch_id, split_batch_id

Made = Callable[[int, int, int, bool], None]  # (part, seq, samples, done before)


class PartStream:
    """One part's batches in one pass."""

    def __init__(self, part: int, batches: Callable[[], Iterator[Samples]],
                 done: PartProgress | None, made: Made):
        self.part = part
        self._open = batches
        self._batches: Iterator[Samples] | None = None
        self.done = done
        self.made = made
        self.next_seq = 0                    # the seq of the next batch the stream makes
        self.ahead: dict[int, Samples] = {}  # made and not given out yet
        self.finished = False                # the stream has no batch left to make

    def _make(self) -> tuple[int, Samples] | None:
        if self.finished:
            return None
        if self._batches is None:
            self._batches = self._open()  # the part is read only once it is needed
        batch = next(self._batches, None)
        if batch is None:
            self.finished = True
            self._batches = None
            return None
        seq = self.next_seq
        self.next_seq += 1
        before = self.done is not None and self.done.done(seq)
        self.made(self.part, seq, len(batch), before)
        return None if before else (seq, batch)

    def _fill(self) -> None:
        """Make batches until one is ahead, or the stream is over."""
        while not self.ahead and not self.finished:
            got = self._make()
            if got is not None:
                self.ahead[got[0]] = got[1]

    def warm(self) -> None:
        """Begin making its batches before its turn: a part's first batch waits for its share
        of the shuffle buffer to fill, which its maker (``open``) then does meanwhile."""
        if self._batches is None and not self.finished:
            self._batches = self._open()

    def take(self) -> tuple[int, Samples] | None:
        self._fill()
        if not self.ahead:
            return None
        seq = min(self.ahead)
        return seq, self.ahead.pop(seq)

    def exhausted(self) -> bool:
        self._fill()
        return not self.ahead

    @property
    def over(self) -> bool:
        """Read to its end and every batch given out (known without reading)."""
        return self.finished and not self.ahead

    def peek(self, seq: int) -> Samples | None:
        """Batch ``seq`` if this pass has not given it out (made now if need be)."""
        while seq not in self.ahead and seq >= self.next_seq and not self.finished:
            got = self._make()
            if got is not None:
                self.ahead[got[0]] = got[1]
        return self.ahead.get(seq)

    def claim(self, seq: int) -> None:
        """Batch ``seq`` (peeked) leaves the pass: it was sent by a previous process."""
        self.ahead.pop(seq, None)


class Pass(Protocol):
    """What the ledger, a restart's reclaiming and the tally use of the pass under way: a
    ``FeedingPass`` over files' parts, or a stream job's ``StreamPass``."""

    epoch: int
    eval: bool

    @property
    def parts(self) -> list[int]: ...

    def take(self) -> tuple[int, Samples] | None: ...

    def exhausted(self) -> bool: ...

    def peek(self, batch_id: int) -> Samples | None: ...

    def claim(self, batch_id: int) -> None: ...


class FeedingPass:
    """A pass of ``epoch`` (training or ``eval``) over the streams of some parts, ``open`` of
    them at a time."""

    def __init__(self, epoch: int, eval: bool, streams: list[PartStream] | None = None,
                 open: int = 1):
        self.epoch = epoch
        self.eval = eval
        self.streams: list[PartStream] = list(streams or [])
        self.open = max(1, open)
        self.turn = 0

    @property
    def parts(self) -> list[int]:
        return [s.part for s in self.streams]

    def add(self, stream: PartStream) -> None:
        """A part joins the pass (taken over from a lost feeder)."""
        self.streams.append(stream)

    def _window(self) -> list[PartStream]:
        """The streams read now: the first ``open`` not done, and the ``open // 2`` (at least
        one) after them warmed (parts of one size read in turn end together, and their
        successors would all start cold at once; each warmed part holds its share of the
        shuffle buffer before its turn)."""
        window: list[PartStream] = []
        warm, warmed = max(1, self.open // 2), 0
        for s in self.streams:
            if s.over:
                continue
            if len(window) < self.open:
                window.append(s)
                continue
            if warmed == warm:
                break
            s.warm()
            warmed += 1
        return window

    def take(self) -> tuple[int, Samples] | None:
        """The next batch (its id and samples), or None when every part is done."""
        while window := self._window():
            stream = window[self.turn % len(window)]
            self.turn += 1
            got = stream.take()
            if got is not None:
                return make_batch_id(self.epoch, stream.part, got[0]), got[1]
        return None

    def exhausted(self) -> bool:
        while window := self._window():
            if any(not s.exhausted() for s in window):
                return False
        return True

    def stream_of(self, batch_id: int) -> tuple[PartStream, int] | None:
        epoch, part, seq = split_batch_id(batch_id)
        if epoch != self.epoch:
            return None
        stream = next((s for s in self.streams if s.part == part), None)
        return None if stream is None else (stream, seq)

    def peek(self, batch_id: int) -> Samples | None:
        found = self.stream_of(batch_id)
        return None if found is None else found[0].peek(found[1])

    def claim(self, batch_id: int) -> None:
        found = self.stream_of(batch_id)
        if found is not None:
            found[0].claim(found[1])
