"""List fields and shared tables, from the files to a sample's key slots (roles.data.readers,
roles.data.hashing, roles.data.stream): ids split at their separator (text) or taken as Parquet
lists, the newest ``max_len`` kept, left-aligned and padded; rows with an empty id rejected with
their line numbers; a shared table's fields giving one id one key; and the generator's item
fields (``[data.synthetic] items``)."""

from __future__ import annotations

import csv
import io
import tempfile
from functools import cache
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from roles.algorithms.shared.metrics import auc
from roles.data.hashing import hash_lists, hash_value
from roles.data.index import DataError, index_files, plan_parts
from roles.data.readers import RawBlock, Schema, read_part
from roles.data.source import DataSource
from roles.data.stream import Preparer
from roles.data.synthetic import BLOCK_ROWS, Generator
from roles.data.transforms import DenseTransform
from roles.data.weighting import weigh
from roles.job.fields import PAD, FieldLayout
from roles.job.settings import parse_job

SEPARATORS = ["|", ";", ",", "::"]
FORBIDDEN = "|;,:\"\t\n\r"   # in an id: the separators, csv quoting, the field delimiters


def read_rows(path: str, fmt: str, schema: Schema):
    """Every block of the file, in file order."""
    files = index_files([path], fmt)
    parts, _ = plan_parts(files, 0.0, 64.0)
    return [b for p in parts for b in read_part(files, p, fmt, schema)]


def slots(blocks: list[RawBlock], layout: FieldLayout) -> np.ndarray:
    prepare = Preparer(layout, DenseTransform(False, np.zeros(0), np.ones(0)), None)
    return np.concatenate([prepare.keys(b) for b in blocks])


def expected(table: str, ids: list[str], max_len: int) -> list[int]:
    """A list's slots as the layout defines them, one id at a time."""
    kept = [hash_value(table, i) for i in ids][-max_len:] if ids else []
    return kept + [int(PAD)] * (max_len - len(kept))


def layout_of(fields: list[str], lists: dict[str, str], max_len: dict[str, int],
              tables: dict[str, list[str]] | None = None) -> FieldLayout:
    return FieldLayout.of(fields, lists, tables or {}, 8, {}, {}, max_len)


# -- text: a property of any ids, separators and lengths -----------------------------------------

def _core(text: str) -> str:
    return text.strip()


ID = st.text(st.characters(blacklist_categories=("Cs", "Cc", "Zs", "Zl", "Zp"),
                           blacklist_characters=FORBIDDEN), min_size=1, max_size=12).filter(
    lambda s: _core(s) == s and s != "?")
PADDED = st.tuples(st.sampled_from(["", " ", "  "]), ID, st.sampled_from(["", " "]))
ROW = st.one_of(st.lists(PADDED, min_size=0, max_size=12),      # a list (maybe empty)
                st.sampled_from(["?", " ", " ? "]),               # an empty one, said otherwise
                st.lists(PADDED, min_size=1, max_size=4).map(lambda ids: ("bad", ids)))


@settings(max_examples=40, deadline=None)
@given(rows=st.lists(ROW, min_size=1, max_size=30), fmt=st.sampled_from(["csv", "tsv"]),
       sep=st.sampled_from(SEPARATORS), max_len=st.integers(1, 6),
       bad_at=st.integers(0, 2))
