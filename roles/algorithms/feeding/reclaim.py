"""A feeder started again on its ack log, reclaiming what its dead process sent (pure).

The dead process may have sent batches of the pass under way that the new one has not: every
such batch (of the rebuilt pass, not acknowledged in the log, not sent by this process) is
*reclaimable*. When a worker takes one, says it holds one (Holding) or acknowledges one, the
batch is reclaimed: claimed in the pass (not sent again) and put in the ledger as that
worker's. Until every live worker has answered (its acks, then Holding) the feeder grants and
sends nothing, and the takes that arrive meanwhile wait, so that no batch granted by the dead
process goes to a second worker.
"""

from __future__ import annotations

from roles.algorithms.feeding.ledger import TAKEN, InFlight, Ledger
from roles.algorithms.feeding.passes import Pass


class Reclaim:
    def __init__(self, ledger: Ledger):
        self.ledger = ledger
        self.restarted = False     # this process started on the ack log of a dead one
        self.recovering = False    # restarted, and not every live worker has answered yet
        self.answered: set[str] = set()                   # workers that sent Holding
        self.deferred_takes: list[tuple[bytes, int]] = []  # (worker identity, batch id)

    def restart(self) -> None:
        self.restarted = self.recovering = True

    def reclaimable(self, pass_: Pass | None, batch_id: int) -> InFlight | None:
        """The batch, when it is of the pass under way and this process has not sent it (so
        its dead predecessor did; it is made now if the stream had not got to it); None when
        it is not of the pass or was sent (or acknowledged) here already, or this process is
        not a restarted one."""
        if not self.restarted or pass_ is None:
            return None
        batch = pass_.peek(batch_id)
        return None if batch is None else InFlight(batch, pass_.eval, 0)

    def reclaim(self, pass_: Pass | None, batch_id: int, entry: InFlight,
                worker: str | None = None) -> InFlight:
        """Take a reclaimable batch out of the pass into the ledger (``worker``'s)."""
        assert pass_ is not None, "only a reclaimable batch is reclaimed"
        pass_.claim(batch_id)
        self.ledger.in_flight[batch_id] = entry
        if worker is not None:
            entry.state, entry.worker = TAKEN, worker
        return entry

    def taking(self, pass_: Pass | None, batch_id: int) -> None:
        """A worker asks to take the batch: a reclaimable one is reclaimed first."""
        if batch_id not in self.ledger.in_flight:
            entry = self.reclaimable(pass_, batch_id)
            if entry is not None:
                self.reclaim(pass_, batch_id, entry)

    def holding(self, pass_: Pass | None, worker: str, held: list[int]) -> None:
        """A worker's batches granted by the dead process: they stay that worker's."""
        for batch_id in held:
            entry = self.ledger.peek(batch_id)
            if entry is None and (entry := self.reclaimable(pass_, batch_id)) is not None:
                self.reclaim(pass_, batch_id, entry)
            if entry is not None:
                entry.state, entry.worker = TAKEN, worker
        if self.recovering:
            self.answered.add(worker)

    def recovered(self, members: set[str] | None) -> list[tuple[bytes, int]] | None:
        """When every live worker (``members``; None: not known yet) has answered: recovery
        is over, and here are the takes that waited (to grant now, in order)."""
        if not self.recovering or members is None or not members <= self.answered:
            return None
        self.recovering = False
        takes, self.deferred_takes = self.deferred_takes, []
        return takes
