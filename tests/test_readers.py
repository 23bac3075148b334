from __future__ import annotations

import gzip
import math

import numpy as np
import pytest

from roles.data.readers import DataError, Schema, read_table, resolve_paths

SCHEMA = Schema(label="y", dense=["n", "m"], sparse=["c", "d"], positive=("yes",),
                negative=("no",), timestamp="ts")


def write(path, text):
    path.write_text(text)
    return str(path)


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
    t = read_table([write(tmp_path / "a.csv", text)], "csv", SCHEMA)
    assert t.labels.tolist() == [1.0, 0.0, 1.0]
    assert t.dense[0].tolist() == [1.0, 2.0]
    assert math.isnan(t.dense[1, 0]) and math.isnan(t.dense[1, 1])
    assert t.sparse.tolist() == [["a", "b"], ["", "b"], ["x, y", "b"]]
    assert t.timestamps.tolist() == [100, 101, 106]
    assert t.rows_read == 9
    assert [(r.line, r.reason) for r in t.rejected] == [
        (4, "expected 6 fields, got 4"),
        (5, "column 'n': cannot parse 'abc' as a number"),
        (6, "column 'n': non-finite value 'nan'"),
        (7, "column 'm': non-finite value 'inf'"),
        (8, "label 'maybe' is not a known value"),
        (10, "missing timestamp"),
    ]
    assert t.rejected[0].text == "no,1,2,a"


def test_tsv_and_gzip(tmp_path):
    path = tmp_path / "a.tsv.gz"
    with gzip.open(path, "wt") as f:
        f.write("c\tn\ty\n" "a\t5\t1\n" "b\t-2\t0\n" "c\t1\tx\n")
    schema = Schema(label="y", dense=["n"], sparse=["c"])
    t = read_table([str(path)], "tsv", schema)
    assert t.labels.tolist() == [1.0, 0.0]
    assert t.dense[:, 0].tolist() == [5.0, -2.0]
    assert [r.reason for r in t.rejected] == ["column 'y': cannot parse 'x' as a number"]


def test_criteo_format_has_no_header(tmp_path):
    row = ["1", *map(str, range(13)), *[f"{i:08x}" for i in range(26)]]
    empty = ["0", *([""] * 13), *([""] * 26)]
    text = "\t".join(row) + "\n" + "\t".join(empty) + "\n" + "\t".join(row[:20]) + "\n"
    schema = Schema(label="label", dense=[f"I{i}" for i in range(1, 14)],
                    sparse=[f"C{i}" for i in range(1, 27)])
    t = read_table([write(tmp_path / "day_0", text)], "criteo", schema)
    assert t.labels.tolist() == [1.0, 0.0]
    assert t.dense[0].tolist() == list(map(float, range(13)))
    assert np.isnan(t.dense[1]).all()
    assert t.sparse[0, 25] == f"{25:08x}" and t.sparse[1, 0] == ""
    assert [(r.line, r.reason) for r in t.rejected] == [(3, "expected 40 fields, got 20")]


def test_several_files_by_glob(tmp_path):
    for name in ("p1.csv", "p2.csv"):
        write(tmp_path / name, "y,n,m,c,d,ts\nyes,1,2,a,b,1\n")
    paths = resolve_paths(str(tmp_path / "p*.csv"))
    assert [p.rsplit("/", 1)[1] for p in paths] == ["p1.csv", "p2.csv"]
    assert len(read_table(paths, "csv", SCHEMA).labels) == 2


def test_missing_file_and_missing_column_are_named(tmp_path):
    with pytest.raises(DataError, match="matches no file"):
        resolve_paths(str(tmp_path / "none*.csv"))
    path = write(tmp_path / "a.csv", "y,n,c,d,ts\n")
    with pytest.raises(DataError, match="dense column 'm' is not in"):
        read_table([path], "csv", SCHEMA)


def test_timestamps_are_unix_seconds_or_iso_dates_and_anything_else_is_a_rejected_row(tmp_path):
    text = ("y,n,m,c,d,ts\n"
            "yes,1,2,a,b,2026-01-02\n"                  # 2 ISO date: midnight UTC
            "no,1,2,a,b,2026-01-02T01:00:00+01:00\n"    # 3 ISO with offset
            "no,1,2,a,b,yesterday\n"                    # 4 does not parse
            "no,1,2,a,b,inf\n"                          # 5 non-finite
            "no,1,2,a,b,1767312000.9\n"                 # 6 unix seconds
            "no,1,2,a,b,1e19\n"                         # 7 beyond 2**53 seconds
            "no,1e39,2,a,b,1\n")                        # 8 beyond float32
    t = read_table([write(tmp_path / "a.csv", text)], "csv", SCHEMA)
    assert t.timestamps.tolist() == [1767312000, 1767312000, 1767312000]
    assert [(r.line, r.reason) for r in t.rejected] == [
        (4, "timestamp 'yesterday' is neither unix seconds nor an ISO 8601 date/time"),
        (5, "timestamp 'inf' is out of range"), (7, "timestamp '1e19' is out of range"),
        (8, "column 'n': '1e39' is out of float32 range")]


def test_a_schema_without_label_reads_rows_for_scoring(tmp_path):
    schema = Schema(label="", dense=["n"], sparse=["c"])
    t = read_table([write(tmp_path / "a.csv", "c,n\na,1\nb,2\n")], "csv", schema)
    assert np.isnan(t.labels).all() and t.dense[:, 0].tolist() == [1.0, 2.0]