def test_text_lists_are_the_newest_ids_padded_and_empty_ids_reject_their_row(
        rows, fmt, sep, max_len, bad_at):
    """Each row's slots are its ids hashed one by one, the newest ``max_len`` kept; a row with
    an empty id inside its list is rejected on its own line, the rows around it kept."""
    lines, want, bad_lines = [], [], []
    for n, row in enumerate(rows):
        line = n + 2   # after the header
        if isinstance(row, str):            # "?", blanks: an empty list
            value, ids = row, []
        elif isinstance(row, tuple):        # an empty id inside (or at the end of) the list
            pieces = [a + i + b for a, i, b in row[1]]
            pieces.insert(min(bad_at, len(pieces)), " " if bad_at == 1 else "")
            value, ids = sep.join(pieces), None
            bad_lines.append(line)
        else:
            value, ids = sep.join(a + i + b for a, i, b in row), [i for _, i, _ in row]
        if ids is not None:
            want.append(expected("h", ids, max_len))
        lines.append((str(n % 2), f"m{n}", value))
    out = io.StringIO()
    if fmt == "csv":
        csv.writer(out, lineterminator="\n", quoting=csv.QUOTE_MINIMAL).writerows(
            [("y", "m", "h"), *lines])
    else:
        out.write("".join("\t".join(r) + "\n" for r in [("y", "m", "h"), *lines]))
    schema = Schema(label="y", dense=[], sparse=["m", "h"], lists={"h": sep})
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/d.{fmt}"
        Path(path).write_text(out.getvalue(), encoding="utf-8")
        blocks = read_rows(path, fmt, schema)
    rejected = [r for b in blocks for r in b.rejected]
    assert [(r.line, r.reason) for r in rejected] == [
        (line, "column 'h': empty id in a list") for line in bad_lines]
    got = slots(blocks, layout_of(["m", "h"], {"h": sep}, {"h": max_len}))
    assert got[:, 1:].tolist() == want
    kept = [f"m{n}" for n, r in enumerate(rows) if not isinstance(r, tuple)]
    assert got[:, 0].tolist() == [hash_value("m", m) for m in kept]


def test_a_list_field_of_text_needs_its_separator(tmp_path):
    (tmp_path / "d.csv").write_text("y,h\n1,a|b\n0,c\n")
    with pytest.raises(DataError, match="column 'h' of .*d.csv is text: give the separator"):
        read_rows(str(tmp_path / "d.csv"), "csv", Schema(label="y", dense=[], sparse=["h"],
                                                          lists={"h": ""}))


def test_list_blocks_hold_list_of_string_columns_of_trimmed_ids(tmp_path):
    (tmp_path / "d.tsv").write_text("y\th\n1\t a :: b \n0\t\n1\t?\n0\tc\n")
    blocks = read_rows(str(tmp_path / "d.tsv"), "tsv",
                       Schema(label="y", dense=[], sparse=["h"], lists={"h": "::"}))
    cols = [b.sparse[0] for b in blocks]
    assert all(c.type == pa.list_(pa.string()) for c in cols)
    assert sum((c.to_pylist() for c in cols), []) == [["a", "b"], [], [], ["c"]]


# -- Parquet --------------------------------------------------------------------------------------

def test_parquet_lists_of_strings_integers_and_large_lists(tmp_path):
    ids = [["7", "x", "y"], [], None, ["z"], ["1", "2", "3", "4"]]
    table = pa.table({
        "y": [1, 0, 1, 0, 1],
        "s": pa.array(ids, pa.list_(pa.string())),
        "n": pa.array([[7, 8], [], None, [9], [1, 2, 3, 4]], pa.list_(pa.int64())),
        "l": pa.array(ids, pa.large_list(pa.large_string())),
        "t": ["7|x|y", "", None, "z", "1|2|3|4"],   # text, split as text is
    })
    pq.write_table(table, tmp_path / "d.parquet")
    lists = {"s": "", "n": "", "l": "", "t": "|"}
    blocks = read_rows(str(tmp_path / "d.parquet"), "parquet",
                       Schema(label="y", dense=[], sparse=list(lists), lists=lists))
    assert all(c.type == pa.list_(pa.string()) for b in blocks for c in b.sparse)
    got = slots(blocks, layout_of(list(lists), lists, dict.fromkeys(lists, 3)))
    for f, name in enumerate(lists):
        rows = [r or [] for r in (ids if name != "n" else
                                  [["7", "8"], [], None, ["9"], ["1", "2", "3", "4"]])]
        assert got[:, 3 * f:3 * f + 3].tolist() == [expected(name, r, 3) for r in rows], name


