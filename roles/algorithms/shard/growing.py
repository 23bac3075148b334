"""Arrays of rows that grow in place: each is an anonymous private memory mapping, grown by the
kernel (``mremap``: the pages move, none is copied), so that a table that grows holds its rows
once, not its old and its new array side by side while the one is copied into the other (at a
doubling, about twice the table: a 45M-row day's shard peaked at 1.19 GB that way, against
0.8 GB of rows). New rows read as zeros (or ``fill``), untouched pages take no memory, and a
fork (a checkpoint's child) sees the rows as they were, copy on write, as with any array.

The array handed out must be the only view of the mapping when it grows: ``grow`` takes it
back first; a view kept elsewhere makes the growth fail (BufferError), never read freed memory.
"""

from __future__ import annotations

import mmap

import numpy as np

PAGE = mmap.PAGESIZE


class GrowingRows:
    def __init__(self, rows: int, width: tuple[int, ...], dtype: type | np.dtype, fill: int = 0):
        self.width, self.dtype, self.fill = width, np.dtype(dtype), fill
        self.row_bytes = int(np.prod(width, dtype=np.int64)) * self.dtype.itemsize
        self._map = mmap.mmap(-1, self._bytes(rows), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.rows = rows
        self.array: np.ndarray = self._view()
        if fill:
            self.array[:] = fill

    def _bytes(self, rows: int) -> int:
        return max(PAGE, -(-max(rows, 1) * self.row_bytes // PAGE) * PAGE)

    def _view(self) -> np.ndarray:
        return np.frombuffer(self._map, dtype=self.dtype,
                             count=self.rows * self.row_bytes // self.dtype.itemsize
                             ).reshape(self.rows, *self.width)

    def grow(self, rows: int) -> np.ndarray:
        """Room for ``rows`` rows, the rows held kept: the new array (the old one must not be
        used again; drop every other reference to it before)."""
        if rows <= self.rows:
            return self.array
        old = self.rows
        del self.array
        try:
            self._map.resize(self._bytes(rows))
        except BufferError:   # a view of it lives elsewhere: nothing changed
            self.array = self._view()
            raise
        self.rows = rows
        self.array = self._view()
        if self.fill:
            self.array[old:] = self.fill
        return self.array
