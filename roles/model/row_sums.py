"""The gradient of each embedding row a worker got, summed over the grid positions that read
it (rows used twice add up): one pass over the grid, compiled with numba on the CPU
(``roles.data.compiled``), else torch's ``index_add_`` (on a GPU, or where numba is
not installed).

Why compiled: ``index_add_`` of a Criteo batch's grid (26,624 positions of 16 floats into
about 16,000 rows) took 1.4-2.1 ms on one thread, the loop 0.38-0.56 ms, with the same bits
(both add in grid order in float32); a worker runs one per training batch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
import torch

from roles.data.compiled import AVAILABLE
from roles.data.compiled import compiled as compile_loop


def _add_rows(index: np.ndarray, grads: np.ndarray, out: np.ndarray) -> None:
    """out[index[i]] += grads[i], for each i in order."""
    for i in range(len(index)):
        row = index[i]
        for j in range(grads.shape[1]):
            out[row, j] += grads[i, j]


@functools.cache
def loop() -> Callable[[np.ndarray, np.ndarray, np.ndarray], None]:
    from numba import types

    f32 = types.Array(types.float32, 2, "C")
    return compile_loop([types.void(types.Array(types.int64, 1, "C"), f32, f32)],  # type: ignore[no-any-return]
                        _add_rows)


class RowSums:
    """``sums(index, grads, rows)``: [rows, dim], row r the sum of the ``grads`` rows i whose
    ``index[i]`` is r. ``compiled``: the numba loop on a CPU device, loaded here (a worker
    makes its ``RowSums`` before it says hello: numba's import and cache, half a second of CPU,
    are not taken in the middle of its work)."""

    def __init__(self, device: torch.device, compiled: bool = AVAILABLE):
        self.device = device
        self._loop = loop() if compiled and device.type == "cpu" else None

    @property
    def compiled(self) -> bool:
        return self._loop is not None

    def sums(self, index: np.ndarray, grads: torch.Tensor, rows: int) -> np.ndarray:
        if self._loop is not None and grads.dtype == torch.float32:
            out = np.zeros((rows, grads.shape[1]), dtype=np.float32)
            self._loop(np.ascontiguousarray(index, dtype=np.int64),
                       np.ascontiguousarray(grads.detach().numpy()), out)
            return out
        total = torch.zeros((rows, grads.shape[1]), device=self.device, dtype=grads.dtype)
        total.index_add_(0, torch.from_numpy(index).to(self.device), grads)
        return total.float().cpu().numpy()
