"""Sparse keys: every categorical value becomes a 64-bit key, hashed together with its field,
the same on every host, in every process and across versions (``KEY_HASH`` names the function;
an export records it and ``zbus-predict`` refuses an export hashed otherwise).

The key of value v (its UTF-8 bytes, surrounding whitespace removed; an empty, ``?`` or absent
value is the field's own "missing" value, the empty string) of field f:

    h = seed(f)                                  blake2b-64 of the field's name
    for each 8-byte word w of v (little-endian, the last one zero-padded; one zero word when
    v is empty): h = splitmix64(h xor w)
    key = splitmix64(h xor (len(v) * 0x9E3779B97F4A7C15 + 1)), as a signed 64-bit integer

It is vectorised: a block's column is dictionary-encoded (pyarrow), the distinct values are
hashed word by word with numpy over all of them at once, and every row takes its value's key
by index. (blake2b of each distinct value, as zbus did before, costs a Python call per value;
``scripts/bench_ingest.py`` measures both.)

Tables: the name a key is hashed with is its field's *table* (``roles.job.fields``): a field in
no ``[data.tables]`` entry is its own table, named as the field, so its keys are the ones above;
the fields of a shared table hash with the table's name, so that one id is one key in each.

List fields: ``hash_lists`` hashes each id of a list as a single value of its table (trimmed,
the same key), and lays a column of lists out as ``max_len`` slots a row, the newest (last)
``max_len`` ids in their order, left-aligned, the rest ``PAD``.
"""

from __future__ import annotations

from hashlib import blake2b

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from roles.job.fields import PAD

KEY_HASH = "zbus-key-v2"
MISSING = ("", "?")
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
_LEN = np.uint64(0x9E3779B97F4A7C15)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """A strong 64-bit mix of each element (uint64 in, uint64 out; wraps modulo 2**64)."""
    z = np.asarray(x).astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        z += _GOLDEN
        z = (z ^ (z >> _S30)) * _M1
        z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


def field_seed(field: str) -> np.uint64:
    return np.uint64(int.from_bytes(blake2b(field.encode(), digest_size=8).digest(), "little"))


def _words(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray, width: int) -> np.ndarray:
    """The strings as rows of ``width`` bytes (zero-padded), viewed as little-endian words."""
    n = len(starts)
    if n and (lengths == width).all() and (np.diff(starts) == width).all():
        flat = data[int(starts[0]):int(starts[0]) + n * width]  # equal lengths, back to back
    else:
        at = starts[:, None] + np.arange(width)
        flat = np.where(np.arange(width) < lengths[:, None],
                        data[np.minimum(at, max(len(data) - 1, 0))] if len(data) else 0, 0)
    return np.ascontiguousarray(flat, dtype=np.uint8).reshape(n, width).view("<u8")


def _hash_buffers(seed: np.uint64, data: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Keys (uint64) of the strings ``data[offsets[i]:offsets[i+1]]``."""
    starts = offsets[:-1].astype(np.int64)
    lengths = offsets[1:].astype(np.int64) - starts
    n = len(starts)
    if not n:
        return np.zeros(0, dtype=np.uint64)
    nwords = max(1, int(-(-int(lengths.max()) // 8)))
    h = np.full(n, seed, dtype=np.uint64)
    rows = max(1, (1 << 25) // (8 * nwords))  # bounded scratch for very long values
    for lo in range(0, n, rows):
        part = slice(lo, lo + rows)
        words = _words(data, starts[part], lengths[part], 8 * nwords)
        g = h[part]
        for j in range(nwords):
            mixed = splitmix64(g ^ words[:, j])
            g = mixed if j == 0 else np.where(lengths[part] > 8 * j, mixed, g)
        h[part] = g
    with np.errstate(over="ignore"):
        return splitmix64(h ^ (lengths.astype(np.uint64) * _LEN + np.uint64(1)))


def _string_buffers(values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(data bytes, offsets) of a string array without nulls."""
    offset_type: type[np.int64] | type[np.int32]
    if pa.types.is_large_string(values.type):
        offset_type = np.int64
    else:
        values = values.cast(pa.string())
        offset_type = np.int32
    _, offsets_buf, data_buf = values.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=offset_type)[values.offset:
                                                          values.offset + len(values) + 1]
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else \
        np.zeros(0, dtype=np.uint8)
    return data, offsets


