"""Control's commands to every node (its PUB socket), and the ones that stand.

A standing command (the epoch under way, the round in flight, the parts, the settings, ...)
is kept under a name and re-published every heartbeat interval, so that a subscriber that
joined late or lost a message still acts on it; every role handles repeats idempotently.
Before a standing command goes out, ``before_standing`` runs: control writes its state then
(write-ahead), so that a resumed control knows what it said.
"""

from __future__ import annotations

from collections.abc import Callable

from zbus.codec import Message


class Commands:
    def __init__(self, send: Callable[[Message], object],
                 before_standing: Callable[[], None] = lambda: None):
        self.send = send
        self.before_standing = before_standing
        self.standing: dict[str, Message] = {}

    def publish(self, msg: Message, standing: str | None = None) -> None:
        """Send ``msg`` to every node; with a name, it stands (replacing the one of that name)."""
        if standing:
            self.standing[standing] = msg
            self.before_standing()
        self.send(msg)

    def withdraw(self, name: str) -> None:
        self.standing.pop(name, None)

    def get(self, name: str) -> Message | None:
        return self.standing.get(name)

    def republish(self) -> None:
        for msg in list(self.standing.values()):
            self.send(msg)


class ProgressClock:
    """When the job last moved on (a batch acknowledged, a round done, a node back, ...):
    control fails a job that does not move for ``stall_timeout_s``."""

    def __init__(self, now: float):
        self.last = now

    def touch(self, now: float) -> None:
        self.last = now

    def stalled_for(self, now: float) -> float:
        return now - self.last
