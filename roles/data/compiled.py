"""Loops compiled with numba, for the roles that run one per key or per row: a shard's key
index, grouping and Adagrad (``roles.algorithms.shard.kernels``), a worker's gradient row sums
(``roles.model.row_sums``), a feeder's keys of plain text (``roles.data.hashing``). Each caller
keeps its numpy or torch code beside its loop as the fallback where numba has no wheel yet (a
new Python): ``AVAILABLE`` says which runs.

A loop is compiled for its signatures when its first user is made, not at import: a process
that never needs one never loads numba (about 60-100 MB and half a second). A feeder and a
worker load theirs as they are made, before they say hello (a loop loaded on a thread later
held the GIL for seconds under load: heartbeats late, memory and descriptors growing after a
soak's warm-up). Here, in the data layer, because the keys are its lowest user.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable
from typing import Any

AVAILABLE = importlib.util.find_spec("numba") is not None


@functools.cache
def _typing_ready() -> None:
    """Type one array argument the way a call does, once per process. numba's typing of an
    array asks whether it is a ``numpy.ma`` array, which numpy imports at that first use: 7-8
    ms of CPU that would otherwise fall on the job's first batch (a shard's first look-up took
    8.7 ms instead of 1.0, a worker's first step 10.1-10.7 ms instead of 3.9-4.2)."""
    import numpy as np
    from numba import typeof

    typeof(np.zeros(1))


def compiled(signatures: list[Any], function: Callable[..., Any], **options: Any) -> Any:
    """``function`` compiled for ``signatures`` now, without the GIL, cached on disk where
    numba finds a writable place (beside the module, else the user's cache directory), else
    compiled in memory only (about a second more at the start); the first call's argument
    typing made ready too."""
    from numba import njit

    _typing_ready()
    try:
        return njit(signatures, cache=True, nogil=True, **options)(function)
    except RuntimeError:   # numba: no locator available (read-only source, no writable home)
        return njit(signatures, nogil=True, **options)(function)
