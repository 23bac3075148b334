"""Reading parts of files (roles.data.index, roles.data.readers): values, bad rows with their
line numbers, the three text formats, gzip, Parquet, and cutting files into parts."""

from __future__ import annotations

import gzip
import math
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from roles.data.index import DataError, index_files, plan_parts, resolve_paths
from roles.data.readers import Schema, read_part

SCHEMA = Schema(label="y", dense=["n", "m"], sparse=["c", "d"], positive=("yes",),
                negative=("no",), timestamp="ts")


def write(path, text):
    path.write_text(text)
    return str(path)


def read_all(paths: list[str], fmt: str, schema: Schema, part_mb: float = 64.0):
    """Every row of the files (training and eval parts, in file order), joined."""
    files = index_files(paths, fmt)
    parts, _ = plan_parts(files, 0.5, part_mb)
    blocks = [b for p in parts for b in read_part(files, p, fmt, schema)]
    labels = np.concatenate([b.labels for b in blocks])
    dense = np.concatenate([b.dense for b in blocks])
    sparse = [sum((b.sparse[f].cast(pa.string()).to_pylist() for b in blocks), [])
              for f in range(len(schema.sparse))]
    stamps = np.concatenate([b.timestamps for b in blocks]) if schema.timestamp else None
    rejected = [r for b in blocks for r in b.rejected]
    return labels, dense, sparse, stamps, sum(b.rows_read for b in blocks), rejected


def test_csv_reads_values_and_sets_bad_rows_aside(tmp_path):
    text = (
        "y,n,m,c,d,ts\n"          # line 1
        "yes,1,2,a,b,100\n"       # 2 ok
        "no,,?,?,b,101\n"         # 3 ok: missing values
        "no,1,2,a\n"              # 4 wrong number of fields
        "yes,abc,2,a,b,102\n"     # 5 unparsable number
        "no,nan,2,a,b,103\n"      # 6 NaN
        "no,1,inf,a,b,104\n"      # 7 infinite
        "maybe,1,2,a,b,105\n"     # 8 unknown label
        "\n"                      # 9 empty: skipped
        "no,1,2,a,b,\n"           # 10 missing timestamp
        'yes,3,4,"x, y",b,106\n'  # 11 ok: quoted field with a comma
    )
    labels, dense, sparse, stamps, rows_read, rejected = read_all(
        [write(tmp_path / "a.csv", text)], "csv", SCHEMA)
    assert labels.tolist() == [1.0, 0.0, 1.0]
    assert dense[0].tolist() == [1.0, 2.0]
    assert math.isnan(dense[1, 0]) and math.isnan(dense[1, 1])
    assert sparse == [["a", None, "x, y"], ["b", "b", "b"]]
    assert stamps.tolist() == [100, 101, 106]
    assert rows_read == 9
    assert [(r.line, r.reason) for r in rejected] == [
        (4, "expected 6 fields, got 4"),
        (5, "column 'n': cannot parse 'abc' as a number"),
        (6, "column 'n': non-finite value 'nan'"),
        (7, "column 'm': non-finite value 'inf'"),
        (8, "label 'maybe' is not a known value"),
        (10, "missing timestamp"),
    ]
    assert rejected[0].text == "no,1,2,a"


def test_tsv_and_gzip(tmp_path):
    path = tmp_path / "a.tsv.gz"
    with gzip.open(path, "wt") as f:
        f.write("c\tn\ty\n" "a\t5\t1\n" "b\t-2\t0\n" "c\t1\tx\n" "d\t3\t1\n")
    labels, dense, _, _, _, rejected = read_all([str(path)], "tsv",
                                                Schema(label="y", dense=["n"], sparse=["c"]))
    assert labels.tolist() == [1.0, 0.0, 1.0]
    assert dense[:, 0].tolist() == [5.0, -2.0, 3.0]
    assert [(r.line, r.reason) for r in rejected] == [
        (4, "label 'x' is not a number (text labels need [data] positive)")]


def test_a_damaged_gzip_file_is_a_clear_error(tmp_path):
    path = tmp_path / "a.tsv.gz"
    path.write_bytes(gzip.compress(b"c\tn\ty\n" + b"a\t5\t1\n" * 5000)[:-40])
    with pytest.raises(DataError, match="a.tsv.gz is damaged"):
        index_files([str(path)], "tsv")


