"""The arithmetic on 64-bit keys that every role shares: splitmix64, the mix under every key
and every hash of one (``roles.data.hashing``'s keys; a shard's key index, initial rows and
admission sketch), on whole arrays in numpy or one number in a compiled loop; and hash
placement (``shard_of``). Apart from the keys' module, which reads pyarrow's arrays, so that a
shard, which only mixes and places keys, never loads pyarrow (about 35 MB of its memory).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from roles.data.compiled import compiled

GOLDEN = np.uint64(0x9E3779B97F4A7C15)   # splitmix64's constants (``splitmix_one`` too,
M1 = np.uint64(0xBF58476D1CE4E5B9)       # which the compiled loops call)
M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


def mix_in_place(z: np.ndarray) -> np.ndarray:
    """``splitmix64`` of ``z`` (uint64) in place."""
    with np.errstate(over="ignore"):
        z += GOLDEN
        z ^= z >> _S30
        z *= M1
        z ^= z >> _S27
        z *= M2
        z ^= z >> _S31
    return z


def splitmix_one(z: np.uint64) -> np.uint64:
    """``splitmix64`` of one number (np.uint64), for compiled loops (the keys' and the
    shards' kernels)."""
    z = z + GOLDEN
    z = (z ^ (z >> np.uint64(30))) * M1
    z = (z ^ (z >> np.uint64(27))) * M2
    return z ^ (z >> np.uint64(31))


@functools.cache
def compiled_splitmix() -> Callable[[np.uint64], np.uint64]:
    """``splitmix_one`` compiled, inlined where a compiled loop calls it (the keys' and the
    shards' kernels): once per process, from numba's cache as the loops are (a process whose
    loops come from the cache compiles nothing)."""
    from numba import types

    return compiled([types.uint64(types.uint64)], splitmix_one, inline="always")  # type: ignore[no-any-return]


def splitmix64(x: np.ndarray) -> np.ndarray:
    """A strong 64-bit mix of each element (uint64 in, uint64 out; wraps modulo 2**64)."""
    return mix_in_place(np.asarray(x).astype(np.uint64, copy=True))


def shard_of(keys: np.ndarray, shards: int) -> np.ndarray:
    """Hash placement: the shard (or bucket) that owns each key, the key (as uint64) modulo
    ``shards``. Computed as a mask for a power of two, else as ``key - (key // n) * n``: numpy
    divides a uint64 array by one number with a multiply and shifts but takes the remainder
    one hardware division at a time (26,624 keys, a Criteo batch: 285-465 us with ``%``,
    75 us so, 18 us as a mask)."""
    u = np.ascontiguousarray(keys).view(np.uint64)
    n = np.uint64(shards)
    if shards & (shards - 1) == 0:
        return (u & (n - np.uint64(1))).view(np.int64)
    q = u // n
    q *= n
    return (u - q).view(np.int64)
