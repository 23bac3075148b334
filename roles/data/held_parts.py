"""Parts held in memory between passes (``[data] hold_mb``).

A job that reads its parts more than once (``[train] epochs`` > 1: every epoch's training pass
and evaluation read every part) reads each part from its file once, parses it (the text's
columns, the keys hashed: ``roles.data.stream.Parsed``) and keeps what it parsed; later passes
prepare those rows again (the dense transform, the weighting, the shuffle: a few milliseconds
for tens of thousands of rows) rather than reading, decompressing and parsing the text again
(tens of milliseconds for as many, on the core the workers share).

Bounded: a part is held only while the parts held and it fit in ``hold_mb`` (its size estimated
from its rows when its read begins, counted as its blocks are parsed: a read that outgrows what
is left stops keeping its blocks); the parts that do not fit are read from their files every
pass, as without it, so memory does not grow with the data set. Nothing is evicted: every pass
reads each part once, so whichever parts are held, each saves one read per pass (evicting the
least recently used would drop every part just before its next read). A part read only in part
(a pass stopped, a stream dropped) is not held. Used from the feeder's reader thread (the reads)
and its loop (``drop``, the counters): a lock guards the books.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator

from roles.data.stream import Parsed

MB = 1 << 20


class HeldParts:
    def __init__(self, budget_mb: float, row_bytes: int):
        self.budget = int(budget_mb * MB)
        self.row_bytes = row_bytes         # a parsed row's bytes, for a part's estimate
        self.parts: dict[int, list[Parsed]] = {}
        self.sizes: dict[int, int] = {}    # bytes of each part held or reserved
        self.reads = 0                     # passes over a part served from memory
        self.lock = threading.Lock()

    def used(self) -> int:
        return sum(self.sizes.values())

    def fits(self, number: int, rows: int) -> bool:
        """Part ``number``, of about ``rows`` rows, is not held and would be (now)."""
        with self.lock:
            return number not in self.sizes \
                and self.used() + rows * self.row_bytes <= self.budget

    def get(self, number: int) -> list[Parsed] | None:
        with self.lock:
            held = self.parts.get(number)
            if held is not None:
                self.reads += 1
            return held

    def _reserve(self, number: int, nbytes: int) -> bool:
        with self.lock:
            if number in self.sizes or self.used() + nbytes > self.budget:
                return False
            self.sizes[number] = nbytes
            return True

    def _grow(self, number: int, nbytes: int) -> bool:
        """The part's read has parsed ``nbytes`` so far: still reserved (not dropped
        meanwhile) and within the budget?"""
        with self.lock:
            if number not in self.sizes:
                return False
            if nbytes <= self.sizes[number]:
                return True
            if self.used() - self.sizes[number] + nbytes > self.budget:
                return False
            self.sizes[number] = nbytes
            return True

    def _release(self, number: int) -> None:
        with self.lock:
            if number not in self.parts:
                self.sizes.pop(number, None)

    def _keep(self, number: int, blocks: list[Parsed], nbytes: int) -> None:
        with self.lock:
            if number in self.sizes:   # (not dropped meanwhile)
                self.parts[number], self.sizes[number] = blocks, nbytes

    def read(self, number: int, rows: int, parse: Iterable[Parsed]) -> Iterator[Parsed]:
        """Part ``number`` (of about ``rows`` rows): from memory if it is held, else from
        ``parse`` (its blocks as read and parsed), holding them once they have all been read
        if they fit. The blocks held are read-only: a pass that changed one in place would
        change every later pass's rows."""
        held = self.get(number)
        if held is not None:
            yield from held
            return
        kept: list[Parsed] | None = [] if self._reserve(number, rows * self.row_bytes) \
            else None
        size, done = 0, False
        try:
            for block in parse:
                if kept is not None:
                    size += block.freeze()
                    if self._grow(number, size):
                        kept.append(block)
                    else:
                        kept = None
                        self._release(number)
                yield block
            done = True
        finally:
            if kept is not None and done:
                self._keep(number, kept, size)
            elif kept is not None:
                self._release(number)

    def drop(self, keep: Iterable[int]) -> None:
        """Hold no part but those in ``keep`` (this feeder's parts, control's PartMap)."""
        mine = set(keep)
        with self.lock:
            for number in [n for n in self.sizes if n not in mine]:
                self.sizes.pop(number, None)
                self.parts.pop(number, None)

    def counters(self) -> dict[str, float | int]:
        with self.lock:
            return {"parts_held": len(self.parts), "held_mb": round(self.used() / MB, 1),
                    "parts_read_from_memory": self.reads}
