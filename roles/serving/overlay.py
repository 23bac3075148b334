"""The rows a live serving process holds on top of the checkpoint it loaded: every key changed
since, with its newest row, or a tombstone where the key left the table (expired, evicted:
it is then served as a key with no row, as the shards would). Immutable: a new cut makes a new
overlay (``merged``), so that the version being scored never changes under it. Pure."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Overlay:
    keys: np.ndarray    # int64, sorted, distinct
    rows: np.ndarray    # float32 [keys, dim] (a tombstone's row is zero)
    live: np.ndarray    # bool: False for a tombstone

    @classmethod
    def empty(cls, dim: int) -> Overlay:
        return cls(np.zeros(0, np.int64), np.zeros((0, dim), np.float32), np.zeros(0, bool))

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.rows.nbytes + self.live.nbytes

    def merged(self, keys: np.ndarray, rows: np.ndarray, dropped: np.ndarray) -> Overlay:
        """This overlay after one shard's delta: the ``dropped`` keys first, then ``keys``'
        ``rows`` (a key in both was dropped and made again: its row stands). Copies the
        overlay once (``np.insert`` of the keys it lacks)."""
        dim = self.rows.shape[1]
        gone = np.setdiff1d(np.asarray(dropped, np.int64), keys, assume_unique=False)
        all_keys = np.concatenate([np.asarray(keys, np.int64), gone])
        all_rows = np.concatenate([np.asarray(rows, np.float32).reshape(-1, dim),
                                   np.zeros((len(gone), dim), np.float32)])
        all_live = np.concatenate([np.ones(len(keys), bool), np.zeros(len(gone), bool)])
        order = np.argsort(all_keys, kind="stable")
        all_keys, all_rows, all_live = all_keys[order], all_rows[order], all_live[order]
        if not len(all_keys):
            return self
        at = np.searchsorted(self.keys, all_keys)
        here = at < len(self.keys)
        here[here] = self.keys[at[here]] == all_keys[here]
        rows_out, live_out = self.rows.copy(), self.live.copy()
        rows_out[at[here]] = all_rows[here]
        live_out[at[here]] = all_live[here]
        new = ~here
        return Overlay(np.insert(self.keys, at[new], all_keys[new]),
                       np.insert(rows_out, at[new], all_rows[new], axis=0),
                       np.insert(live_out, at[new], all_live[new]))

    def find(self, flat: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For each key: whether the overlay has it, its row there (zero for a tombstone or
        where absent) and whether that is a live row."""
        if not len(self.keys):
            n = len(flat)
            return (np.zeros(n, bool), np.zeros((n, self.rows.shape[1]), np.float32),
                    np.zeros(n, bool))
        at = np.searchsorted(self.keys, flat).clip(0, len(self.keys) - 1)
        found = self.keys[at] == flat
        live = found & self.live[at]
        rows = np.where(found[:, None], self.rows[at], np.float32(0))
        return found, rows, live