def test_parquet_null_or_empty_ids_reject_their_row(tmp_path):
    pq.write_table(pa.table({
        "y": [1, 0, 1, 0],
        "h": pa.array([["a"], ["b", None], [" "], ["c", "d"]], pa.list_(pa.string()))}),
        tmp_path / "d.parquet")
    blocks = read_rows(str(tmp_path / "d.parquet"), "parquet",
                       Schema(label="y", dense=[], sparse=["h"], lists={"h": ""}))
    rejected = [r for b in blocks for r in b.rejected]
    assert [(r.line, r.reason) for r in rejected] == [
        (2, "column 'h': empty id in a list"), (3, "column 'h': empty id in a list")]
    assert sum((b.sparse[0].to_pylist() for b in blocks), []) == [["a"], ["c", "d"]]


@pytest.mark.parametrize("column,lists,says", [
    (pa.array([[{"a": 1}]] * 2), {"h": ""}, "column 'h' of {path} is list<element: "
     "struct<a: int64>>: the items of a list column must be strings or integers"),
    (pa.array([[1.5]] * 2), {"h": ""}, "is list<element: double>: the items"),
    (pa.array([["a"]] * 2), {}, "[data] sparse column 'h' of {path} holds lists (list<element: "
     "string>): name it in [data] lists (h = \"\")"),
    (pa.array(["a|b"] * 2), {"h": ""}, "column 'h' of {path} is text, not a list: give the "
     "separator"),
    (pa.array([1.5] * 2), {"h": "|"}, "column 'h' of {path} is double, neither a list of ids "
     "nor text"),
], ids=["structs", "floats", "a list not named a list", "text with no separator", "numbers"])
def test_parquet_columns_that_do_not_fit_the_lists_are_refused(tmp_path, column, lists, says):
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"y": [1, 0], "h": column}), path)
    with pytest.raises(DataError) as got:
        read_rows(str(path), "parquet", Schema(label="y", dense=[], sparse=["h"], lists=lists))
    assert says.format(path=path) in str(got.value) and "\n" not in str(got.value)


# -- hashing ------------------------------------------------------------------------------------

def test_hash_lists_keeps_the_newest_ids_left_aligned():
    values = pa.array([["a", "b", "c", "d"], [], None, [" b "], ["c", "a"]])
    got = hash_lists("t", values, 3)
    assert got.dtype == np.int64 and got.shape == (5, 3)
    assert got.tolist() == [expected("t", ids, 3) for ids in
                            [["b", "c", "d"], [], [], ["b"], ["c", "a"]]]
    chunked = pa.chunked_array([values.slice(0, 2), values.slice(2)])
    assert hash_lists("t", chunked, 3).tolist() == got.tolist()
    assert hash_lists("t", values.slice(3), 3).tolist() == got[3:].tolist()
    large = values.cast(pa.large_list(pa.string()))
    assert hash_lists("t", large, 3).tolist() == got.tolist()
    ints = hash_lists("t", pa.array([[1, 22]], pa.list_(pa.int64())), 2)
    assert ints.tolist() == [expected("t", ["1", "22"], 2)]
    assert hash_lists("t", pa.array([], pa.list_(pa.string())), 4).shape == (0, 4)


def test_a_key_equal_to_pad_is_moved_off_it(monkeypatch):
    import roles.data.hashing as hashing

    monkeypatch.setattr(hashing, "hash_array",
                        lambda table, v, compiled=False: np.full(len(v), PAD))
    got = hashing.hash_lists("t", pa.array([["a", "b"], []]), 3)
    assert got.tolist() == [[PAD + 1, PAD + 1, PAD], [PAD] * 3]


# -- shared tables ------------------------------------------------------------------------------

