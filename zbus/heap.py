"""The process heap: glibc's malloc kept from handing memory back between two messages.

Every message a role handles allocates and frees buffers of the same sizes again (a batch's
keys, rows, gradients, the network's activations: hundreds of kilobytes to a few megabytes
each). glibc's defaults give such a buffer back to the kernel when it is freed (``mmap``
above a threshold that starts at 128 KiB; the heap's top trimmed once more than twice that
threshold is free there), and the next message's buffer of the same size page-faults its
memory in again, a page of 4 KiB at a time, each one zeroed by the kernel. In a Criteo job
of 3M rows (2 workers, 2 shards) the workers took 396,000-705,000 minor page faults each;
with the heap kept, 63,000-72,000 (docs/benchmarks.md, "Eleventh round").

``keep_heap`` sets three of malloc's parameters (``mallopt``) at a role's start:
allocations below ``MMAP_BELOW`` come from the heap, the heap's free top is given back only
beyond ``TRIM_ABOVE``, and the heap grows by ``TOP_PAD`` more than it needs (address space,
not resident memory, until it is used). A role's resident memory then stays near its peak
instead of falling back between messages; the peak itself does not grow. Left alone when
the C library is not glibc, or when the environment sets malloc's parameters itself
(``GLIBC_TUNABLES`` with ``glibc.malloc.``, or a ``MALLOC_*_`` variable): the operator's
choice wins.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping

MMAP_BELOW = 32 << 20    # glibc's own ceiling for its moving threshold
TRIM_ABOVE = 128 << 20
TOP_PAD = 16 << 20

_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3   # <malloc.h>
_OPERATOR_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_",
                       "MALLOC_ARENA_MAX", "MALLOC_ARENA_TEST")


def operator_set(environ: Mapping[str, str]) -> bool:
    """Whether the environment sets malloc's parameters itself."""
    return "glibc.malloc." in environ.get("GLIBC_TUNABLES", "") or any(
        name in environ for name in _OPERATOR_VARIABLES)


def glibc() -> bool:
    """Whether the C library this process runs on is glibc (asked of the library itself:
    ``platform.libc_ver`` guesses from the strings of the Python executable, reading all of
    it)."""
    try:
        return (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc ")
    except (ValueError, OSError):   # a C library without the name
        return False


def keep_heap() -> bool:
    """Tune this process's malloc as above; whether it was (glibc, and not set already)."""
    if not glibc() or operator_set(os.environ):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return all(mallopt(param, value) == 1 for param, value in (
        (_M_MMAP_THRESHOLD, MMAP_BELOW), (_M_TRIM_THRESHOLD, TRIM_ABOVE), (_M_TOP_PAD, TOP_PAD)))