def test_criteo_format_has_no_header(tmp_path):
    row = ["1", *map(str, range(13)), *[f"{i:08x}" for i in range(26)]]
    empty = ["0", *([""] * 13), *([""] * 26)]
    text = "\t".join(row) + "\n" + "\t".join(empty) + "\n" + "\t".join(row[:20]) + "\n"
    schema = Schema(label="label", dense=[f"I{i}" for i in range(1, 14)],
                    sparse=[f"C{i}" for i in range(1, 27)])
    labels, dense, sparse, _, _, rejected = read_all([write(tmp_path / "day_0", text)],
                                                     "criteo", schema)
    assert labels.tolist() == [1.0, 0.0]
    assert dense[0].tolist() == list(map(float, range(13)))
    assert np.isnan(dense[1]).all()
    assert sparse[25][0] == f"{25:08x}" and sparse[0][1] is None
    assert [(r.line, r.reason) for r in rejected] == [(3, "expected 40 fields, got 20")]


def test_parquet_columns_by_name_and_bad_rows_by_row_number(tmp_path):
    table = pa.table({"y": [1, 0, 1, None], "n": [1.5, None, float("inf"), 2.0],
                      "c": ["a", None, "b", "c"], "other": [1, 2, 3, 4]})
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=2)
    schema = Schema(label="y", dense=["n"], sparse=["c"])
    labels, dense, sparse, _, rows_read, rejected = read_all(
        [str(tmp_path / "a.parquet")], "parquet", schema)
    assert labels.tolist() == [1.0, 0.0] and sparse == [["a", None]]
    assert dense[0, 0] == 1.5 and math.isnan(dense[1, 0]) and rows_read == 4
    assert [(r.line, r.reason) for r in rejected] == [
        (3, "column 'n': non-finite value 'inf'"), (4, "missing label")]


def test_several_files_by_glob_or_directory(tmp_path):
    for name in ("p1.csv", "p2.csv"):
        write(tmp_path / name, "y,n,m,c,d,ts\nyes,1,2,a,b,1\n")
    paths = resolve_paths(str(tmp_path / "p*.csv"), "csv")
    assert [p.rsplit("/", 1)[1] for p in paths] == ["p1.csv", "p2.csv"]
    assert resolve_paths(str(tmp_path), "csv") == paths
    assert len(read_all(paths, "csv", SCHEMA)[0]) == 2


def test_missing_file_directory_and_column_are_named(tmp_path):
    with pytest.raises(DataError, match="matches no file"):
        resolve_paths(str(tmp_path / "none*.csv"), "csv")
    with pytest.raises(DataError, match="none.csv' does not exist"):
        resolve_paths(str(tmp_path / "none.csv"), "csv")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"is a directory with no csv data file in it \(looked "
                                        r"for \*.csv, \*.csv.gz; found nothing\)"):
        resolve_paths(str(tmp_path / "empty"), "csv")
    path = write(tmp_path / "a.csv", "y,n,c,d,ts\nyes,1,a,b,1\nno,2,a,b,1\n")
    with pytest.raises(DataError, match="dense column 'm' is not in"):
        read_all([path], "csv", SCHEMA)


def test_timestamps_are_unix_seconds_or_iso_dates_and_anything_else_is_a_rejected_row(tmp_path):
    text = ("y,n,m,c,d,ts\n"
            "yes,1,2,a,b,2026-01-02\n"                  # 2 ISO date: midnight UTC
            "no,1,2,a,b,2026-01-02T01:00:00+01:00\n"    # 3 ISO with offset
            "no,1,2,a,b,yesterday\n"                    # 4 does not parse
            "no,1,2,a,b,inf\n"                          # 5 non-finite
            "no,1,2,a,b,1767312000.9\n"                 # 6 unix seconds
            "no,1,2,a,b,1e19\n"                         # 7 beyond 2**53 seconds
            "no,1e39,2,a,b,1\n")                        # 8 beyond float32
    *_, stamps, _, rejected = read_all([write(tmp_path / "a.csv", text)], "csv", SCHEMA)
    assert stamps.tolist() == [1767312000, 1767312000, 1767312000]
    assert [(r.line, r.reason) for r in rejected] == [
        (4, "timestamp 'yesterday' is neither unix seconds nor an ISO 8601 date/time"),
        (5, "timestamp 'inf' is out of range"), (7, "timestamp '1e19' is out of range"),
        (8, "column 'n': '1e39' is out of float32 range")]


def test_a_schema_without_label_reads_rows_for_scoring(tmp_path):
    schema = Schema(label="", dense=["n"], sparse=["c"])
    labels, dense, *_ = read_all([write(tmp_path / "a.csv", "c,n\na,1\nb,2\n")], "csv", schema)
    assert np.isnan(labels).all() and dense[:, 0].tolist() == [1.0, 2.0]


