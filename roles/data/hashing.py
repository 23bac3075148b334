"""Sparse keys: every categorical value becomes a 64-bit key, hashed together with its field,
the same on every host, in every process and across versions (``KEY_HASH`` names the function;
an export records it and ``zbus-predict`` refuses an export hashed otherwise).

The key of value v (its UTF-8 bytes, surrounding whitespace removed; an empty, ``?`` or absent
value is the field's own "missing" value, the empty string) of field f:

    h = seed(f)                                  blake2b-64 of the field's name
    for each 8-byte word w of v (little-endian, the last one zero-padded; one zero word when
    v is empty): h = splitmix64(h xor w)
    key = splitmix64(h xor (len(v) * 0x9E3779B97F4A7C15 + 1)), as a signed 64-bit integer

It is vectorised, with numpy over a whole column at once, or, where a feeder hashes a plain
text column, one compiled pass over its buffers (``plain_keys_into``, numba; the same keys).
A ``string`` column (in the chunks
pyarrow parsed it in) whose values all start and end with a printable ASCII character other
than the space, or are empty, ``?`` or null, is hashed row by row straight from its offsets and
bytes (``_plain_keys``): no value needs trimming. Any other column (a value with whitespace, a
control or a non-ASCII character at an edge; a dictionary-encoded column) is dictionary-encoded
as a whole, its distinct values cleaned and hashed, and every row takes its value's key by
index, as every column was before. Both give the same keys
(``tests/roles/data/test_plain_keys.py``).
Measured on a Criteo-layout file (26 columns of 8 hex characters or empty; 8 parts, CPU a row,
median of 3): parsed as ``string`` and hashed row by row, rather than dictionary-encoded while
parsed, combined and hashed by distinct value, reading took 1.34 against 2.24 us and hashing
0.44 against 0.36 (1.78 against 2.60 in all); on the Adult data (8 columns of a few distinct
values, of up to 26 bytes) 1.77 against 1.76 (hashing 0.23 against 0.10). (blake2b of each
distinct value, as zbus did before, costs a Python call per value; ``scripts/bench_ingest.py``
measures both.)

Tables: the name a key is hashed with is its field's *table* (``roles.job.fields``): a field in
no ``[data.tables]`` entry is its own table, named as the field, so its keys are the ones above;
the fields of a shared table hash with the table's name, so that one id is one key in each.

Weights per id (``roles.job.fields``'s derived fields, ``wide:<f>`` and ``cross:<a>*<b>``):
their keys are made from the data fields' keys, not from text (``derived_keys``): h = seed of
the derived field's name, then for each source key k, h = splitmix64(h xor k). So the same id
(or tuple of ids) is the same key wherever it is made, and a ``wide:`` key differs from its
field's own key. A list field's ``PAD`` stays ``PAD``; no derived key is ``PAD``.

List fields: ``hash_lists`` hashes each id of a list as a single value of its table (trimmed,
the same key), and lays a column of lists out as ``max_len`` slots a row, the newest (last)
``max_len`` ids in their order, left-aligned, the rest ``PAD``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from hashlib import blake2b
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from roles.data.compiled import compiled as compile_loop
from roles.data.keyspace import compiled_splitmix, mix_in_place, splitmix_one
from roles.job.fields import PAD

KEY_HASH = "zbus-key-v2"
MISSING = ("", "?")
_LEN = np.uint64(0x9E3779B97F4A7C15)


def field_seed(field: str) -> np.uint64:
    return np.uint64(int.from_bytes(blake2b(field.encode(), digest_size=8).digest(), "little"))


_MASKS = np.array([(1 << 8 * k) - 1 for k in range(9)], dtype=np.uint64)  # a word's first k bytes


def _padded(pieces: list[np.ndarray]) -> np.ndarray:
    """Bytes laid end to end, zero-padded to whole words with at least 8 bytes more, so that
    ``_words_at`` can read the word after any offset up to their length (``.view("<u8")``)."""
    size = sum(len(p) for p in pieces)
    return np.concatenate([*pieces, np.zeros(16 - size % 8, dtype=np.uint8)])


def _words_at(words: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The 8 bytes at each byte offset ``starts`` (int64) of ``words`` (``_padded``), as
    little-endian words: two aligned gathers and shifts each (``np.take`` from a view of a
    word at every byte copies that view whole first, 8 bytes for each byte)."""
    lo = np.take(words, starts >> 3)
    hi = np.take(words, (starts >> 3) + 1)
    shift = ((starts & 7) << 3).astype(np.uint64)
    lo >>= shift
    hi <<= np.uint64(1)    # and by 63 - shift: by 64 - shift in all, nothing of hi when it is 0
    hi <<= np.uint64(63) - shift
    lo |= hi
    return lo