_SPACE = np.zeros(256, dtype=bool)
_SPACE[[9, 10, 11, 12, 13, 32]] = True


def _unclean(data: np.ndarray, offsets: np.ndarray, nulls: int) -> bool:
    """Some value needs cleaning: a null, a ``?``, or surrounding whitespace (checked on the
    bytes, so that the usual clean column costs no pass of pyarrow over its text)."""
    if nulls:
        return True
    starts = offsets[:-1].astype(np.int64)
    lengths = offsets[1:].astype(np.int64) - starts
    filled = lengths > 0
    if not filled.all():
        return True
    first, last = data[starts], data[starts + lengths - 1]
    return bool(_SPACE[first].any() or _SPACE[last].any()
                or ((lengths == 1) & (first == ord("?"))).any())


def clean(values: pa.Array) -> pa.Array:
    """Values as keys see them: trimmed, with empty, ``?`` and nulls all the empty string."""
    values = pc.utf8_trim_whitespace(values.cast(pa.string()))
    values = pc.if_else(pc.equal(values, "?"), "", values)
    return pc.fill_null(values, "")


def hash_array(field: str, values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Keys (int64) of a column of values of one field, hashed with ``field`` (the name of the
    field's table: its own name unless ``[data.tables]`` shares one): the column is
    dictionary-encoded as it is, and only its distinct values are cleaned and hashed."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks() if values.num_chunks else pa.array([], pa.string())
    if not pa.types.is_dictionary(values.type):
        values = pc.dictionary_encode(values)
    data, offsets = _string_buffers(values.dictionary)
    if _unclean(data, offsets, values.dictionary.null_count):
        data, offsets = _string_buffers(clean(values.dictionary))
    keys = np.append(_hash_buffers(field_seed(field), data, offsets),
                     _hash_buffers(field_seed(field), data[:0], np.zeros(2, np.int64)))
    index = values.indices.fill_null(len(keys) - 1)  # a null: the missing value's key
    return keys.view(np.int64)[index.to_numpy(zero_copy_only=False)]


def hash_lists(table: str, values: pa.ListArray | pa.LargeListArray | pa.ChunkedArray,
               max_len: int) -> np.ndarray:
    """Slots (int64 [rows, max_len]) of a column of lists of ids of one table: each row's newest
    (last) ``max_len`` ids, in their order, left-aligned, padded with ``PAD``; a null or an
    empty list is all ``PAD``.

    The ids are hashed as ``hash_array`` hashes single values (the flattened ids are
    dictionary-encoded, each distinct id cleaned and hashed once), so an id has the same key in
    a list as alone in a field of the same table. The reader rejects a row with an empty, ``?``
    or null id inside a list, so none is expected here (one would take the table's "missing"
    key). A key that happens to equal ``PAD`` (one in 2**64) becomes ``PAD + 1``, so that a
    slot holding an id is never taken for padding.
    """
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks() if values.num_chunks else pa.array(
            [], pa.list_(pa.string()))
    n = len(values)
    lengths = pc.fill_null(pc.list_value_length(values), 0).to_numpy(
        zero_copy_only=False).astype(np.int64)
    flat = values.flatten()   # the ids of the non-null lists, in order
    keys = hash_array(table, flat) if len(flat) else np.zeros(0, np.int64)
    keys[keys == PAD] = PAD + 1
    ends = np.cumsum(lengths)
    kept = np.minimum(lengths, max_len)
    first = ends - kept                  # each row's first kept id in ``flat``
    at = np.arange(max_len)
    filled = at < kept[:, None]
    out = np.full((n, max_len), PAD, dtype=np.int64)
    if len(keys):
        out[filled] = keys[(first[:, None] + at)[filled]]
    return out


def hash_values(field: str, values: list[str] | np.ndarray) -> np.ndarray:
    """Keys of values given as Python strings (or numbers, hashed as their text)."""
    return hash_array(field, pa.array([str(v) for v in values], pa.string()))


def hash_value(field: str, value: str) -> int:
    """The key of one value of one field."""
    return int(hash_values(field, [value])[0])


def shard_of(keys: np.ndarray, shards: int) -> np.ndarray:
    """Hash placement: the shard that owns each key."""
    return (keys.view(np.uint64) % np.uint64(shards)).astype(np.int64)
