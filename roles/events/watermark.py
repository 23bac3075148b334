"""What a partition's consumer may acknowledge: the longest prefix of its delivered positions
that is done. Events are trained out of order (batches from several messages, workers of
different speeds), and Kafka's commit says "everything before this offset": committing past a
message not yet trained would lose it on a restart. Pure code."""

from __future__ import annotations

import heapq


class Watermark:
    """One partition: positions delivered, positions done; ``floor`` the first position not
    done (everything below it is), the offset Kafka commits."""

    def __init__(self, floor: int | None = None):
        self.floor = floor            # None: nothing delivered yet
        self._open: list[int] = []    # delivered, not done (a heap)
        self._done: set[int] = set()  # done above the lowest open position
        self._aside: set[int] = set()  # open, set aside: never done here (``forget``)

    def delivered(self, position: int) -> None:
        if self.floor is None:
            self.floor = position
        if position < self.floor or position in self._done:
            return                    # a redelivery of what is done: nothing to track
        self._aside.discard(position)
        heapq.heappush(self._open, position)

    def done(self, position: int) -> bool:
        """Mark ``position`` done; whether the floor moved."""
        if self.floor is None or position < self.floor:
            return False
        self._done.add(position)
        moved = False
        while self._open and self._open[0] in self._done:
            top = heapq.heappop(self._open)
            self._done.discard(top)
            while self._open and self._open[0] == top:   # delivered twice
                heapq.heappop(self._open)
            self.floor = top + 1
            moved = True
        return moved

    def forget(self, positions: list[int]) -> None:
        """These positions were delivered and will not be done here (a revoked partition's
        messages set aside untrained: its next owner reads them from the floor, which stops
        at the first of them); no longer ``pending``."""
        self._aside.update(q for q in positions if self.floor is not None and q >= self.floor)

    def done_above(self) -> list[int]:
        """The positions done above the floor (delivered out of order, done before it)."""
        return sorted(self._done)

    def pending(self) -> int:
        """Delivered and not done (nor set aside)."""
        return len(set(self._open) - self._done - self._aside)
