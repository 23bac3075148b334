"""A feeder's part of the whole-job checkpoints: where its passes stood at the cut.

At the cut nothing of the feeder's is in flight (it drained), so its position is its ack log
(``roles.algorithms.feeding.ack_log``): every training batch acknowledged, per epoch, and the
totals of the epochs folded. The log (at most one epoch's records and a small totals file) is
copied in memory at the cut and written on a thread into ``<number>/<feeder>/``, with
``position.json`` (the epoch, and in sync mode round the round being fed) and, from feeder 0, the
dense transform (``<number>/transform.json``) that serving needs.

When the whole job goes back to a checkpoint, the feeder's log is replaced by the copy before
the feeder opens it: the batches acknowledged after the cut are fed and trained again; how many
is said (``retrained``). A stream job's feeders each read every feeder's position
(``stream_records``): with several, the stream's place is theirs together
(``roles.events.positions``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from roles.algorithms.feeding.ack_log import AckLog, replace_files
from roles.checkpoint.background import ThreadWrite
from roles.checkpoint.files import number_name, save_file
from roles.protocol.checkpoint import CheckpointPart
from roles.storage.store import Store

POSITION = "position.json"


@dataclass
class Writing:
    number: int
    files: list[str]
    size: int
    writer: ThreadWrite
    started: float


class FeederCheckpoints:
    def __init__(self, store: Store, node_id: str):
        self.store, self.node_id = store, node_id
        self.writing: Writing | None = None
        self.written = 0   # the newest checkpoint this feeder took its part of

    def begin(self, number: int, log: AckLog, position: dict[str, Any],
              transform: dict[str, Any] | None) -> float:
        """Copy the log now, write it on a thread; the seconds the copy took."""
        started = time.perf_counter()
        where, store = number_name(number), self.store
        files = {f"{where}/{self.node_id}/{name}": data for name, data in log.snapshot().items()}
        files[f"{where}/{self.node_id}/{POSITION}"] = orjson.dumps(position)
        if transform is not None:
            files[f"{where}/transform.json"] = orjson.dumps(transform)

        def write() -> None:   # on a thread: the files, then (a remote store) their upload
            for name, data in files.items():
                save_file(store.local(name), data)
            store.publish(list(files))

        self.writing = Writing(number, list(files),
                               sum(len(d) for d in files.values()), ThreadWrite(write),
                               time.monotonic())
        self.written = number
        return time.perf_counter() - started

    def poll(self) -> CheckpointPart | None:
        w = self.writing
        if w is None or (result := w.writer.done()) is None:
            return None
        self.writing = None
        ok, error = result
        return CheckpointPart(number=w.number, ok=ok, error=error, files=w.files if ok else [],
                              bytes=w.size if ok else 0,
                              write_s=round(time.monotonic() - w.started, 3), info={})

    def roll_back(self, root: Store, files: list[str],
                  log_dir: Path) -> tuple[dict[str, Any], int]:
        """Put this feeder's ack log back as the checkpoint had it (``files``: its part in the
        manifest of a checkpoint in ``root``); (its position, the samples acknowledged after
        the cut, to train again)."""
        before = AckLog(log_dir, self.node_id).restart() or {"samples": 0}
        prefix = f"{self.node_id}/"
        logged, position = {}, {}
        for name in files:
            inner = name.split("/", 1)[1]
            if not inner.startswith(prefix):
                continue   # feeder 0's transform
            data = root.read_bytes(name)
            if inner == prefix + POSITION:
                position = orjson.loads(data)
            else:
                logged[inner[len(prefix):]] = data
        replace_files(log_dir, self.node_id, logged)
        after = AckLog(log_dir, self.node_id).restart() or {"samples": 0}
        return position, max(0, int(before["samples"]) - int(after["samples"]))


def stream_records(root: Store, parts: dict[str, list[str]]) -> list[dict[str, Any]]:
    """Every feeder's record of the stream (its position's ``stream``: per partition) in a
    checkpoint of ``root`` whose manifest lists ``parts`` (node -> its files)."""
    records = []
    for node, files in sorted(parts.items()):
        for name in files:
            if name.split("/", 1)[-1] == f"{node}/{POSITION}":
                at = orjson.loads(root.read_bytes(name)).get("stream")
                if at is not None:
                    records.append(at.get("partitions", {}))
    return records
