"""A restarted stream feeder's account of the batches its dead processes sent (``DeadBatches``,
pure): which events of the messages the broker delivers again were trained, which a worker
still trains, and which are to be trained anew, so that each event is trained once.

From the log of sent batches (``roles.algorithms.feeding.sent_log``: each batch's runs of lines
of its messages, and the batches an earlier restart found not acknowledged) and the ack log
(which of them were acknowledged), each dead batch is

- ``TRAINED``: acknowledged, in the ack log or by a worker's ack that reaches this process (a
  worker sends its latest acks again to a restarted feeder): its events are left out when
  their messages come again;
- ``HELD``: a worker says it holds it (Holding): it will train it, so its events are parked
  when they come, until the worker's ack (then they are trained) or its loss (then they are
  trained anew);
- ``OPEN``: not known yet, while the workers answer (the feeder sends nothing meanwhile): its
  events are parked too;
- ``FREE``: nobody trains it (every worker has answered and none holds it, or its holder was
  lost): its events are trained anew, under this process's batch numbers.

The messages of dead batches the dead processes did not acknowledge to the broker (the log
records those they did) come again; until they have (``came``), they are ``awaited``: a stream
that ends meanwhile reads on for them, so that those already trained are acknowledged rather
than left to train again in a later run.

A line of a message may lie in runs of several dead batches (a message delivered again to a
second process that died too): the newest batch (the highest seq: a restarted feeder numbers
above its dead processes') decides, since a line is only batched again once every earlier batch
that held it was found untrained.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import numpy as np

from roles.algorithms.feeding.sent_log import ACKED, MESSAGE_ACKED, RECORD, UNACKED

TRAINED, HELD, OPEN, FREE = "trained", "held", "open", "free"


class DeadBatches:
    def __init__(self, records: np.ndarray, low: int, above: Collection[int]):
        """``records`` of the sent log; the ack log's progress of the pass: every seq below
        ``low`` and those in ``above`` acknowledged, except those a process since marked not
        acknowledged when it started and not acknowledged to it after."""
        if records.dtype != RECORD:
            raise ValueError("records of the sent log expected")
        to_broker = records["seq"] == MESSAGE_ACKED
        marked = (records["partition"] < 0) | to_broker
        unacked = set(records["seq"][records["partition"] == UNACKED].tolist()) - \
            set(records["seq"][records["partition"] == ACKED].tolist())
        self.status: dict[int, str] = {}
        self.holder: dict[int, str] = {}
        self.runs: dict[tuple[int, int], list[tuple[int, int, int]]] = {}  # -> (seq, first, last)
        for r in records[~marked]:
            seq = int(r["seq"])
            acked = seq in above or (seq < low and seq not in unacked)
            self.status.setdefault(seq, TRAINED if acked else OPEN)
            self.runs.setdefault((int(r["partition"]), int(r["position"])), []).append(
                (seq, int(r["first"]), int(r["last"])))
        for runs in self.runs.values():
            runs.sort()
        to_broker_acked = set(zip(records["partition"][to_broker].tolist(),
                                  records["position"][to_broker].tolist(), strict=True))
        # their messages the broker has not had acknowledged: they come again
        self.awaited: set[tuple[int, int]] = set(self.runs) - to_broker_acked
        self.parked: dict[int, list[Any]] = {}   # seq -> what the feeder parked of it

    def __len__(self) -> int:
        return len(self.status)

    def owners(self, partition: int, position: int, lines: np.ndarray) -> np.ndarray:
        """For each line of a message delivered again, the dead batch that decides its fate
        (the newest holding it), -1 where none held it."""
        owner = np.full(len(lines), -1, dtype=np.int64)
        for seq, first, last in self.runs.get((partition, position), ()):
            owner[(lines >= first) & (lines <= last)] = seq   # (ascending: the newest last)
        return owner

    def fates(self, owners: np.ndarray) -> tuple[np.ndarray, dict[int, np.ndarray]]:
        """Of events with these ``owners``: those trained already (left out), and per dead
        batch still held or not known, those to park under it. The rest are trained now."""
        trained = np.zeros(len(owners), dtype=bool)
        parked: dict[int, np.ndarray] = {}
        for seq in np.unique(owners[owners >= 0]).tolist():
            mine = owners == seq
            if self.status[seq] == TRAINED:
                trained |= mine
            elif self.status[seq] in (HELD, OPEN):
                parked[seq] = mine
        return trained, parked

    def came(self, partition: int, position: int) -> None:
        """A message of theirs delivered again."""
        self.awaited.discard((partition, position))

    def park(self, seq: int, what: Any) -> None:
        self.parked.setdefault(seq, []).append(what)

    def acked(self, seq: int) -> list[Any] | None:
        """A worker's ack of dead batch ``seq``: it is trained (what was parked of it is, too:
        returned). None: not a dead batch whose fate was open, so not counted here."""
        if self.status.get(seq) not in (HELD, OPEN):
            return None
        self.status[seq] = TRAINED
        self.holder.pop(seq, None)
        return self.parked.pop(seq, [])

    def hold(self, worker: str, seqs: list[int]) -> None:
        """A worker's Holding: these dead batches are its to train."""
        for seq in seqs:
            if self.status.get(seq) in (OPEN, HELD):
                self.status[seq], self.holder[seq] = HELD, worker

    def lost(self, workers: set[str]) -> list[Any]:
        """Workers lost: the dead batches they held are trained anew (what was parked of them
        is returned, to be batched)."""
        gone = [seq for seq, w in self.holder.items() if w in workers]
        return self._free(gone)

    def recovered(self) -> list[Any]:
        """Every live worker has answered: the dead batches nobody holds are trained anew."""
        return self._free([seq for seq, st in self.status.items() if st == OPEN])

    def _free(self, seqs: list[int]) -> list[Any]:
        out: list[Any] = []
        for seq in seqs:
            self.status[seq] = FREE
            self.holder.pop(seq, None)
            out.extend(self.parked.pop(seq, []))
        return out

    def unsettled(self) -> list[int]:
        """Dead batches still held or not known."""
        return [seq for seq, st in self.status.items() if st in (HELD, OPEN)]
