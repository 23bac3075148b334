"""Loops compiled with numba, for the roles that run one per key or per row: a shard's key
index, grouping and Adagrad (``roles.algorithms.shard.kernels``), a worker's gradient row sums
(``roles.model.row_sums``), a feeder's keys of plain text (``roles.data.hashing``). Each caller
keeps its numpy or torch code beside its loop as the fallback where numba has no wheel yet (a
new Python): ``AVAILABLE`` says which runs.

A loop is compiled for its signatures when its first user is made, not at import: a process
that never needs one never loads numba (about 60-100 MB and half a second).
"""

from __future__ import annotations

import importlib.util
import logging
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")
AVAILABLE = importlib.util.find_spec("numba") is not None


def compiled(signatures: list[Any], function: Callable[..., Any], **options: Any) -> Any:
    """``function`` compiled for ``signatures`` now, without the GIL, cached on disk where
    numba finds a writable place (beside the module, else the user's cache directory), else
    compiled in memory only (about a second more at the start)."""
    from numba import njit

    try:
        return njit(signatures, cache=True, nogil=True, **options)(function)
    except RuntimeError:   # numba: no locator available (read-only source, no writable home)
        return njit(signatures, nogil=True, **options)(function)


class Background(Generic[T]):
    """A loop loaded (compiled, or read from numba's cache: about half a second with numba's
    import) on a thread of its own, so that nothing waits for it: ``loop`` is None until it is
    ready, and the caller runs its fallback meanwhile. A worker and a feeder begin theirs at
    their first batch or block: not on the way to the job's first batch."""

    def __init__(self, load: Callable[[], T]):
        self.loop: T | None = None
        self.thread = threading.Thread(target=self._load, args=(load,), daemon=True,
                                       name="zbus-compile")
        self.thread.start()

    def _load(self, load: Callable[[], T]) -> None:
        try:
            self.loop = load()
        except Exception:   # the fallback runs on: said once
            log.exception("compiling a loop failed; its numpy/torch code runs instead")
