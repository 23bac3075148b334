"""The training roles' part in live serving (``roles.protocol.serving``): what a shard
(``RowPublisher``) and the root aggregator (``DensePublisher``) publish at each ServingCut, and
a shard's answer to a serving process that starts late. Pure: the roles send what these
return."""

from __future__ import annotations

import os
import time

import numpy as np

from roles.algorithms.shard.embedding_table import EmbeddingTable
from roles.protocol.serving import DenseDelta, RowDelta, RowsCaughtUp, quantized


def incarnation() -> str:
    """This process, as serving processes tell a restarted role from the one before it."""
    return f"{os.getpid()}.{time.time_ns() // 1_000_000}"


class RowPublisher:
    """Shard ``shard``'s rows: from construction on, the table records what changes.
    ``row_bytes`` (``[serving] row_bytes``): 4, the rows as float32; 1, as int8 with a scale
    each (``roles.protocol.serving.quantized``)."""

    def __init__(self, shard: int, table: EmbeddingTable, row_bytes: int = 4):
        self.shard, self.table, self.row_bytes = shard, table, row_bytes
        self.incarnation = incarnation()
        self.previous = 0          # the last cut published
        self.published = 0
        self.rows_published = 0
        self.row_bytes_published = 0   # the rows' bytes (values and scales)
        table.follow()

    def encoded(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """The rows as the job publishes them: ``rows``, or ``qrows`` and ``scales``."""
        dim = self.table.dim
        if self.row_bytes == 4 or not len(rows):
            self.row_bytes_published += rows.nbytes
            return {"rows": rows, "qrows": np.zeros((0, dim), np.int8),
                    "scales": np.zeros(0, np.float32)}
        q, scales = quantized(rows)
        self.row_bytes_published += q.nbytes + scales.nbytes
        return {"rows": np.zeros((0, dim), np.float32), "qrows": q, "scales": scales}

    def defaults(self) -> np.ndarray:
        t = self.table
        return t.weights[:t.defaults].copy() if t.defaults \
            else np.zeros((0, t.dim), np.float32)

    def cut(self, number: int) -> RowDelta | None:
        """Cut ``number``'s delta (None: an old or repeated cut)."""
        if number <= self.previous:
            return None
        keys, rows, dropped = self.table.changes()
        delta = RowDelta(shard=self.shard, cut=number, previous=self.previous,
                         incarnation=self.incarnation, keys=keys, dropped=dropped,
                         defaults=self.defaults(), **self.encoded(rows))
        self.previous = number
        self.published += 1
        self.rows_published += len(keys)
        return delta

    def caught_up(self, asked: int, snapshot: int) -> RowsCaughtUp:
        """The answer to RowsSince(``asked``): the rows changed since ``snapshot`` (this
        shard's newest checkpoint snapshot, or the one it restored), when that is the one
        asked for; else only which it is."""
        dim = self.table.dim
        if asked == snapshot:
            keys, rows, dropped = self.table.since_snapshot()
        else:
            keys, rows, dropped = (np.zeros(0, np.int64), np.zeros((0, dim), np.float32),
                                   np.zeros(0, np.int64))
        return RowsCaughtUp(shard=self.shard, checkpoint=snapshot, cut=self.previous,
                            incarnation=self.incarnation, keys=keys, dropped=dropped,
                            defaults=self.defaults(), **self.encoded(rows))

    def counters(self) -> dict:
        return {"serving_cuts": self.published, "serving_rows": self.rows_published,
                "serving_row_bytes": self.row_bytes_published}


class DensePublisher:
    """The root aggregator's weights: sent whole at a cut when they changed since the
    previous one, else only named."""

    def __init__(self) -> None:
        self.previous = 0
        self.at: tuple[int, int, int] | None = None
        self.sent = 0

    def cut(self, number: int, round_: int, step: int, generation: int,
            params: np.ndarray) -> DenseDelta | None:
        if number <= self.previous:
            return None
        changed = (round_, step, generation) != self.at
        delta = DenseDelta(cut=number, previous=self.previous, round=round_, step=step,
                           generation=generation,
                           params=params.copy() if changed else np.zeros(0, np.float32))
        self.previous, self.at = number, (round_, step, generation)
        self.sent += changed
        return delta
