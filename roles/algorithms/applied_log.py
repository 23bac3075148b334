"""The batches a shard has applied since its last checkpoint, on disk (pure file code; no
sockets).

A shard writes its rows, their Adagrad state and the ids of the batches it applied every
``checkpoint_s``; a shard killed and started again restores that checkpoint, and the embedding
updates it applied after it are lost (the workers acknowledged those batches: nobody sends their
gradients again). To count them exactly, the shard appends each applied batch's id to
``checkpoints/ps-<i>.applied`` (one ``os.write`` of 8 bytes on an append-only file, before it
counts the update: it survives the process being killed, not the host losing power), and
empties the file after each checkpoint. Started again, the shard reads the file: the ids in it
that its checkpoint does not hold are the updates lost (ids written just before the checkpoint
and not yet emptied out are in the checkpoint, so they do not count twice).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

RECORD = np.dtype("<i8")


class AppliedLog:
    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def append(self, batch_id: int) -> None:
        os.write(self.fd, np.array([batch_id], RECORD).tobytes())

    def checkpointed(self) -> None:
        """A checkpoint now holds every batch applied so far: the log starts again."""
        os.ftruncate(self.fd, 0)

    def lost(self, checkpoint: set[int]) -> list[int]:
        """The batches applied after ``checkpoint`` (its applied ids) by the process that wrote
        this log, in the order applied; a record torn by a crash is left out."""
        data = self.path.read_bytes()
        ids = np.frombuffer(data[:len(data) - len(data) % RECORD.itemsize], RECORD).tolist()
        return [b for b in dict.fromkeys(ids) if b not in checkpoint]

    def close(self) -> None:
        os.close(self.fd)
