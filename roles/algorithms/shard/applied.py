"""The training batches a shard has applied (``AppliedBatches``, pure): a batch's gradients are
applied once, so a copy's (a straggler sent again, a lost feeder's part fed again) is refused.

A batch id is (epoch, part, seq) and a part's batches are numbered in order. For each
(epoch, part) the record is a bitmap of the newest ``WINDOW`` batch numbers and a floor below
it: every number below the floor counts as applied. A copy comes while its batch is in flight
(a feeder has at most ``max_in_flight`` batches of a part unacknowledged, a few hundred to a
few thousand), so a number that far behind the part's newest applied one is either applied
or never will be; refusing it is what the exact record would do. The memory is then at most
``WINDOW`` bits a part whatever the pass's length: a stream job's one pass runs for weeks
(at 200 batches a second, a set of ids grew by about a gigabyte a day, and every checkpoint
wrote it whole), a file job's pass over billions of rows has millions of batches.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

from roles.protocol.datapath import make_batch_id, make_batch_ids, split_batch_id

WINDOW = 1 << 18   # batch numbers of a part held exactly (32 KB): 22 minutes of batches at
                   # 200 a second, against a lost batch's copy that comes within seconds


class _Part:
    """One (epoch, part): bit i of ``bits`` is batch number ``floor + i``; below ``floor``
    every number counts as applied."""

    def __init__(self, floor: int = 0):
        self.floor = floor
        self.bits = bytearray()
        self.count = 0   # bits set

    def __contains__(self, seq: int) -> bool:
        if seq < self.floor:
            return True
        at = seq - self.floor
        return at < len(self.bits) * 8 and bool(self.bits[at >> 3] >> (at & 7) & 1)

    def add(self, seq: int, window: int) -> None:
        if seq < self.floor:
            return
        at = seq - self.floor
        if at >= window:   # slide: the floor moves up by whole bytes, half a window past need
            drop = min(len(self.bits), (at - window) // 8 + 1 + window // 16)
            self.count -= int.from_bytes(self.bits[:drop], "little").bit_count()
            del self.bits[:drop]
            self.floor += drop * 8
            at = seq - self.floor
            if at >= window:   # far ahead of every number held: a fresh window below it
                self.floor, self.bits, self.count = seq - window // 2, bytearray(), 0
                at = seq - self.floor
        need = (at >> 3) + 1
        if len(self.bits) < need:
            self.bits.extend(bytes(need - len(self.bits)))
        mask = 1 << (at & 7)
        if not self.bits[at >> 3] & mask:
            self.bits[at >> 3] |= mask
            self.count += 1

    def seqs(self) -> np.ndarray:
        bits = np.unpackbits(np.frombuffer(bytes(self.bits), np.uint8), bitorder="little")
        return np.flatnonzero(bits).astype(np.int64) + self.floor


class AppliedBatches:
    def __init__(self, window: int = WINDOW):
        if window < 64 or window % 64:
            raise ValueError(f"window must be a positive multiple of 64, got {window}")
        self.window = window
        self._parts: dict[tuple[int, int], _Part] = {}

    def __contains__(self, batch_id: object) -> bool:
        if not isinstance(batch_id, (int, np.integer)):
            return False
        epoch, part, seq = split_batch_id(int(batch_id))
        held = self._parts.get((epoch, part))
        return held is not None and seq in held

    def add(self, batch_id: int) -> None:
        epoch, part, seq = split_batch_id(int(batch_id))
        held = self._parts.get((epoch, part))
        if held is None:
            held = self._parts[(epoch, part)] = _Part()
        held.add(seq, self.window)

    def __len__(self) -> int:
        """The batches held exactly (those below a floor are not counted)."""
        return sum(p.count for p in self._parts.values())

    def forget_epochs_before(self, epoch: int) -> None:
        self._parts = {k: p for k, p in self._parts.items() if k[0] >= epoch}

    def _items(self) -> Iterator[tuple[tuple[int, int], _Part]]:
        return iter(sorted(self._parts.items()))

    def ids(self) -> np.ndarray:
        """The batch ids held exactly, for a checkpoint (int64)."""
        out = [make_batch_ids(e, q, p.seqs()) for (e, q), p in self._items() if p.count]
        return np.concatenate(out) if out else np.zeros(0, np.int64)

    def floors(self) -> np.ndarray:
        """Each (epoch, part)'s floor as a batch id (int64), for a checkpoint."""
        return np.array([make_batch_id(e, q, p.floor) for (e, q), p in self._items()],
                        dtype=np.int64)

    @classmethod
    def of(cls, batch_ids: Iterable[int], window: int = WINDOW) -> AppliedBatches:
        out = cls(window)
        for b in batch_ids:
            out.add(b)
        return out

    @classmethod
    def restored(cls, ids: np.ndarray, floors: np.ndarray | None = None,
                 window: int = WINDOW) -> AppliedBatches:
        """As a checkpoint had it (``ids``, ``floors``; a checkpoint written before floors
        were kept has ids only)."""
        out = cls(window)
        for f in (floors if floors is not None else np.zeros(0, np.int64)).tolist():
            epoch, part, seq = split_batch_id(int(f))
            out._parts[(epoch, part)] = _Part(seq)
        for b in np.asarray(ids, dtype=np.int64).tolist():
            out.add(b)
        return out
