"""Where a stream stands at a checkpoint, for a job of several feeders (pure code).

Each feeder writes its own record with its part of a checkpoint: per partition, ``floor``
(every position below it is trained), ``done`` (positions above it whose every event is
trained) and ``partial`` (a held message's first events trained: ``[position, events]``).
A job that goes back to the checkpoint reads the stream again from each partition's floor,
leaving out what the records say was trained; with several feeders no one record says that
for the job, so every feeder reads them all and ``merge_records`` makes them one:

- **Kafka**: a partition has one owner at a time. A feeder's floor is the first position it
  had not done of those it read, and it read the partition from the committed offset on, so
  whatever lies below any one feeder's floor is done (by it, or by an owner before it). A
  feeder that held the partition before a rebalance leaves its record of it behind: older,
  lower.
- **JetStream**: the feeders pull from one consumer, each message to one of them, so no
  feeder's own prefix says anything of the messages the others got. The floor a feeder
  records is the group's, as the server said it (``acked_below``: every position below it
  acknowledged, by any feeder, so trained before the cut), and its ``done`` every position it
  acknowledged at or above that floor (``GroupAcks``).

Every feeder's floor is true, so the job's is the **highest**; its ``done`` is every
feeder's at or above it (a feeder's record holds all it did above its own floor, which is not
above the job's), and ``partial`` the most events any feeder trained of a message not done.
"""

from __future__ import annotations

from typing import Any


class GroupAcks:
    """What one feeder of a shared consumer acknowledged that the group's floor has not yet
    passed. Its memory is the positions acknowledged since the floor last moved past them: at
    most what the group holds unacknowledged (a message a feeder holds keeps the floor, which
    ``ack_wait_s`` bounds)."""

    def __init__(self) -> None:
        self.floor: int | None = None
        self._done: set[int] = set()

    def floor_at(self, floor: int | None) -> None:
        """The group's floor as the server last said it (it only rises)."""
        if floor is None or (self.floor is not None and floor <= self.floor):
            return
        self.floor = floor
        self._done = {p for p in self._done if p >= floor}

    def done(self, position: int) -> None:
        if self.floor is None or position >= self.floor:
            self._done.add(position)

    def record(self) -> dict[str, Any]:
        """This feeder's record of the group's one partition."""
        return {"floor": self.floor, "done": sorted(self._done), "partial": []}

    def __len__(self) -> int:
        return len(self._done)


def merge_records(records: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """The job's record of each partition from every feeder's (``records``: each feeder's
    ``partitions``), as the module's docstring says."""
    merged: dict[str, dict[str, Any]] = {}
    for key in sorted({k for r in records for k in r}, key=int):
        parts = [r[key] for r in records if key in r]
        floors = [int(p["floor"]) for p in parts if p.get("floor") is not None]
        floor = max(floors) if floors else None

        def above(q: int, f: int | None = floor) -> bool:
            return f is None or q >= f

        done = {int(q) for p in parts for q in p.get("done", []) if above(int(q))}
        partial: dict[int, int] = {}
        for p in parts:
            for q, k in p.get("partial", []):
                q, k = int(q), int(k)
                if above(q) and q not in done:
                    partial[q] = max(partial.get(q, 0), k)
        merged[key] = {"floor": floor, "done": sorted(done),
                       "partial": [[q, k] for q, k in sorted(partial.items())]}
    return merged