def test_a_shared_table_gives_one_id_one_key_in_each_of_its_fields(tmp_path):
    job = parse_job(f"""
[data]
path = "{tmp_path / 'd.csv'}"
format = "csv"
label = "y"
sparse = ["movie_id", "history", "other"]
lists = {{ history = "|" }}
[data.tables]
movie = ["movie_id", "history"]
[model.max_len]
history = 4
""", environ={})
    (tmp_path / "d.csv").write_text("y,movie_id,history,other\n" + "".join(
        f"{i % 2},42,7|42|9,42\n" for i in range(10)))
    source = DataSource(job)
    files, parts, _ = source.index()
    source.files = files
    blocks = [b for p in parts for b in source.blocks(p)]
    keys = slots(blocks, job.layout())
    assert keys.shape == (10, 6)
    movie, history, other = keys[0, 0], keys[0, 1:5], keys[0, 5]
    assert movie == history[1] == hash_value("movie", "42")
    assert history.tolist() == expected("movie", ["7", "42", "9"], 4)
    assert other == hash_value("other", "42") != movie   # a field in no table: its own


# -- weighting: identical lists merge, different ones do not ------------------------------------

def test_merging_treats_the_same_lists_as_one_sample_and_others_as_others():
    lists = [["a", "b"], ["a", "b"], ["b", "a"], ["a"], ["x", "a", "b"], [], None]
    block = RawBlock(labels=np.ones(len(lists), np.float32), dense=np.zeros((len(lists), 0)),
                     sparse=[pa.array(["m"] * len(lists)), pa.array(lists)], timestamps=None,
                     rows_read=len(lists))
    keys = slots([block], layout_of(["m", "h"], {"h": "|"}, {"h": 2}))
    got = weigh(keys, np.zeros((len(lists), 0)), block.labels, None, base=1.0, unit_s=86400,
                drop_below=0.0, merge=True)
    # [a, b] twice and [x, a, b] (its newest two are a, b) are one; a null list is an empty one
    assert got.rows.tolist() == [0, 2, 3, 5]
    assert got.counts.tolist() == [3, 1, 1, 2] and got.merged == 3


# -- the generator's items ----------------------------------------------------------------------

VOCAB = [10, 50]


@cache
def item_generator(affinity: float = 1.5, history: int = 6) -> Generator:
    return Generator(BLOCK_ROWS + 5000, VOCAB, 2, 1.1, 0.6, 30, seed=3, items=500,
                     history=history, genres=12, affinity=affinity)


def test_item_rows_are_the_same_however_they_are_cut():
    g = item_generator()
    whole = g.rows_between(0, g.rows)
    pieces = [g.rows_between(a, b) for a, b in ((0, 17), (17, BLOCK_ROWS - 3),
                                                (BLOCK_ROWS - 3, g.rows))]
    for k in ("values", "labels", "probs", "genres", "history_lengths", "history"):
        assert np.array_equal(np.concatenate([getattr(p, k) for p in pieces]),
                              getattr(whole, k)), k
    assert whole.values.shape == (g.rows, len(VOCAB) + 1) and whole.genres.shape == (g.rows, 3)
    assert len(whole.history) == whole.history_lengths.sum()
    assert whole.history_lengths.min() == 0 and whole.history_lengths.max() == 6
    again = Generator(g.rows, VOCAB, 2, 1.1, 0.6, 30, seed=3, items=500, history=6, genres=12)
    assert np.array_equal(again.rows_between(0, 1000).history,
                          whole.history[:whole.history_lengths[:1000].sum()])


def test_an_items_genres_are_one_to_three_distinct_and_a_function_of_the_item():
    rows = item_generator().rows_between(0, 20000)
    item, genres = rows.values[:, -1], rows.genres
    count = (genres >= 0).sum(axis=1)
    assert count.min() == 1 and count.max() == 3
    assert ((genres >= 0) == (np.arange(3) < count[:, None])).all()   # left-aligned
    assert all(len(set(g[g >= 0].tolist())) == len(g[g >= 0]) for g in genres[:2000])
    assert genres.max() < 12 and item.max() < 500
    first = {}
    for i, g in zip(item.tolist(), map(tuple, genres.tolist()), strict=True):
        assert first.setdefault(i, g) == g