def test_the_eval_split_is_the_last_fraction_of_rows_or_its_own_files(tmp_path):
    lines = "".join(f"yes,{i},2,a,b,1\n" for i in range(10))
    write(tmp_path / "a.csv", "y,n,m,c,d,ts\n" + lines)
    write(tmp_path / "b.csv", "y,n,m,c,d,ts\n" + lines)
    files = index_files([str(tmp_path / "a.csv"), str(tmp_path / "b.csv")], "csv")
    parts, n_train = plan_parts(files, 0.25, 64)
    assert n_train == 15
    assert [(p.file, p.first_row, p.rows, p.eval) for p in parts] == [
        (0, 0, 10, False), (1, 0, 5, False), (1, 5, 5, True)]
    own = index_files([str(tmp_path / "b.csv")], "csv")
    parts, n_train = plan_parts(files[:1], 0.25, 64, eval_files=own)
    assert n_train == 10 and [(p.file, p.rows, p.eval) for p in parts] == [
        (0, 10, False), (1, 10, True)]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(st.characters(blacklist_characters="\n\r"), max_size=40),
                min_size=2, max_size=200), st.floats(0.0002, 0.02), st.booleans())
def test_byte_ranges_never_drop_or_split_a_line(lines, part_mb, trailing_newline):
    """Parts of a counted file, cut at marks (and at the eval split) cover every line once,
    whole (a file is counted when gzipped files are among the data: the split is by rows)."""
    import tempfile

    import roles.data.index as index

    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/d.tsv"
        body = "\n".join(["h"] + [line.replace("\t", " ") or "x" for line in lines])
        with open(path, "wb") as f:
            f.write((body + ("\n" if trailing_newline else "")).encode(
                "utf-8", errors="surrogatepass"))
        marks = index.MARK_BYTES, index.MIN_MARK_BYTES
        index.MARK_BYTES = index.MIN_MARK_BYTES = 64   # many marks on a small file
        try:
            files = [index.index_file(path, "tsv")]   # counted
        finally:
            index.MARK_BYTES, index.MIN_MARK_BYTES = marks
        parts, _ = plan_parts(files, 0.3, part_mb)
        data = open(path, "rb").read()
        pieces = [data[p.start:p.end] for p in parts]
        assert b"".join(pieces) == data[files[0].data_start:]      # nothing dropped or twice
        assert all(p.start == files[0].data_start or data[p.start - 1:p.start] == b"\n"
                   for p in parts)                                # each begins a line
        assert [len(x.splitlines()) for x in pieces] == [p.rows for p in parts]
        assert sum(p.rows for p in parts) == len(lines)
        assert [p.first_row for p in parts] == [sum(q.rows for q in parts[:i])
                                                for i in range(len(parts))]


def test_a_plain_file_is_cut_into_parts_of_about_part_mb(tmp_path):
    path = write(tmp_path / "big.csv", "y,n,m,c,d,ts\n" + "yes,1,2,a,b,1\n" * 200_000)
    files = index_files([path], "csv")
    parts, n_train = plan_parts(files, 0.2, 0.25)
    size = files[0].size
    training = [p for p in parts if not p.eval]
    assert n_train == 160_000 and len(training) >= int(0.8 * size / (0.25 * 2**20))
    assert all(p.end - p.start < 0.5 * 2**20 for p in parts)
    assert sum(p.rows for p in parts) == 200_000


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_several_labels_mask_a_missing_value_and_reject_a_row_with_none(tmp_path, fmt):
    """[data] labels: one column per task; a missing value is NaN (that task masked for the
    row), a row with no label at all is set aside with its line, a bad value too."""
    text = ("click,buy,c,n\n"    # line 1
            "1,1,a,1\n"          # 2 ok
            "0,,a,2\n"           # 3 ok: buy unknown
            ",0,b,3\n"           # 4 ok: click unknown
            ",,b,4\n"            # 5 no label
            "1,x,b,5\n")         # 6 bad value
    schema = Schema(label="click", more_labels=("buy",), dense=["n"], sparse=["c"])
    path = write(tmp_path / "a.csv", text)
    if fmt == "parquet":
        table = pa.table({"click": pa.array([1, 0, None, None], pa.float64()),
                          "buy": pa.array([1, None, 0, None], pa.float64()),
                          "c": ["a", "a", "b", "b"], "n": [1.0, 2.0, 3.0, 4.0]})
        path = str(tmp_path / "a.parquet")
        pq.write_table(table, path)
    labels, dense, _, _, rows_read, rejected = read_all([path], fmt, schema)
    assert labels.shape == (3, 2)
    np.testing.assert_array_equal(labels, [[1, 1], [0, np.nan], [np.nan, 0]])
    assert dense[:, 0].tolist() == [1.0, 2.0, 3.0]
    lines = [(r.line, r.reason) for r in rejected]
    assert lines[0] == (5 if fmt == "csv" else 4, "missing labels (none of click, buy)")
    if fmt == "csv":
        assert rows_read == 5 and lines[1][0] == 6 and "'x'" in lines[1][1]


