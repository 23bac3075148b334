"""Control's commands to every node (its PUB socket), and the ones that stand.

A standing command (the epoch under way, the round in flight, the parts, the settings, ...)
is kept under a name and re-published every heartbeat interval, so that a subscriber that
joined late or lost a message still acts on it; every role handles repeats idempotently.
Before a standing command goes out, ``before_standing`` runs: control writes its state then
(write-ahead), so that a resumed control knows what it said.

A resumed control holds its commands (``hold``) until it has decided whether the nodes live on
or the whole job goes back to a checkpoint (``roles.control.resuming``): its records' standing
commands are the dead run's, which a roll back replaces, and a node welcomed after the roll back
may read one still queued on its SUB socket after its Welcome (two sockets: no order between
them) and take it as the new run's. A restored aggregator at the checkpoint's round r took the
dead run's Aggregate(r + 1) so, finished that round alone, and ignored every Aggregate(r + 1)
control called after: the next checkpoint's flush waited for it forever. While held, nothing
goes out but ``Deciding`` (the nodes waiting for their Welcome hear control); ``release``
publishes what stands then.
"""

from __future__ import annotations

from collections.abc import Callable

from zbus.codec import Message
from zbus.messages import Deciding


class Commands:
    def __init__(self, send: Callable[[Message], object],
                 before_standing: Callable[[], None] = lambda: None):
        self.send = send
        self.before_standing = before_standing
        self.standing: dict[str, Message] = {}
        self.held = False   # a resumed control that has not decided yet: nothing goes out

    def publish(self, msg: Message, standing: str | None = None) -> None:
        """Send ``msg`` to every node (held: only once released, if it stands); with a name,
        it stands (replacing the one of that name)."""
        if standing:
            self.standing[standing] = msg
            self.before_standing()
        if not self.held:
            self.send(msg)

    def withdraw(self, name: str) -> None:
        self.standing.pop(name, None)

    def get(self, name: str) -> Message | None:
        return self.standing.get(name)

    def republish(self) -> None:
        if self.held:
            self.send(Deciding())
            return
        for msg in list(self.standing.values()):
            self.send(msg)

    def hold(self) -> None:
        self.held = True

    def release(self) -> None:
        """Decided: what stands goes out now (a no-op unless held)."""
        if self.held:
            self.held = False
            self.republish()


class ProgressClock:
    """When the job last moved on (a batch acknowledged, a round done, a node back, ...):
    control fails a job that does not move for ``stall_timeout_s``."""

    def __init__(self, now: float):
        self.last = now

    def touch(self, now: float) -> None:
        self.last = now

    def stalled_for(self, now: float) -> float:
        return now - self.last