def test_the_interest_term_adds_what_the_oracle_knows():
    """The history's affinity with the candidate is planted: with it the oracle AUC is higher
    than the same rows scored without it; the other fields are those of items = 0."""
    g, flat = item_generator(), item_generator(affinity=0.0)
    rows, without = g.rows_between(0, 30000), flat.rows_between(0, 30000)
    assert np.array_equal(rows.history, without.history)   # the same draws, another model
    assert auc(rows.labels, rows.probs) > auc(rows.labels, without.probs) + 0.005
    plain = Generator(g.rows, VOCAB, 2, 1.1, 0.6, 30, seed=3).rows_between(0, 30000)
    assert np.array_equal(plain.values, rows.values[:, :-1])
    assert np.array_equal(plain.dense, rows.dense)
    assert 0.2 < rows.labels.mean() < 0.3


def test_the_item_fields_reach_the_blocks_as_lists_and_the_slots_as_keys():
    job = parse_job("[data]\nsource = 'synthetic'\n[data.synthetic]\nrows = 3000\n"
                    "vocab = [10, 20]\nitems = 300\nhistory = 7\ngenres = 9\n"
                    "[model.max_len]\ngenres = 3\nhistory = 5\n", environ={})
    source = DataSource(job)
    _, parts, _ = source.index()
    block = next(source.blocks(parts[0]))
    assert job.sparse_fields == ["c0", "c1", "item", "genres", "history"]
    assert [c.type for c in block.sparse][-2:] == [pa.list_(pa.string())] * 2
    history = block.sparse[4].to_pylist()
    assert {len(h) for h in history} == set(range(8))
    rows = source.generator.rows_between(parts[0].first_row, parts[0].first_row + len(block))
    assert history[:50] == [[str(i) for i in rows.history[a:b]] for a, b in zip(
        np.cumsum(rows.history_lengths)[:50] - rows.history_lengths[:50],
        np.cumsum(rows.history_lengths)[:50], strict=True)]
    keys = source.preparer(parts).keys(block)
    assert keys.shape == (len(block), 3 + 3 + 5)
    item, hist = keys[:, 2], keys[:, 6:]
    # item and history share the table "item": an item id is one key in both
    for r in range(50):
        ids = history[r][-5:]
        assert hist[r].tolist() == expected("item", ids, 5)
        assert item[r] == hash_value("item", block.sparse[2][r].as_py())


# -- zbus-prepare: a list field becomes a Parquet list ------------------------------------------

def test_prepared_parquet_holds_list_fields_as_lists_and_reads_back_as_the_text(tmp_path):
    from roles.data.stream import Tally, eval_batches
    from roles.tools.prepare import prepare, toml_section

    text = "y,m,h\n" + "".join(f"{i % 2},m{i % 7},{'|'.join(f'g{j}' for j in range(i % 5))}\n"
                               for i in range(200))
    (tmp_path / "in.csv").write_text(text.replace("\n1,m3,g0|g1|g2|g3\n", "\n1,m3,g0||g2\n", 1))
    job = parse_job(f'[data]\npath = "{tmp_path / "in.csv"}"\nlabel = "y"\nsparse = ["m", "h"]\n'
                    'lists = { h = "|" }\n[data.tables]\nt = ["m", "h"]\n', environ={})
    report = prepare(job, tmp_path / "pq", rows_per_file=1000, row_group=64, show=False)
    assert (report["rows"], report["rejected"]) == (199, 1)
    assert report["job"]["lists"] == {"h": ""}
    written = pq.read_table(tmp_path / "pq" / report["files"][0]["file"])
    assert written.schema.field("h").type == pa.list_(pa.string())
    section = toml_section("data", report["job"])
    assert 'lists = {"h" = ""}' in section and 'tables = {"t" = ["m", "h"]}' in section
    again = parse_job(section, environ={})

    def keys(job) -> np.ndarray:
        source = DataSource(job)
        files, parts, _ = source.index()
        source.files = files
        prepare_rows = Preparer(job.layout(), DenseTransform(False, np.zeros(0), np.ones(0)),
                                None)
        return np.concatenate([b.keys for p in parts for b in eval_batches(
            source.blocks(p), prepare_rows, Tally(), 64)])

    assert np.array_equal(keys(job), keys(again))
