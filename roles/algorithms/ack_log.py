"""A feeder's acknowledgement log: where its training passes stand, kept so that a feeder
killed and started again under the same id resumes from there.

One fixed-size record per acknowledged training batch (batch id, samples, loss sum, weight
sum, the worker's index), appended with one ``os.write`` on a file opened ``O_APPEND`` before
the feeder counts the ack: the record is in the kernel once the call returns, so it survives
the process being killed (not the machine losing power: there is no fsync per ack). A partial
record at the end (a machine crash mid-write) is cut off when the log is opened again.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from roles.algorithms.batching import SliceProgress
from roles.protocol.datapath import split_batch_id

RECORD = np.dtype([("batch_id", "<i8"), ("samples", "<i4"), ("loss_sum", "<f8"),
                   ("weight_sum", "<f8"), ("worker", "<u2")])


class AckLog:
    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.records = read_acks(path)
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.ftruncate(self.fd, len(self.records) * RECORD.itemsize)  # a torn last record

    def append(self, batch_id: int, samples: int, loss_sum: float, weight_sum: float,
               worker: int) -> None:
        record = np.array([(batch_id, samples, loss_sum, weight_sum, worker)], dtype=RECORD)
        os.write(self.fd, record.tobytes())

    def progress(self, epoch: int) -> dict[int, SliceProgress]:
        """Per slice, the training pass of ``epoch`` as the log has it."""
        found: dict[int, SliceProgress] = {}
        for batch_id, samples, loss_sum, weight_sum, _ in self.records.tolist():
            e, slice_, seq = split_batch_id(batch_id)
            if e != epoch:
                continue
            p = found.setdefault(slice_, SliceProgress(epoch))
            if not p.done(seq):
                p.acked(seq, samples, loss_sum, weight_sum)
        return found

    def samples_by_worker(self) -> dict[str, int]:
        r = self.records
        if not len(r):
            return {}
        counts = np.bincount(r["worker"], weights=r["samples"])
        return {f"worker-{i}": int(n) for i, n in enumerate(counts) if n}

    def last_epoch(self) -> int:
        return split_batch_id(int(self.records["batch_id"].max()))[0] if len(self.records) else -1

    def close(self) -> None:
        os.close(self.fd)


def read_acks(path: Path) -> np.ndarray:
    """The whole records of a log (none when there is no log)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return np.zeros(0, dtype=RECORD)
    whole = len(raw) // RECORD.itemsize * RECORD.itemsize
    return np.frombuffer(raw[:whole], dtype=RECORD).copy()
