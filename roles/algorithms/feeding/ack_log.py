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

The log's *compact form* (``position``) is that totals file with everything folded in: the
job-wide sums and samples per worker, and for each epoch not folded yet, per part, the batches
acknowledged as ``PartProgress`` does (every number below a mark, and the few above it), kept up
to date in memory as acks come. Its size depends on the parts and the batches in flight, not
on how many batches were acknowledged. Written as the totals file of an empty log (``seed``),
it is that log's *base*: the log goes on from it with record files as usual
(``roles.checkpoint.stored_acks`` keeps it in the checkpoint store, for a feeder whose disk is
gone).

A stream job has one epoch for its whole life: its file is *compacted* (``compact``) as it
grows: the compact form written as the totals file, naming how many of the epoch file's first
records it holds (``skip``), then the file replaced by an empty one and ``skip`` set back to 0.
A crash between two steps leaves either the file with at least ``skip`` records (their first
``skip`` are left out when read) or an emptied file with a ``skip`` it cannot hold, which the
next process takes for 0 (and writes so) before it appends anything.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from roles.algorithms.feeding.ledger import PartProgress
from roles.protocol.datapath import split_batch_id, split_batch_ids
from zbus.files import atomic_write

SETTLE_EVERY = 1024   # records appended are taken into the compact form this many at a time
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
        emptied = [e for e, n in self.totals["skip"].items() if len(self._whole(e)) < n]
        if emptied:   # a crash after a compaction emptied the file: nothing is left out
            for epoch in emptied:
                self.totals["skip"].pop(epoch)
            atomic_write(self.totals_path, _totals_bytes(self.totals), durable=False)
        self.appended = 0   # acks appended by this process
        # the compact form of what is not folded (the base's parts, then the records)
        self.live: dict[int, dict[int, PartProgress]] = {
            epoch: {part: replace(p, above=set(p.above)) for part, p in parts.items()}
            for epoch, parts in self.totals["parts"].items()}
        self.live_sums = {"batches": 0, "samples": 0, "loss_sum": 0.0, "weight_sum": 0.0}
        self.live_by: Counter[str] = Counter()
        self.pending: list[tuple[int, int, float, float, int]] = []   # appended, not yet in
                                                                         # the compact form
        for epoch in self.epochs_on_disk():
            self._count(self.records(epoch))

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
                "acked_by": totals.get("acked_by", {}),
                "skip": {int(e): int(n) for e, n in totals.get("skip", {}).items()},
                "parts": {int(e): {int(part): PartProgress(int(e), int(low), set(above),
                                                           int(n), float(loss), float(weight))
                                   for part, (low, above, n, loss, weight) in parts.items()}
                          for e, parts in totals.get("parts", {}).items()}}

    def records(self, epoch: int) -> np.ndarray:
        """The whole records of one epoch's file not already in the totals (none when there
        is no file)."""
        return self._whole(epoch)[self.totals["skip"].get(epoch, 0):]

    def _whole(self, epoch: int) -> np.ndarray:
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
        record = (batch_id, samples, loss_sum, weight_sum, worker)
        os.write(fd, np.array([record], dtype=RECORD).tobytes())
        self.appended += 1
        self.pending.append(record)   # (taken in by the thousand: off the ack's own cost)
        if len(self.pending) >= SETTLE_EVERY:
            self._settle()

    def _settle(self) -> None:
        if self.pending:
            records, self.pending = np.array(self.pending, dtype=RECORD), []
            self._count(records)

    def _count(self, r: np.ndarray) -> None:
        """Records into the compact form (the sums count every record, as folding does)."""
        if not len(r):
            return
        epochs, parts, seqs = split_batch_ids(r["batch_id"])
        at, p = (-1, -1), PartProgress(0)
        for epoch, part, seq, samples, loss_sum, weight_sum in zip(
                epochs.tolist(), parts.tolist(), seqs.tolist(), r["samples"].tolist(),
                r["loss_sum"].tolist(), r["weight_sum"].tolist(), strict=True):
            if (epoch, part) != at:   # (consecutive acks are mostly of one part)
                at = (epoch, part)
                p = self.live.setdefault(epoch, {}).setdefault(part, PartProgress(epoch))
            if seq == p.low and not p.above:   # in order: the common case
                p.low += 1
                p.samples += samples
                p.loss_sum += loss_sum
                p.weight_sum += weight_sum
            elif not p.done(seq):
                p.acked(seq, samples, loss_sum, weight_sum)
        sums = self.live_sums
        sums["batches"] += len(r)
        sums["samples"] += int(r["samples"].sum())
        sums["loss_sum"] += float(r["loss_sum"].sum())
        sums["weight_sum"] += float(r["weight_sum"].sum())
        self.live_by.update(_by_worker(r))

    def fold(self, before: int) -> None:
        """Fold the epochs before ``before`` into the totals, then remove their files."""
        self._settle()
        old = [e for e in self.epochs_on_disk() if e < before]
        based = [e for e in self.totals["parts"] if e < before]
        if not old and not based:
            return
        t = self.totals
        acked_by: Counter[str] = Counter(t["acked_by"])
        for epoch in old:
            r = self.records(epoch)
            _add(t, acked_by, r)
            self._uncount(r)
        for epoch in {*old, *based}:
            t["epochs"] = sorted({*t["epochs"], epoch})
            t["parts"].pop(epoch, None)   # its sums are in the totals already
            self.live.pop(epoch, None)
        t["acked_by"] = dict(acked_by)
        atomic_write(self.totals_path, _totals_bytes(t), durable=False)
        for epoch in old:
            fd = self.fds.pop(epoch, None)
            if fd is not None:
                os.close(fd)
            self._file(epoch).unlink(missing_ok=True)

    def compact(self, epoch: int) -> None:
        """Take ``epoch``'s records into the totals file and empty its file (the module's
        docstring): a stream's one epoch stays as small as its compact form."""
        self._settle()
        n = len(self._whole(epoch))
        if not n:
            return
        position = self.position()
        t = {**position, "parts": {e: {part: replace(p, above=set(p.above))
                                       for part, p in parts.items()}
                                   for e, parts in self.live.items()},
             "skip": {**self.totals["skip"], epoch: n}}
        atomic_write(self.totals_path, _totals_bytes(t), durable=False)
        fd = self.fds.pop(epoch, None)
        if fd is not None:
            os.close(fd)
        atomic_write(self._file(epoch), b"", durable=False)
        t["skip"].pop(epoch)
        atomic_write(self.totals_path, _totals_bytes(t), durable=False)
        self.totals = t
        self.live_sums = {"batches": 0, "samples": 0, "loss_sum": 0.0, "weight_sum": 0.0}
        self.live_by = Counter()

    def _uncount(self, r: np.ndarray) -> None:
        """Records folded into the totals leave the live sums."""
        sums = self.live_sums
        sums["batches"] -= len(r)
        sums["samples"] -= int(r["samples"].sum())
        sums["loss_sum"] -= float(r["loss_sum"].sum())
        sums["weight_sum"] -= float(r["weight_sum"].sum())
        self.live_by.subtract(_by_worker(r))

    # -- reading back -------------------------------------------------------------------------
    def restart(self) -> dict[str, Any] | None:
        """What a restarted feeder's previous process had done over the job: batches, samples,
        loss and weight sums, samples per worker, its last epoch; None for a new log."""
        epochs = [*self.epochs_on_disk(), *self.totals["parts"], *self.totals["epochs"]]
        if not epochs:
            return None
        t = self.position()
        del t["parts"]
        t["last_epoch"] = max(epochs)
        return t

    def skip_below(self, epoch: int, part: int, first: int) -> None:
        """Batches of ``part`` numbered below ``first`` will not be acked
        (``PartProgress.skip_below``): the compact form leaves their holes. (Read again after a
        restart, the records make the holes again; the restarted feeder skips them again.)"""
        self._settle()
        progress = self.live.get(epoch, {}).get(part)
        if progress is not None:
            progress.skip_below(first)

    def progress(self, epoch: int) -> dict[int, PartProgress]:
        """Per part, the training pass of ``epoch`` as the log has it."""
        self._settle()
        return {part: replace(p, above=set(p.above))
                for part, p in self.live.get(epoch, {}).items()}

    def position(self) -> dict[str, Any]:
        """The compact form (see the module's docstring): the totals file's fields, with
        everything acknowledged so far folded into them."""
        self._settle()
        t = self.totals
        sums = self.live_sums
        acked_by = Counter(t["acked_by"])
        acked_by.update(self.live_by)
        return {"epochs": list(t["epochs"]), "batches": t["batches"] + sums["batches"],
                "samples": t["samples"] + sums["samples"],
                "loss_sum": t["loss_sum"] + sums["loss_sum"],
                "weight_sum": t["weight_sum"] + sums["weight_sum"],
                "acked_by": {w: n for w, n in acked_by.items() if n},
                "parts": {epoch: dict(parts) for epoch, parts in self.live.items()}}

    def position_bytes(self) -> bytes:
        """The compact form as the bytes of a totals file (``seed`` writes them)."""
        return _totals_bytes(self.position())

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()

    # -- checkpoints ----------------------------------------------------------------------------
    def snapshot(self) -> dict[str, bytes]:
        """The log as it stands, file name -> bytes (whole records only): a checkpoint's copy,
        from which ``replace_files`` puts it back."""
        files = {self.totals_path.name: _totals_bytes({**self.totals, "skip": {}})}
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


