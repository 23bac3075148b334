"""Control's part in live serving (``[serving] publish_ms``): a ``ServingCut`` every
``publish_ms`` while the job trains or evaluates, numbered by control's wall clock in
milliseconds (strictly rising, also across a resumed control), at which each shard and the root
aggregator publish what changed for the serving processes that follow the job
(``roles.protocol.serving``)."""

from __future__ import annotations

import time
from collections.abc import Callable

from roles.protocol.serving import ServingCut


class ServingCuts:
    def __init__(self, publish_ms: int, publish: Callable[[ServingCut], object],
                 clock: Callable[[], float] = time.time):
        self.every_s = publish_ms / 1000.0
        self.publish = publish
        self.clock = clock
        self.last = 0            # the newest cut's number
        self.due = 0.0           # monotonic time of the next cut
        self.cuts = 0

    @property
    def on(self) -> bool:
        return self.every_s > 0

    def tick(self, now: float, running: bool) -> float | None:
        """Publish a cut when one is due and the job is ``running``; when the next is due
        (monotonic), None when cuts are off."""
        if not self.on:
            return None
        if running and now >= self.due:
            number = max(self.last + 1, int(self.clock() * 1000))
            self.publish(ServingCut(number=number))
            self.last, self.cuts = number, self.cuts + 1
            self.due = now + self.every_s
        return self.due if running else now + self.every_s