def test_a_weight_column_is_read_and_a_missing_or_negative_weight_set_aside(tmp_path):
    text = ("y,w,c\n"     # line 1
            "1,2,a\n"     # 2 ok
            "0,0.5,a\n"   # 3 ok
            "0,,b\n"      # 4 missing weight
            "1,-1,b\n"    # 5 negative
            "1,x,b\n"     # 6 not a number
            "0,0,b\n")    # 7 ok: weight 0
    schema = Schema(label="y", dense=[], sparse=["c"], weight="w")
    files = index_files([write(tmp_path / "a.csv", text)], "csv")
    parts, _ = plan_parts(files, 0.5, 64.0)
    blocks = [b for p in parts for b in read_part(files, p, "csv", schema)]
    weights = np.concatenate([b.weights for b in blocks])
    assert weights.tolist() == [2.0, 0.5, 0.0]
    rejected = [(r.line, r.reason) for b in blocks for r in b.rejected]
    assert [line for line, _ in rejected] == [4, 5, 6]
    assert rejected[0][1] == "missing weight (column 'w')"
    assert "negative" in rejected[1][1] and "'x'" in rejected[2][1]


def test_a_missing_text_label_masks_its_task_or_rejects_a_single_labels_row(tmp_path):
    """Text labels ([data] positive): an empty or '?' value is missing, never a negative:
    masked with several labels, a rejected row ("missing label") with one."""
    text = "click\tbuy\tc\nno\t\ta\n?\tyes\ta\nyes\tno\tb\n\tyes\tb\n"
    path = write(tmp_path / "a.tsv", text)
    several = Schema(label="click", more_labels=("buy",), dense=[], sparse=["c"],
                     positive=("yes",))
    labels, _, _, _, _, rejected = read_all([path], "tsv", several)
    np.testing.assert_array_equal(labels, [[0, np.nan], [np.nan, 1], [1, 0], [np.nan, 1]])
    assert rejected == []
    one = Schema(label="click", dense=[], sparse=["c"], positive=("yes",))
    labels, _, _, _, _, rejected = read_all([path], "tsv", one)
    assert labels.tolist() == [0.0, 1.0]
    assert [(r.line, r.reason) for r in rejected] == [(3, "missing label"),
                                                      (5, "missing label")]


NUMERIC_TEXT = st.text(alphabet="0123456789+-.eEinfatyINFATY _x?\t", max_size=9)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(st.none(), NUMERIC_TEXT, st.floats().map(repr),
                          st.integers().map(str)), min_size=1, max_size=6))
def test_a_text_column_read_whole_gives_what_each_value_matched_and_trimmed_gives(values):
    """The fast path of a text column of numbers (a stream's JSON events carry them as text):
    taken only where every value is a number as written, and then the values and the reasons
    are those of the path that trims each value and matches it against ``NUMBER``."""
    from roles.data import readers
    col = pa.array(values, pa.string())
    fast = readers._read_whole(col)
    if fast is None:
        return
    assert all(v is None or re.fullmatch(readers.NUMBER, v.strip()) for v in values)
    whole, each = readers._Reasons(len(values)), readers._Reasons(len(values))
    got = readers._numbers("x", col, whole)
    real = readers._read_whole
    try:   # the other path, as a column the fast path declines takes it
        readers._read_whole = lambda c: None
        want = readers._numbers("x", col, each)
    finally:
        readers._read_whole = real
    assert np.array_equal(got, want, equal_nan=True)
    assert list(whole.flags) == list(each.flags) and whole.why == each.why


def test_a_nan_written_out_is_rejected_and_a_null_is_missing_on_the_fast_path():
    from roles.data import readers
    reasons = readers._Reasons(4)
    col = pa.array(["1.5", "nan", None, "-inf"], pa.string())
    assert readers._read_whole(col) is not None
    values = readers._numbers("x", col, reasons)
    assert values[0] == 1.5 and np.isnan(values[2])
    assert list(reasons.flags) == [False, True, False, True]
    assert "non-finite value 'nan'" in reasons.why[1] and "'-inf'" in reasons.why[3]
