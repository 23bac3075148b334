"""A feeder's ack log kept in the ``[checkpoint] dir`` store too, so that a feeder whose pod is
made again elsewhere, with an empty disk, still trains every row exactly once.

The log on the feeder's disk (``roles.algorithms.feeding.ack_log``) takes one record per
acknowledged batch, which a store (no append, a request per write) cannot take at that rate.
The store gets the log's compact form instead (``AckLog.position``: the job-wide totals, and per
part of the epoch under way every batch below a mark and the few above it), as one object,
``acks/<feeder>.json``, overwritten on a thread at most once per ``every_s`` (the heartbeat)
while acks come: its size grows with the data's parts and the batches in flight, not with the
rows, and its writes with time, not with the data.

What the store does not hold yet is covered by the workers: each keeps its latest acks to each
feeder (``max_in_flight(MAX_WORKERS, prefetch)`` of them) and sends them to a restarted feeder
again (FeederBack). So that every ack missing from the store is among them, the feeder sends
no new batch while the acks not yet stored plus the batches in flight would reach half that
count (``room``; a store that cannot be written stops the feeding, said in the log, and the
job stalls rather than train a row twice).

A feeder started on an empty disk (not rolled back) seeds its log from the store's copy
(``AckLog.seed``) and is a restarted feeder from there (``roles.feeder.ledger_side``). A new run
removes the copies of an earlier one (``roles.control.process``); a whole-job roll back writes
the log as the checkpoint had it at once (``write_now``).
"""

from __future__ import annotations

import logging

from roles.algorithms.feeding.ack_log import AckLog, read_position
from roles.checkpoint.background import ThreadWrite
from roles.checkpoint.files import ACKS
from roles.storage.store import Store

log = logging.getLogger(__name__)


class StoredAcks:
    """``limit``: the acks a worker keeps per feeder (``max_in_flight(MAX_WORKERS, ...)``)."""

    def __init__(self, store: Store, node_id: str, every_s: float, limit: int):
        self.store, self.node_id = store, node_id
        self.name = f"{ACKS}/{node_id}.json"
        self.every_s = every_s
        self.limit = max(1, limit // 2)
        self.stored = 0            # the log's appended count the store's copy holds (a fold
                                   # changes the form, not what it holds: no write for it)
        self.writing: tuple[ThreadWrite, int] | None = None
        self.next_at = 0.0
        self.failing = False       # the last write failed (said once until one succeeds)
        self.writes = 0

    def read(self) -> bytes | None:
        """The copy in the store (checked), or None when there is none."""
        if self.store.size(self.name) is None:
            return None
        data = self.store.read_bytes(self.name)
        read_position(data)   # ValueError: not one
        return data

    def write_now(self, ack_log: AckLog) -> None:
        """The log's compact form into the store, before the caller goes on."""
        self.store.put_bytes(self.name, ack_log.position_bytes())
        self.stored = ack_log.appended
        self.writes += 1

    def unstored(self, ack_log: AckLog) -> int:
        return ack_log.appended - self.stored

    def room(self, in_flight: int, ack_log: AckLog) -> bool:
        """A new batch may go out: with it in flight, every ack not in the store yet is among
        those the workers keep."""
        return in_flight + self.unstored(ack_log) < self.limit

    def tick(self, now: float, ack_log: AckLog) -> bool:
        """Called every turn of the loop: a write done is taken, a new one begun when due and
        the log changed. True when the store's copy moved on (room may have come free)."""
        moved = False
        if self.writing is not None:
            writer, appended = self.writing
            result = writer.done()
            if result is None:
                return False
            self.writing = None
            ok, error = result
            if ok:
                self.stored = appended
                self.writes += 1
                moved = True
                if self.failing:
                    log.warning("%s: its ack log is written to %s again", self.node_id,
                                self.store.root)
                self.failing = False
            elif not self.failing:
                self.failing = True
                log.error("%s: cannot write its ack log to %s (%s): no new batch goes out "
                          "while more than %d acks are not there (tried again every %.1f s)",
                          self.node_id, self.store.root, error, self.limit, self.every_s)
        if now >= self.next_at and ack_log.appended != self.stored:
            self.next_at = now + self.every_s
            data, appended = ack_log.position_bytes(), ack_log.appended
            self.writing = (ThreadWrite(lambda: self.store.put_bytes(self.name, data)), appended)
        return moved

    def busy(self) -> bool:
        """A write is under way (the loop looks again soon while feeding waits for it)."""
        return self.writing is not None
