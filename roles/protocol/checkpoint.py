"""Whole-job checkpoints: control's cut across the roles, and each node's part of it (the
design is in ``roles.control.checkpoints``; the files in ``roles.checkpoint.files``).

A checkpoint ``number`` goes through these phases of the standing ``Checkpoint`` command:

- ``drain``: feeders send no new batch (batches sent again still go) and report
  ``CheckpointDrained`` once nothing of theirs is in flight;
- then control brings every worker's dense progress into the aggregator (one round) and
  publishes ``write`` with that ``round``: the cut. Every node holding state (aggregator root,
  shards, feeders) takes a snapshot of it in memory at once, reports ``Snapshotted`` (how
  long it paused), writes its part under ``dir`` off its loop and reports ``CheckpointPart``;
- ``resume`` once every snapshot is taken: feeders go on (the files may still be being
  written); control writes the manifest when every part is in: the checkpoint is complete;
- ``abort``: a node failed or the cut took longer than ``[checkpoint] timeout_s``: feeders go
  on, the parts written are not used.
"""

from __future__ import annotations

from typing import Any, ClassVar

from zbus.codec import Message, message, require

CHECKPOINT_PHASES = ("drain", "write", "resume", "abort")


@message()
class Checkpoint(Message):
    """Control's command for checkpoint ``number`` (standing, control PUB): ``phase`` one of
    CHECKPOINT_PHASES; ``round``: the aggregation round of the cut (``write`` on);
    ``dir``: the checkpoint's directory (absolute)."""

    PHASES: ClassVar[tuple[str, ...]] = CHECKPOINT_PHASES
    number: int
    phase: str
    round: int
    dir: str

    def check(self) -> None:
        require(self.phase in self.PHASES, f"phase must be one of {self.PHASES}")
        require(self.number > 0 and self.round >= 0, "number must be positive, round not "
                                                     "negative")


@message()
class CheckpointDrained(Message):
    """A feeder paused for checkpoint ``number`` has nothing in flight."""

    number: int

    def check(self) -> None:
        require(self.number > 0, "number must be positive")


@message()
class Snapshotted(Message):
    """A node took its snapshot of checkpoint ``number``: it paused its loop for ``pause_s``
    (``waited_s`` of which waiting for gradients still on their way)."""

    number: int
    pause_s: float
    waited_s: float

    def check(self) -> None:
        require(self.number > 0 and self.pause_s >= 0 and self.waited_s >= 0,
                "number must be positive, seconds not negative")


@message()
class CheckpointPart(Message):
    """A node's part of checkpoint ``number`` is on disk (written, fsynced, renamed), or could
    not be (``ok`` false, ``error`` says why). ``files``: the files a restore reads, in the
    order it reads them, relative to the run's ``checkpoints`` directory (a shard's chain: its
    last full file and the incremental ones since); ``bytes`` written for this checkpoint in
    ``write_s``; ``info``: what the node resumes from (a shard's keys and whether this file is
    full or incremental, a feeder's acknowledged batches, ...)."""

    number: int
    ok: bool
    error: str
    files: list[str]
    bytes: int
    write_s: float
    info: dict[str, Any]

    def check(self) -> None:
        require(self.number > 0 and self.bytes >= 0 and self.write_s >= 0,
                "number must be positive, bytes and seconds not negative")
        require(all(isinstance(f, str) and f and not f.startswith("/") and ".." not in f
                    for f in self.files), "files must be relative paths inside the "
                                          "checkpoints directory")
