"""How many batches a worker asks for ahead of the one it trains (pure; no sockets): the
window sized for the link, from what the worker measures on messages it exchanges anyway.

A take's round trip (Taken -> Grant; in mode ``push`` the grant also sends the shards' rows,
one more hop) must be hidden behind the batches that train before the batch taken: the
bandwidth-delay product, in batches, is ``ceil(rtt / batch time)``, and one more is the margin
(the take rides with the ack of the batch before, AckTaking). The window is that, at least
``[train] grants_ahead`` and at most ``most`` (``prefetch`` + 1: no more than the worker can
pull, so a worker holds no more batches than before, and a slow worker, whose batch time is
long, asks for the least: it cannot hoard batches).

- ``rtt``: the least of the latest ``KEPT`` round trips. A grant that comes while a batch trains
  is read when it ends, so a single round trip can read as long as a batch; the least of
  several is the link's (TCP's min-RTT rule), at most a batch time too long: the window errs by
  one batch at most, upwards.
- ``batch time``: a moving average of the time a batch holds the worker (from its start to its
  ack: compute, slowdown, a step's answer), not the time between batches: waiting for grants
  must not shrink the window that would end the waiting.

The same two figures size the sample queue's side of the link (``links``): a connection of the
queue has kernel buffers of about one batch (``sample_batch_bytes``, so that a worker that
stops reading holds few batches), and so carries about ``LINK_BATCHES_PER_RTT`` batches per
round trip. A worker that needs more, ``rtt / batch time`` batches per round trip, opens more
connections to each feeder's queue: ``ceil(rtt / batch time / LINK_BATCHES_PER_RTT)``, at
least 1 and at most ``most`` (a slow worker, its batch time long, keeps one). Connections are
only ever added (closing one would drop the batches in its buffers).
"""

from __future__ import annotations

import math
from collections import deque

KEPT = 16          # round trips kept (the least of them is the link's)
SMOOTHING = 0.2    # weight of a new batch time in the moving average
LINK_BATCHES_PER_RTT = 0.5  # one sample-queue connection, measured at RTT 5 ms: 0.49 batches
                            # of Adult's 9 KB per round trip (docs/benchmarks.md, across hosts)


class TakeWindow:
    def __init__(self, most: int):
        self.most = max(1, most)
        self.rtts: deque[float] = deque(maxlen=KEPT)
        self.batch_s: float | None = None

    def answered(self, seconds: float) -> None:
        """A take's round trip: from its Taken to the feeder's answer read here."""
        if seconds >= 0:
            self.rtts.append(seconds)

    def ran(self, seconds: float) -> None:
        """A batch held the worker this long (start to ack)."""
        if seconds > 0:
            self.batch_s = seconds if self.batch_s is None \
                else (1 - SMOOTHING) * self.batch_s + SMOOTHING * seconds

    def rtt(self) -> float | None:
        return min(self.rtts) if self.rtts else None

    def ahead(self, least: int) -> int:
        """Batches to keep asked for ahead of the one training: ``least`` (``[train]
        grants_ahead``) until both figures are measured."""
        least = min(max(1, least), self.most)
        rtt = self.rtt()
        if rtt is None or not self.batch_s:
            return least
        return max(least, min(self.most, math.ceil(rtt / self.batch_s) + 1))

    def links(self, most: int) -> int:
        """Connections to each feeder's sample queue that carry a batch per batch time across
        the measured round trip: 1 until both figures are measured, at most ``most``."""
        rtt = self.rtt()
        if rtt is None or not self.batch_s:
            return 1
        return max(1, min(most, math.ceil(rtt / self.batch_s / LINK_BATCHES_PER_RTT)))

    def counters(self, least: int) -> dict[str, float | int | None]:
        rtt = self.rtt()
        return {"take_rtt_ms": None if rtt is None else round(rtt * 1000, 3),
                "batch_ms": None if self.batch_s is None else round(self.batch_s * 1000, 3),
                "take_window": self.ahead(least)}