def _hash_spans(seed: np.uint64, words: np.ndarray, starts: np.ndarray,
                lengths: np.ndarray) -> np.ndarray:
    """Keys (uint64) of the strings of ``lengths[i]`` bytes at byte offsets ``starts[i]`` (int64
    arrays) of ``words`` (``_padded`` bytes as words)."""
    if not len(starts):
        return np.zeros(0, dtype=np.uint64)
    h = _words_at(words, starts)   # word 0 of every value (one zero word when it is empty)
    h &= np.take(_MASKS, np.minimum(lengths, 8))
    h ^= seed
    mix_in_place(h)
    for at in range(8, int(lengths.max()), 8):   # the words after it, of the values that have one
        live = np.flatnonzero(lengths > at)
        g = _words_at(words, starts[live] + at)
        g &= np.take(_MASKS, np.minimum(lengths[live] - at, 8))
        g ^= h[live]
        h[live] = mix_in_place(g)
    with np.errstate(over="ignore"):
        h ^= lengths.astype(np.uint64) * _LEN + np.uint64(1)
    return mix_in_place(h)


def _fixed_keys(seed: np.uint64, padded: np.ndarray, size: int,
                lengths: np.ndarray) -> np.ndarray | None:
    """Keys (uint64) of values each empty or of one length, a multiple of 8, and laid back to
    back in ``padded[:size]`` (hexadecimal ids, say): their words read in place rather than
    gathered (``hash_array`` of a Criteo column: 11.8 against 16.6 ns a value); None for any
    other values."""
    width = int(lengths.max()) if len(lengths) else 0
    filled = lengths > 0
    count = int(np.count_nonzero(filled))
    if not width or width % 8 or width * count != size or int(lengths.sum()) != size:
        return None
    words = padded[:size].view("<u8").reshape(count, width // 8)
    h = np.full(count, seed, dtype=np.uint64)
    for j in range(width // 8):
        h ^= words[:, j]
        mix_in_place(h)
    h ^= np.uint64((width * int(_LEN) + 1) % (1 << 64))
    mix_in_place(h)
    if count == len(lengths):
        return h
    keys = np.full(len(lengths), _missing_key(seed))
    keys[filled] = h
    return keys


def derived_keys(field: str, sources: list[np.ndarray]) -> np.ndarray:
    """int64 keys of the derived field ``field`` from its data fields' keys (arrays of one
    shape; a weight per id has one source, a cross several), as the module's text says."""
    h = np.full(np.shape(sources[0]), field_seed(field), dtype=np.uint64)
    for keys in sources:
        h ^= np.asarray(keys).view(np.uint64)
        mix_in_place(h)
    out = h.view(np.int64)
    out[out == PAD] = PAD + 1
    if len(sources) == 1:
        out[np.asarray(sources[0]) == PAD] = PAD
    return out


def missing_key(table: str) -> int:
    """The key a missing value (empty, ``?``, null) of a field of ``table`` hashes to."""
    return int(np.uint64(_missing_key(field_seed(table))).view(np.int64))


def _missing_key(seed: np.uint64) -> np.uint64:
    """The key of the empty value: an empty, ``?`` or null value's."""
    none = np.zeros(1, np.int64)
    return _hash_spans(seed, _padded([]).view("<u8"), none, none)[0]


_SPACE = np.zeros(256, dtype=bool)
_SPACE[[9, 10, 11, 12, 13, 32]] = True


def _unclean(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray, nulls: int) -> bool:
    """Some value needs cleaning: a null, an empty value, a ``?``, or surrounding whitespace
    (checked on the bytes, so that the usual clean column costs no pass of pyarrow over its
    text)."""
    if nulls or not (lengths > 0).all():
        return True
    first, last = data[starts], data[starts + lengths - 1]
    return bool(_SPACE[first].any() or _SPACE[last].any()
                or ((lengths == 1) & (first == ord("?"))).any())


_PLAIN = np.zeros(256, dtype=bool)
_PLAIN[0x21:0x7F] = True   # printable ASCII but the space: no trimming removes one


def _string_buffers(chunk: pa.Array) -> tuple[np.ndarray, np.ndarray | None,
                                               np.ndarray | None] | None:
    """A ``string`` chunk's offsets (its own ``len + 1``, into its data), its data's bytes and
    its validity bitmap's (None: no data; no null), as read-only views; None for a chunk of
    another type."""
    if not (pa.types.is_string(chunk.type) or pa.types.is_large_string(chunk.type)):
        return None
    validity, offsets_buf, data_buf = chunk.buffers()
    first = chunk.offset
    offsets = np.frombuffer(offsets_buf, dtype=np.int64 if pa.types.is_large_string(
        chunk.type) else np.int32)[first:first + len(chunk) + 1]
    data = None if data_buf is None else np.frombuffer(data_buf, dtype=np.uint8)
    valid = np.frombuffer(validity, dtype=np.uint8) if chunk.null_count else None
    return offsets, data, valid


def _spans(chunks: list[pa.Array]) -> tuple[np.ndarray, int, np.ndarray, np.ndarray] | None:
    """A ``string`` column's bytes (``_padded``), how many, and its values' starts and lengths
    (a null's 0), its chunks laid end to end; None if a chunk is of another type."""
    datas, starts, lengths, at = [], [], [], 0
    for chunk in chunks:
        buffers = _string_buffers(chunk)
        if buffers is None:
            return None
        n, first = len(chunk), chunk.offset
        if not n:
            continue
        offsets, data, valid = buffers
        offsets = offsets.astype(np.int64)
        lo, hi = int(offsets[0]), int(offsets[-1])
        if hi > lo:
            assert data is not None, "a string chunk with bytes has a data buffer"
            datas.append(data[lo:hi])
        length = np.diff(offsets)
        if valid is not None:
            bits = valid[first // 8:(first + n + 7) // 8]
            length *= np.unpackbits(bits, bitorder="little")[first % 8:first % 8 + n]
        starts.append(offsets[:-1] + (at - lo))
        lengths.append(length)
        at += hi - lo
    if not starts:
        return _padded([]), 0, np.zeros(0, np.int64), np.zeros(0, np.int64)
    return _padded(datas), at, np.concatenate(starts), np.concatenate(lengths)


def _plain_keys(seed: np.uint64, chunks: list[pa.Array]) -> np.ndarray | None:
    """Keys (uint64) of a ``string`` column hashed row by row, or None: another type, or a value
    with a byte at an edge that trimming might remove (``_PLAIN``: the caller cleans it)."""
    spans = _spans(chunks)
    if spans is None:
        return None
    padded, size, starts, lengths = spans
    if size and not (0x21 <= padded[:size].min() and padded[:size].max() <= 0x7E):
        first = padded[starts]   # then check each value's edges (an empty one's are ignored)
        last = padded[starts + lengths - 1]
        if ((lengths > 0) & ~(_PLAIN[first] & _PLAIN[last])).any():
            return None
    single = lengths == 1
    if single.any():
        lengths[single & (padded[starts] == ord("?"))] = 0   # "?": missing, the empty value
    keys = _fixed_keys(seed, padded, size, lengths)
    return keys if keys is not None else _hash_spans(seed, padded.view("<u8"), starts, lengths)


def _plain_loop(seed: np.uint64, offsets: np.ndarray, data: np.ndarray, valid: np.ndarray,
                bit0: int, out: np.ndarray) -> bool:
    """``_plain_keys`` of one chunk in one pass, compiled: the key of value i (bytes
    ``data[offsets[i]:offsets[i + 1]]``; null where bit ``bit0 + i`` of ``valid`` is 0, unless
    ``valid`` is empty) into ``out[i]``. False, part written, at a value with a byte at an edge
    that trimming might remove (``_PLAIN``: the caller hashes the column otherwise)."""
    missing = np.int64(one(one(seed) ^ np.uint64(1)))   # the empty value's: one zero word
    checked = len(valid) > 0
    for i in range(len(offsets) - 1):
        if checked:
            bit = bit0 + i
            if not (valid[bit >> 3] >> (bit & 7)) & 1:
                out[i] = missing
                continue
        start, end = np.int64(offsets[i]), np.int64(offsets[i + 1])
        length = end - start
        if length == 0 or (length == 1 and data[start] == 63):   # empty, "?"
            out[i] = missing
            continue
        first, last = data[start], data[end - 1]
        if first < 0x21 or first > 0x7E or last < 0x21 or last > 0x7E:
            return False
        h = seed
        at = start
        while end - at >= 8:   # whole words, then the last one zero-padded
            word = (np.uint64(data[at]) | np.uint64(data[at + 1]) << np.uint64(8)
                    | np.uint64(data[at + 2]) << np.uint64(16)
                    | np.uint64(data[at + 3]) << np.uint64(24)
                    | np.uint64(data[at + 4]) << np.uint64(32)
                    | np.uint64(data[at + 5]) << np.uint64(40)
                    | np.uint64(data[at + 6]) << np.uint64(48)
                    | np.uint64(data[at + 7]) << np.uint64(56))
            h = one(h ^ word)
            at += 8
        if at < end:
            word = np.uint64(0)
            shift = np.uint64(0)
            while at < end:
                word |= np.uint64(data[at]) << shift
                shift += np.uint64(8)
                at += 1
            h = one(h ^ word)
        out[i] = np.int64(one(h ^ (np.uint64(length) * _LEN + np.uint64(1))))
    return True


one: Callable[[np.uint64], np.uint64] = splitmix_one   # as the loop calls it (compiled there)


@functools.cache
def compiled_loop() -> Any:
    """``_plain_loop`` compiled (at the first column a process hashes so: not at import)."""
    global one   # noqa: PLW0603 - the helper the loop calls must be compiled first
    from numba import types

    one = compiled_splitmix()
    u8 = types.Array(types.uint8, 1, "C", readonly=True)   # pyarrow's buffers
    out = types.Array(types.int64, 1, "C")
    return compile_loop([types.boolean(types.uint64, types.Array(offsets, 1, "C", readonly=True),
                                       u8, u8, types.int64, out)
                         for offsets in (types.int32, types.int64)], _plain_loop)


_NO_BYTES = np.zeros(0, dtype=np.uint8)
_NO_BYTES.flags.writeable = False


def plain_keys_into(seed: np.uint64, chunks: list[pa.Array], out: np.ndarray) -> bool:
    """``_plain_keys`` compiled, straight from the chunks' buffers into ``out`` (int64, C
    order), or False: a chunk of another type, or a value that needs cleaning (the column is
    then hashed by ``hash_array``). A Criteo block: 14 ns a value against the numpy code's 25-45
    (several whole-array passes per word)."""
    loop = compiled_loop()
    row = 0
    for chunk in chunks:
        buffers = _string_buffers(chunk)
        if buffers is None:
            return False
        n = len(chunk)
        if not n:
            continue
        offsets, data, valid = buffers
        if not loop(seed, offsets, _NO_BYTES if data is None else data,
                    _NO_BYTES if valid is None else valid, chunk.offset, out[row:row + n]):
            return False
        row += n
    return True


def _dictionary_keys(seed: np.uint64, dictionary: pa.Array) -> np.ndarray:
    """Keys (uint64) of a dictionary's distinct values (as text), cleaned first when one of
    them needs it (``_unclean``)."""
    if not (pa.types.is_string(dictionary.type) or pa.types.is_large_string(dictionary.type)):
        dictionary = dictionary.cast(pa.string())
    spans = _spans([dictionary])
    assert spans is not None, "a string column"
    padded, _, starts, lengths = spans
    if _unclean(padded, starts, lengths, dictionary.null_count):
        spans = _spans([clean(dictionary)])
        assert spans is not None, "a string column"
        padded, _, starts, lengths = spans
    return _hash_spans(seed, padded.view("<u8"), starts, lengths)


def clean(values: pa.Array) -> pa.Array:
    """Values as keys see them: trimmed, with empty, ``?`` and nulls all the empty string."""
    values = pc.utf8_trim_whitespace(values.cast(pa.string()))
    values = pc.if_else(pc.equal(values, "?"), "", values)
    return pc.fill_null(values, "")


def _chunks(values: pa.Array | pa.ChunkedArray) -> list[pa.Array]:
    return values.chunks if isinstance(values, pa.ChunkedArray) else [values]


def hash_into(field: str, values: pa.Array | pa.ChunkedArray, out: np.ndarray,
              compiled: bool = False) -> None:
    """``hash_array(field, values)`` into ``out`` (int64, C order): ``compiled``, a plain text
    column in one compiled pass (``plain_keys_into``)."""
    if not (compiled and plain_keys_into(field_seed(field), _chunks(values), out)):
        out[:] = hash_array(field, values)


def hash_array(field: str, values: pa.Array | pa.ChunkedArray,
               compiled: bool = False) -> np.ndarray:
    """Keys (int64) of a column of values of one field, hashed with ``field`` (the name of the
    field's table: its own name unless ``[data.tables]`` shares one): a plain text column row
    by row (``_plain_keys``); any other dictionary-encoded as a whole, and only its distinct
    values cleaned and hashed. (That path cleans the values only when one of them has ASCII
    whitespace at an edge or is missing, so a value with another space at an edge, U+00A0 or
    U+001C, has one key or another as the rest of its column goes: kept as it was, since a key
    must not change.)"""
    if compiled:
        out = np.empty(len(values), dtype=np.int64)
        hash_into(field, values, out, compiled=True)
        return out
    seed = field_seed(field)
    keys = _plain_keys(seed, _chunks(values))
    if keys is not None:
        return keys.view(np.int64)
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks() if values.num_chunks else pa.array([], pa.string())
    if not pa.types.is_dictionary(values.type):
        values = pc.dictionary_encode(values)
    keys = np.append(_dictionary_keys(seed, values.dictionary), _missing_key(seed))
    index = values.indices.fill_null(len(keys) - 1)  # a null: the missing value's key
    return keys.view(np.int64)[index.to_numpy(zero_copy_only=False)]


def hash_lists(table: str, values: pa.ListArray | pa.LargeListArray | pa.ChunkedArray,
               max_len: int, compiled: bool = False) -> np.ndarray:
    """Slots (int64 [rows, max_len]) of a column of lists of ids of one table: each row's newest
    (last) ``max_len`` ids, in their order, left-aligned, padded with ``PAD``; a null or an
    empty list is all ``PAD``.

    The ids are hashed as ``hash_array`` hashes single values (the flattened ids as one
    column), so an id has the same key in a list as alone in a field of the same table. The
    reader rejects a row with an empty, ``?`` or null id inside a list, so none is expected here
    (one would take the table's "missing" key). A key that happens to equal ``PAD`` (one in
    2**64) becomes ``PAD + 1``, so that a slot holding an id is never taken for padding.
    """
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks() if values.num_chunks else pa.array(
            [], pa.list_(pa.string()))
    n = len(values)
    lengths = pc.fill_null(pc.list_value_length(values), 0).to_numpy(
        zero_copy_only=False).astype(np.int64)
    flat = values.flatten()   # the ids of the non-null lists, in order
    keys = hash_array(table, flat, compiled) if len(flat) else np.zeros(0, np.int64)
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
