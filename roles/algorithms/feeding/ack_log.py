"""A feeder's acknowledgement log: where its training passes stand, kept so that a feeder
killed and started again under the same id resumes from there.

One fixed-size record per acknowledged training batch (batch id, samples, loss sum, weight
sum, the worker's index), appended with one ``os.write`` on the file of the batch's epoch,
opened ``O_APPEND``, before the feeder counts the ack: the record is in the kernel once the
call returns, so it survives the process being killed (not the machine losing power: there is
no fsync per ack). A partial record at the end (a machine crash mid-write) is cut off when the
log is read again. When an epoch starts, the files of the epochs before it are folded into one
small totals file (written atomically, naming the epochs it holds) and removed: the log's
memory and disk stay bounded by one epoch's batches, whatever the job's length.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from roles.algorithms.feeding.ledger import PartProgress
from roles.protocol.datapath import split_batch_id
from zbus.files import atomic_write

RECORD = np.dtype([("batch_id", "<i8"), ("samples", "<i4"), ("loss_sum", "<f8"),
                   ("weight_sum", "<f8"), ("worker", "<u2")])


class AckLog:
    def __init__(self, directory: Path, node: str):
        directory.mkdir(parents=True, exist_ok=True)
        self.directory, self.node = directory, node
        self.totals_path = directory / f"{node}.totals.json"
        self.totals = self._read_totals()
        self.fds: dict[int, int] = {}
        for epoch in self.epochs_on_disk():
            if epoch in self.totals["epochs"]:  # folded, but not yet removed: a crash then
                self._file(epoch).unlink(missing_ok=True)

    # -- files ------------------------------------------------------------------------------
    def _file(self, epoch: int) -> Path:
        return self.directory / f"{self.node}.e{epoch}.acks"

    def epochs_on_disk(self) -> list[int]:
        prefix = f"{self.node}.e"
        return sorted(int(p.name[len(prefix):-len(".acks")])
                      for p in self.directory.glob(f"{prefix}*.acks")
                      if p.name[len(prefix):-len(".acks")].isdigit())

    def _read_totals(self) -> dict[str, Any]:
        try:
            totals = orjson.loads(self.totals_path.read_bytes())
        except (FileNotFoundError, orjson.JSONDecodeError):
            totals = {}
        return {"epochs": totals.get("epochs", []), "batches": totals.get("batches", 0),
                "samples": totals.get("samples", 0), "loss_sum": totals.get("loss_sum", 0.0),
                "weight_sum": totals.get("weight_sum", 0.0),
                "acked_by": totals.get("acked_by", {})}

    def records(self, epoch: int) -> np.ndarray:
        """The whole records of one epoch's file (none when there is none)."""
        try:
            raw = self._file(epoch).read_bytes()
        except FileNotFoundError:
            return np.zeros(0, dtype=RECORD)
        whole = len(raw) // RECORD.itemsize * RECORD.itemsize
        return np.frombuffer(raw[:whole], dtype=RECORD).copy()

    # -- writing -----------------------------------------------------------------------------
    def append(self, batch_id: int, samples: int, loss_sum: float, weight_sum: float,
               worker: int) -> None:
        epoch = split_batch_id(batch_id)[0]
        fd = self.fds.get(epoch)
        if fd is None:
            path = self._file(epoch)
            whole = path.stat().st_size // RECORD.itemsize * RECORD.itemsize \
                if path.exists() else 0
            fd = self.fds[epoch] = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.ftruncate(fd, whole)  # a torn last record
        record = np.array([(batch_id, samples, loss_sum, weight_sum, worker)], dtype=RECORD)
        os.write(fd, record.tobytes())

    def fold(self, before: int) -> None:
        """Fold the epochs before ``before`` into the totals, then remove their files."""
        old = [e for e in self.epochs_on_disk() if e < before]
        if not old:
            return
        t = self.totals
        acked_by: Counter[str] = Counter(t["acked_by"])
        for epoch in old:
            _add(t, acked_by, self.records(epoch))
            t["epochs"] = sorted({*t["epochs"], epoch})
        t["acked_by"] = dict(acked_by)
        atomic_write(self.totals_path, orjson.dumps(t), durable=False)
        for epoch in old:
            fd = self.fds.pop(epoch, None)
            if fd is not None:
                os.close(fd)
            self._file(epoch).unlink(missing_ok=True)

    # -- reading back -------------------------------------------------------------------------
    def restart(self) -> dict[str, Any] | None:
        """What a restarted feeder's previous process had done over the job: batches, samples,
        loss and weight sums, samples per worker, its last epoch; None for a new log."""
        epochs = self.epochs_on_disk()
        if not epochs and not self.totals["epochs"]:
            return None
        t = dict(self.totals)
        acked_by: Counter[str] = Counter(t["acked_by"])
        for epoch in epochs:
            _add(t, acked_by, self.records(epoch))
        t["acked_by"] = dict(acked_by)
        t["last_epoch"] = max([*epochs, *t["epochs"]])
        return t

    def progress(self, epoch: int) -> dict[int, PartProgress]:
        """Per part, the training pass of ``epoch`` as the log has it."""
        found: dict[int, PartProgress] = {}
        for batch_id, samples, loss_sum, weight_sum, _ in self.records(epoch).tolist():
            _, part, seq = split_batch_id(batch_id)
            p = found.setdefault(part, PartProgress(epoch))
            if not p.done(seq):
                p.acked(seq, samples, loss_sum, weight_sum)
        return found

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()

    # -- checkpoints ----------------------------------------------------------------------------
    def snapshot(self) -> dict[str, bytes]:
        """The log as it stands, file name -> bytes (whole records only): a checkpoint's copy,
        from which ``replace_files`` puts it back."""
        files = {self.totals_path.name: orjson.dumps(self.totals)}
        for epoch in self.epochs_on_disk():
            files[self._file(epoch).name] = self.records(epoch).tobytes()
        return files


def replace_files(directory: Path, node: str, files: dict[str, bytes]) -> None:
    """Put a log back as a checkpoint had it (``AckLog.snapshot``): the node's files there now
    (of a run that went on after the checkpoint) are removed first."""
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob(f"{node}.*"):
        if old.name.endswith((".acks", ".totals.json")):
            old.unlink()
    for name, data in files.items():
        if not name.startswith(f"{node}.") or "/" in name:
            raise ValueError(f"{name} is not a file of {node}'s ack log")
        (directory / name).write_bytes(data)


def _add(totals: dict[str, Any], acked_by: Counter[str], r: np.ndarray) -> None:
    """An epoch's records added to the job-wide totals and the samples per worker."""
    totals["batches"] += len(r)
    totals["samples"] += int(r["samples"].sum())
    totals["loss_sum"] += float(r["loss_sum"].sum())
    totals["weight_sum"] += float(r["weight_sum"].sum())
    acked_by.update(_by_worker(r))


def _by_worker(r: np.ndarray) -> dict[str, int]:
    if not len(r):
        return {}
    counts = np.bincount(r["worker"], weights=r["samples"])
    return {f"worker-{i}": int(n) for i, n in enumerate(counts) if n}
