"""The feeder's part in whole-job checkpoints (``CheckpointHold``): the hold on new batches
while a checkpoint is cut, its part written (``roles.checkpoint.feeder``: the ack log, the
position, and from feeder 0 the dense transform), and the roll-back of the whole job to a
checkpoint at start-up.

Control's Checkpoint ``drain`` holds new batches (batches in flight are still granted and
acknowledged) and the feeder reports CheckpointDrained once nothing is in flight; at ``write``
it takes its part (Snapshotted, then CheckpointPart once written); ``resume`` or ``abort``
releases the hold. The position is the epoch, what the sync mode adds
(``roles.algorithms.sync.feeder``) and a stream job's place in its stream
(``StreamSide.position``), from which it is read again after a roll-back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from roles.algorithms.sync.feeder import FeederSync
from roles.checkpoint.feeder import FeederCheckpoints, stream_records
from roles.checkpoint.files import read_manifest
from roles.events.positions import merge_records
from roles.feeder.ledger_side import LedgerSide
from roles.feeder.loading import Loading
from roles.feeder.passes import Passes
from roles.feeder.stream_side import StreamSide
from roles.protocol.checkpoint import Checkpoint, CheckpointDrained, CheckpointPart, Snapshotted
from roles.storage.store import Store, parent
from zbus.codec import Message

log = logging.getLogger(__name__)


class CheckpointHold:
    """``report`` sends control a report, ``pump`` sends what can be sent."""

    def __init__(self, index: int, sync: FeederSync, loading: Loading, passes: Passes,
                 ledger: LedgerSide, report: Callable[[Message], None],
                 pump: Callable[[], None]):
        self.index, self.sync = index, sync
        self.loading, self.passes, self.ledger = loading, passes, ledger
        self.report, self.pump = report, pump
        self.checkpoints: FeederCheckpoints | None = None
        self.hold = 0      # a checkpoint being cut: no new batch goes out
        self.drained = 0   # the newest cut reported drained
        self.stream: StreamSide | None = None      # a stream job's source: its position too
        self.stream_at: dict[str, Any] | None = None   # the stream's, at the checkpoint
                                                       # the job went back to

    def open(self, store: Store, node_id: str) -> None:
        self.checkpoints = FeederCheckpoints(store, node_id)

    def files(self) -> FeederCheckpoints:
        assert self.checkpoints is not None, "open from the welcome on"
        return self.checkpoints

    def roll_back(self, where: str, node_id: str, feeders: Path) -> dict[str, Any]:
        """The whole job goes back to a checkpoint (its directory or URI): this feeder's ack
        log as it was there."""
        manifest = read_manifest(where)
        if manifest is None:
            raise ValueError("not a complete checkpoint")
        files = manifest["parts"].get(node_id, [])
        root = Store(parent(where))
        position, retrained = self.files().roll_back(root, files, feeders)
        self.sync.restore(position)
        self.stream_at = position.get("stream")
        if self.stream_at is not None:   # the stream's place: every feeder's records, one
            self.stream_at = {**self.stream_at, "partitions": merge_records(
                stream_records(root, manifest["parts"]))}
        log.warning("back to checkpoint %d: the %d samples acknowledged after it are trained "
                    "again", manifest["number"], retrained)
        return {"checkpoint": manifest["number"], "retrained_samples": retrained}

    def holding(self) -> bool:
        """A checkpoint is being cut: no new batch goes out."""
        return bool(self.hold)

    def handle(self, m: Checkpoint) -> None:
        """Hold new batches from ``drain`` until ``resume`` (or ``abort``); at ``write``, take
        this feeder's part (``roles.checkpoint.feeder``)."""
        if m.phase in ("resume", "abort"):
            if self.hold and m.number >= self.hold:
                self.hold = 0
                self.pump()
            return
        checkpoints = self.files()
        if m.number <= checkpoints.written and m.phase == "write":
            return
        if m.number > max(self.drained, checkpoints.written):
            self.hold = m.number
        if m.phase == "drain":
            self.maybe_drained()
        elif m.phase == "write" and not self.ledger.in_flight() and self.transform_known() \
                and self.stream_opened():
            pause = checkpoints.begin(m.number, self.ledger.log(), self.position(),
                                      self.loading.transform_json() if self.index == 0
                                      else None)
            self.report(Snapshotted(number=m.number, pause_s=round(pause, 6), waited_s=0.0))

    def transform_known(self) -> bool:
        """Feeder 0 writes the dense transform with its part: until control's statistics are
        in (a resumed run's first moments) it takes no part, and the standing ``write``'s next
        repeat finds it ready. (Before, a checkpoint asked then was complete without the
        transform, and could be neither scored nor served.)"""
        return self.index != 0 or self.loading.prepared()

    def stream_opened(self) -> bool:
        """A stream job's feeder takes its part once its consumer is open (it connects off the
        loop, ``roles.events.opening``): its position in the stream is known from then on (a
        rewound one's, the checkpoint's it went back to)."""
        return self.stream is None or not self.stream.connecting()

    def maybe_drained(self) -> None:
        if self.hold > self.drained and not self.ledger.in_flight():
            self.drained = self.hold
            self.report(CheckpointDrained(number=self.hold))

    def position(self) -> dict[str, Any]:
        """Where the feeder is, written with its part: the epoch, and what the sync mode
        adds."""
        at = self.stream.position() if self.stream is not None else None
        return {"epoch": self.passes.epoch, **self.sync.position(),
                **({"stream": at} if at is not None else {})}

    def poll(self) -> CheckpointPart | None:
        """The part written, once its thread is done."""
        return self.checkpoints.poll() if self.checkpoints is not None else None
