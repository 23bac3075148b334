"""Keys of plain text columns (roles.data.hashing ``_plain_keys``, roles.data.readers ``TEXT``):
a single-valued categorical column parsed as ``string`` and hashed row by row, chunk by chunk,
gets exactly the keys that the former path gave it (parsed dictionary-encoded, its chunks
combined, its distinct values cleaned and hashed, each row's key taken by index), whatever its
values: whitespace, ``?``, empty, null, long, non-ASCII, equal or mixed lengths, several chunks.

``old_hash_array`` below is that former path, verbatim, so that it stays the reference whatever
becomes of the module's own code."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from harness import REPO

import roles.data.readers as readers
from roles.data.hashing import field_seed, hash_array, hash_lists, hash_value
from roles.data.index import index_files, plan_parts
from roles.data.readers import Schema, read_part
from roles.data.source import DataSource
from roles.data.stream import slot_keys
from roles.job.fields import PAD
from roles.job.settings import load_job

# -- the former path (roles/data/hashing.py before row-by-row keys) ------------------------------

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
_LEN = np.uint64(0x9E3779B97F4A7C15)


def old_splitmix64(x: np.ndarray) -> np.ndarray:
    z = np.asarray(x).astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        z += _GOLDEN
        z = (z ^ (z >> _S30)) * _M1
        z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


def old_words(data, starts, lengths, width):
    n = len(starts)
    if n and (lengths == width).all() and (np.diff(starts) == width).all():
        flat = data[int(starts[0]):int(starts[0]) + n * width]
    else:
        at = starts[:, None] + np.arange(width)
        flat = np.where(np.arange(width) < lengths[:, None],
                        data[np.minimum(at, max(len(data) - 1, 0))] if len(data) else 0, 0)
    return np.ascontiguousarray(flat, dtype=np.uint8).reshape(n, width).view("<u8")


def old_hash_buffers(seed, data, offsets):
    starts = offsets[:-1].astype(np.int64)
    lengths = offsets[1:].astype(np.int64) - starts
    n = len(starts)
    if not n:
        return np.zeros(0, dtype=np.uint64)
    nwords = max(1, int(-(-int(lengths.max()) // 8)))
    h = np.full(n, seed, dtype=np.uint64)
    rows = max(1, (1 << 25) // (8 * nwords))
    for lo in range(0, n, rows):
        part = slice(lo, lo + rows)
        words = old_words(data, starts[part], lengths[part], 8 * nwords)
        g = h[part]
        for j in range(nwords):
            mixed = old_splitmix64(g ^ words[:, j])
            g = mixed if j == 0 else np.where(lengths[part] > 8 * j, mixed, g)
        h[part] = g
    with np.errstate(over="ignore"):
        return old_splitmix64(h ^ (lengths.astype(np.uint64) * _LEN + np.uint64(1)))


def old_string_buffers(values):
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


def old_unclean(data, offsets, nulls):
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


def old_clean(values):
    values = pc.utf8_trim_whitespace(values.cast(pa.string()))
    values = pc.if_else(pc.equal(values, "?"), "", values)
    return pc.fill_null(values, "")


def old_hash_array(field, values):
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks() if values.num_chunks else pa.array([], pa.string())
    if not pa.types.is_dictionary(values.type):
        values = pc.dictionary_encode(values)
    data, offsets = old_string_buffers(values.dictionary)
    if old_unclean(data, offsets, values.dictionary.null_count):
        data, offsets = old_string_buffers(old_clean(values.dictionary))
    keys = np.append(old_hash_buffers(field_seed(field), data, offsets),
                     old_hash_buffers(field_seed(field), data[:0], np.zeros(2, np.int64)))
    index = values.indices.fill_null(len(keys) - 1)
    return keys.view(np.int64)[index.to_numpy(zero_copy_only=False)]


def old_hash_lists(table, values, max_len):
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks() if values.num_chunks else pa.array(
            [], pa.list_(pa.string()))
    n = len(values)
    lengths = pc.fill_null(pc.list_value_length(values), 0).to_numpy(
        zero_copy_only=False).astype(np.int64)
    flat = values.flatten()
    keys = old_hash_array(table, flat) if len(flat) else np.zeros(0, np.int64)
    keys[keys == PAD] = PAD + 1
    ends = np.cumsum(lengths)
    kept = np.minimum(lengths, max_len)
    first = ends - kept
    at = np.arange(max_len)
    filled = at < kept[:, None]
    out = np.full((n, max_len), PAD, dtype=np.int64)
    if len(keys):
        out[filled] = keys[(first[:, None] + at)[filled]]
    return out


# -- adversarial values --------------------------------------------------------------------------

CLEAN = ["a", "ab", "68fd1e64", "7f4a7c15", "x" * 7, "x" * 8, "x" * 9, "y" * 16, "y" * 17,
         "z" * 100, "a b", "?a", "a?", "??", "a\tb", "日本a", "a日本", "~", "!", "Private"]
MISSING = ["", "?", None]
EDGY = [" ", "  ", " ?", "? ", " a", "a ", "\ta", "a\n", " 68fd1e64", "68fd1e64 ", "\x0bq",
        "q\x0c", "\x1cx", "x\x1f", "\x1e", "\x7f", "x\x7f", "\x00a", "a\x00", "é", "éa", "aé",
        "日本", "\u00a0x", "x\u00a0", "\u3000y", "\u2028", "\x85z", "  long value with spaces  "]
POOLS = {"clean": CLEAN + MISSING, "edgy": CLEAN + MISSING + EDGY,
         "hex": ["68fd1e64", "7f4a7c15", "00000000", "ffffffff", None, ""],   # one length
         "hex?": ["68fd1e64", "7f4a7c15", None, "", "?"],
         "hex16": ["68fd1e647f4a7c15", "0123456789abcdef", None, ""],
         "long": ["v" * k for k in range(1, 40)]}


def column(rng: np.random.Generator, pool: list, n: int) -> list:
    return [pool[i] for i in rng.integers(0, len(pool), n)]


def chunked(values: list, cuts: list[int], kind: pa.DataType | None = None) -> pa.ChunkedArray:
    kind = kind or pa.string()
    bounds = [0, *cuts, len(values)]
    return pa.chunked_array([pa.array(values[a:b], kind)
                             for a, b in zip(bounds[:-1], bounds[1:], strict=True)], kind)


def same(values) -> None:
    """The former keys, by the numpy code and by the compiled loop alike."""
    want = old_hash_array("f", values).tolist()
    for compiled in (False, True):
        got = hash_array("f", values, compiled=compiled)
        assert got.dtype == np.int64 and got.tolist() == want, compiled


@pytest.mark.parametrize("values", [
    [], [None], [""], ["?"], [None, "", "?"], ["a"], CLEAN, CLEAN + MISSING, ["68fd1e64"] * 5,
    ["68fd1e64", "7f4a7c15", "00000000"], ["68fd1e64", None, "7f4a7c15", ""], ["z" * 100],
    *([v] for v in EDGY), *(CLEAN + [v] for v in EDGY), *(CLEAN + MISSING + [v] for v in EDGY)])
def test_each_column_has_the_former_keys(values):
    same(pa.array(values, pa.string()))
    same(pa.array(values, pa.large_string()))
    same(pa.array(values, pa.string()).dictionary_encode())


@pytest.mark.parametrize("pool", sorted(POOLS))
def test_random_columns_in_several_chunks_have_the_former_keys(pool):
    rng = np.random.default_rng(len(pool))
    for _ in range(40):
        n = int(rng.integers(1, 300))
        values = column(rng, POOLS[pool], n)
        cuts = sorted(rng.integers(0, n + 1, int(rng.integers(0, 5))).tolist())
        same(pa.array(values, pa.string()))
        same(chunked(values, cuts))
        same(chunked(values, cuts, pa.large_string()))
        lo, hi = sorted(rng.integers(0, n + 1, 2).tolist())
        same(pa.array(values, pa.string()).slice(lo, hi - lo))    # an offset into buffers
        same(chunked(values, cuts).slice(lo, hi - lo))


def test_an_edgy_value_in_one_chunk_sends_the_whole_column_the_former_way():
    """The former path cleaned a column's distinct values only when one of them had ASCII
    whitespace at an edge (or was ``?``, empty or null), trimming then every kind of whitespace:
    a value with another edge (``\\x1c``, a no-break space) had a key that depended on the other
    values of its block. The new path sends such a column the former way, as a whole."""
    for edgy in ["\x1cx", "\u00a0x", "x\u3000"]:
        alone = pa.chunked_array([pa.array([edgy, "x"]), pa.array(["y"])])
        with_space = pa.chunked_array([pa.array([edgy, "x"]), pa.array([" y"])])
        same(alone)
        same(with_space)
        assert hash_array("f", alone)[0] != hash_array("f", with_space)[0]  # (as before)


@pytest.mark.parametrize("width", [2, 8, 16])
def test_a_null_slot_with_bytes_is_the_missing_key(width):
    a, b, c = ("a" * width, "b" * width, "c" * width)
    data = pa.py_buffer((a + b + c).encode())
    offsets = pa.py_buffer(np.array([0, width, 2 * width, 3 * width], np.int32).tobytes())
    validity = pa.py_buffer(np.packbits([1, 0, 1], bitorder="little").tobytes())
    values = pa.StringArray.from_buffers(3, offsets, data, validity, null_count=1)
    same(values)
    same(pa.chunked_array([values, values.slice(1), pa.array([a, None])]))
    assert hash_array("f", values).tolist() == [hash_value("f", a), hash_value("f", ""),
                                                hash_value("f", c)]


def test_empty_chunks_and_other_types():
    same(pa.chunked_array([], pa.string()))
    same(pa.chunked_array([pa.array([], pa.string()), pa.array(["a", None]),
                           pa.array([], pa.string())]))
    same(pa.array(["a", "b ", None], pa.binary()))
    same(pa.chunked_array([pa.array(["a", "b"]).dictionary_encode(),
                           pa.array(["b", "c"]).dictionary_encode()]))


def test_list_ids_have_the_former_keys():
    rng = np.random.default_rng(7)
    for pool in (CLEAN, CLEAN + EDGY, POOLS["hex"][:4]):
        lists = [column(rng, pool, int(rng.integers(0, 6))) if rng.random() > 0.1 else None
                 for _ in range(200)]
        values = pa.array(lists, pa.list_(pa.string()))
        for max_len in (1, 3, 8):
            want = old_hash_lists("t", values, max_len).tolist()
            assert hash_lists("t", values, max_len).tolist() == want
            assert hash_lists("t", values, max_len, compiled=True).tolist() == want


# -- through the reader: the former parse (dictionary-encoded, combined) against the new one -----

def read_keys(path: str, fmt: str, schema: Schema, former: bool) -> tuple[np.ndarray, list]:
    files = index_files([path], fmt)
    parts, _ = plan_parts(files, 0.0, 64.0)
    keys, rejected = [], []
    for part in parts:
        for block in read_part(files, part, fmt, schema, chunk_bytes=2048):
            hashed = [old_hash_array(name, col) if former else hash_array(name, col)
                      for name, col in zip(schema.sparse, block.sparse, strict=True)]
            if not former:   # and the compiled loop
                assert [hash_array(name, col, compiled=True).tolist() for name, col in zip(
                    schema.sparse, block.sparse, strict=True)] == [h.tolist() for h in hashed]
            keys.append(np.stack(hashed, axis=1) if hashed else np.zeros((0, 0), np.int64))
            rejected += [(r.line, r.reason) for r in block.rejected]
    return np.concatenate(keys), rejected


@pytest.mark.parametrize("fmt", ["tsv", "csv"])
def test_read_blocks_have_the_former_keys(tmp_path, monkeypatch, fmt):
    monkeypatch.setattr(readers, "PARSE_BLOCK_BYTES", 300)   # several chunks in each column
    rng = np.random.default_rng(3)
    pools = [POOLS["hex"], POOLS["clean"], POOLS["edgy"], POOLS["long"], CLEAN]
    sep = "\t" if fmt == "tsv" else ","
    lines = [sep.join(["y", "n", *(f"c{j}" for j in range(len(pools)))])]
    for i in range(600):
        cells = ["" if v is None else v.replace("\n", " ").replace(",", ";").replace('"', "'")
                 .replace("\r", " ").replace("\t", " " if fmt == "tsv" else "\t")
                 for v in (column(rng, pool, 1)[0] for pool in pools)]
        if i % 7 == 0:   # a whole block without any edgy value
            cells = [c.strip() for c in cells]
        lines.append(sep.join([str(i % 2), str(i), *cells]))
    lines[100] += sep + "extra"     # a row of the wrong width: its chunk read the slow way
    path = tmp_path / f"d.{fmt}"
    path.write_bytes(("\n".join(lines) + "\n").encode()
                     + b"1" + sep.encode() + b"5" + (sep.encode() + b"\xff") * len(pools) + b"\n")
    schema = Schema(label="y", dense=["n"], sparse=[f"c{j}" for j in range(len(pools))])
    new, new_rejected = read_keys(str(path), fmt, schema, former=False)
    with monkeypatch.context() as m:
        m.setattr(readers, "TEXT", readers.CATEGORICAL)   # the former parse
        old, old_rejected = read_keys(str(path), fmt, schema, former=True)
    assert new.shape == (599, len(pools)) and new.tolist() == old.tolist()
    assert new_rejected == old_rejected and len(new_rejected) == 2   # wide row, not UTF-8


def test_the_fast_path_parses_single_valued_columns_as_text(tmp_path):
    path = tmp_path / "d.tsv"
    path.write_text("y\tc\tl\n1\ta\tx|y\n0\t?\t\n")
    schema = Schema(label="y", dense=[], sparse=["c", "l"], lists={"l": "|"})
    files = index_files([str(path)], "tsv")
    parts, _ = plan_parts(files, 0.0, 64.0)
    (block,) = read_part(files, parts[0], "tsv", schema)
    assert block.sparse[0].type == pa.string()
    assert block.sparse[1].type == pa.list_(pa.string())
    assert hash_array("c", block.sparse[0]).tolist() == [hash_value("c", "a"),
                                                         hash_value("c", "")]


def test_bytes_that_add_up_as_one_length_are_not_taken_for_it():
    """8 + 4 bytes and a null slot of 4: 16 bytes, as two values of 8 would be."""
    data = pa.py_buffer(b"aaaaaaaabbbbcccc")
    offsets = pa.py_buffer(np.array([0, 8, 12, 16], np.int32).tobytes())
    validity = pa.py_buffer(np.packbits([1, 1, 0], bitorder="little").tobytes())
    values = pa.StringArray.from_buffers(3, offsets, data, validity, null_count=1)
    same(values)
    assert hash_array("f", values).tolist() == [hash_value("f", "aaaaaaaa"),
                                                hash_value("f", "bbbb"), hash_value("f", "")]


def test_a_blocks_slots_are_the_same_compiled_or_not_list_fields_and_shared_tables_too():
    """``slot_keys`` both ways over the generator's rows: single-valued fields, the ``genres``
    and ``history`` lists, and ``item`` sharing its table with ``history``."""
    job = load_job(str(REPO / "jobs" / "items_din.toml"), environ={})
    source = DataSource(job)
    _, parts, _ = source.index()
    layout = job.layout()
    assert layout.has_lists
    block = next(iter(source.blocks(parts[0])))
    a, b = slot_keys(layout, block, compiled=True), slot_keys(layout, block, compiled=False)
    assert a.shape == (len(block), layout.slots) and a.flags.c_contiguous
    assert np.array_equal(a, b) and (a == PAD).any() and (a != PAD).any()