def seed(directory: Path, node: str, position: bytes) -> None:
    """Start an empty log from a compact form (``AckLog.position_bytes``): its base."""
    replace_files(directory, node, {f"{node}.totals.json": position})


def read_position(data: bytes) -> dict[str, Any]:
    """A compact form, checked (ValueError when it is not one)."""
    try:
        t = orjson.loads(data)
        out = {"epochs": [int(e) for e in t["epochs"]], "batches": int(t["batches"]),
               "samples": int(t["samples"]), "loss_sum": float(t["loss_sum"]),
               "weight_sum": float(t["weight_sum"]),
               "acked_by": {str(w): int(n) for w, n in t["acked_by"].items()},
               "parts": {int(e): {int(part): (int(low), [int(a) for a in above], int(n),
                                              float(loss), float(weight))
                                  for part, (low, above, n, loss, weight) in parts.items()}
                         for e, parts in t.get("parts", {}).items()}}
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"not an ack log's compact form ({type(exc).__name__}: {exc})") \
            from None
    return out


def _totals_bytes(t: dict[str, Any]) -> bytes:
    """A totals file: the parts of the epochs not folded as [low, above, samples, loss sum,
    weight sum] (the totals' sums include them)."""
    return orjson.dumps({**t, "parts": {
        str(e): {str(part): [p.low, sorted(p.above), p.samples, p.loss_sum, p.weight_sum]
                 for part, p in sorted(parts.items())}
        for e, parts in sorted(t.get("parts", {}).items())},
        "skip": {str(e): n for e, n in sorted(t.get("skip", {}).items()) if n}})


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
