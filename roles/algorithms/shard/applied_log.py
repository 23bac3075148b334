"""The batches a shard applied after each of its checkpoint snapshots, on disk (pure file code;
no sockets).

A shard started again restores the newest complete whole-job checkpoint (its chain of files,
``roles.checkpoint.shard``); the embedding updates its dead process applied after that
checkpoint's snapshot are lost (the workers acknowledged those batches: nobody sends their
gradients again). To count them exactly, the shard appends each applied batch's id to a
segment file, ``applied/ps-<i>/<number>.ids`` in the run directory, where ``number`` is the
checkpoint whose snapshot it took last (0 before the first): one ``os.write`` of 8 bytes on an
append-only file before it counts the update, so it survives the process being killed (not
the host losing power). Each snapshot starts a new segment.

Started again from checkpoint ``m`` (0: none), the shard reads the segments numbered ``m`` and
above: the ids in them that the restored rows do not hold are the updates lost. Segments below
the newest complete checkpoint are removed when a snapshot starts a segment (a restart never
goes back further); a restarted shard counts, then starts over with segment ``m`` alone.
"""

from __future__ import annotations

import os
from collections.abc import Container
from pathlib import Path

import numpy as np

RECORD = np.dtype("<i8")
SUFFIX = ".ids"


class AppliedLog:
    def __init__(self, where: Path):
        """``where``: this shard's directory of segments (created)."""
        self.where = where
        where.mkdir(parents=True, exist_ok=True)
        self.fd: int | None = None
        self.number = -1

    def segments(self) -> dict[int, Path]:
        return {int(p.name[:-len(SUFFIX)]): p for p in self.where.glob(f"*{SUFFIX}")
                if p.name[:-len(SUFFIX)].isdigit()}

    def start(self, number: int) -> None:
        """Checkpoint ``number``'s snapshot holds every batch applied so far: the ids from here
        on go to segment ``number`` (emptied if a dead process left one)."""
        self.close()
        self.fd = os.open(self.where / f"{number:06d}{SUFFIX}",
                          os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_TRUNC, 0o644)
        self.number = number

    def append(self, batch_id: int) -> None:
        if self.fd is not None:
            os.write(self.fd, np.array([batch_id], RECORD).tobytes())

    def prune(self, below: int) -> None:
        """Remove the segments before checkpoint ``below`` (the newest complete one)."""
        for number, path in self.segments().items():
            if number < below and number != self.number:
                path.unlink(missing_ok=True)

    def lost(self, restored: int, held: Container[int]) -> list[int]:
        """The batches applied after checkpoint ``restored``'s snapshot (0: from the start)
        that ``held`` (the restored applied ids) does not hold, in the order applied; a record
        torn by a crash is left out."""
        ids: list[int] = []
        for number, path in sorted(self.segments().items()):
            if number >= restored:
                data = path.read_bytes()
                ids += np.frombuffer(data[:len(data) - len(data) % RECORD.itemsize],
                                     RECORD).tolist()
        return [b for b in dict.fromkeys(ids) if b not in held]

    def restart(self, restored: int) -> None:
        """A process that restored checkpoint ``restored`` (0: none) is that checkpoint now:
        every older count is done; it logs into segment ``restored`` alone."""
        self.close()
        for path in self.segments().values():
            path.unlink(missing_ok=True)
        self.start(restored)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
