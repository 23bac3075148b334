"""Sparse keys: every categorical value becomes a 64-bit key, hashed together with its field,
the same on every host and in every process (blake2b, not Python's salted ``hash``)."""

from __future__ import annotations

from hashlib import blake2b

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def hash_value(field: str, value: str) -> int:
    """The signed 64-bit key of one value of one field."""
    digest = blake2b(f"{field}\x1f{value}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def hash_column(field: str, values: np.ndarray) -> np.ndarray:
    """Keys of a column of values (any dtype; hashed as text); each distinct value hashed once."""
    uniq, inverse = np.unique(np.asarray(values), return_inverse=True)
    keys = np.fromiter((hash_value(field, str(v)) for v in uniq), dtype=np.int64,
                       count=len(uniq))
    return keys[inverse.reshape(-1)]


def splitmix64(x: np.ndarray) -> np.ndarray:
    """A strong 64-bit mix of each element (uint64 in, uint64 out; wraps modulo 2**64)."""
    z = np.asarray(x).astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        z += _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def shard_of(keys: np.ndarray, shards: int) -> np.ndarray:
    """Hash placement: the shard that owns each key."""
    return (keys.view(np.uint64) % np.uint64(shards)).astype(np.int64)
