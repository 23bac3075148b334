"""Data a new user gets wrong: each case is one clear line that names the file (or the
directory) and says what is wrong with it, or a rejected row that says why, never a
traceback; a directory's data files are chosen by the format, so a README beside them is not
read as data; ``zbus-predict`` says what its EXPORT should have been; ``zbus-prepare`` says
what to pass when the job has no text data, and prints the whole ``[data]`` section that reads
what it wrote."""

from __future__ import annotations

import gzip
import io
import zipfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from roles.data.index import DataError, index_files, plan_parts, resolve_paths
from roles.data.source import DataSource
from roles.job.settings import load_job, parse_job
from roles.tools import predict, prepare

ROWS = "y,n,c\n" + "".join(f"{i % 2},{i},a{i % 3}\n" for i in range(40))


def job_text(path: Path | str, fmt: str = "csv", more: str = "") -> str:
    return (f'name = "bad"\n[data]\nsource = "file"\npath = "{path}"\nformat = "{fmt}"\n'
            f'label = "y"\ndense = ["n"]\nsparse = ["c"]\n{more}')


def read_everything(text: str, cache: Path) -> tuple[int, list]:
    """Index the job's data and read every part, as the feeders do: the rows accepted and
    the rejected rows."""
    source = DataSource(parse_job(text, environ={}))
    source.cache_dir = cache
    files, parts, _ = source.index()
    source.files = files
    blocks = [b for p in parts for b in source.blocks(p)]
    return sum(len(b) for b in blocks), [r for b in blocks for r in b.rejected]


def zipped(text: str) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        z.writestr("data.csv", text)
    return out.getvalue()


def parquet_bytes(c: pa.Array | list | None = None) -> bytes:
    out = io.BytesIO()
    pq.write_table(pa.table({"y": [0, 1] * 10, "n": [1.0, 2.0] * 10,
                             "c": ["a", "b"] * 10 if c is None else c}), out)
    return out.getvalue()


# name: (files to write, [data] path (under the test's directory), format, more [data] keys,
#        what the one line says besides the path)
CASES = {
    "a directory holding only a README": (
        {"d/README.md": b"# my data\n\nthe columns are y, n, c\n"}, "d", "csv", "",
        ["is a directory with no csv data file in it (looked for *.csv, *.csv.gz; found "
         "README.md)"]),
    "a directory of CSV files read as Parquet": (
        {"d/a.csv": ROWS.encode()}, "d", "parquet", "",
        ["is a directory with no parquet data file in it (looked for *.parquet; found a.csv)"]),
    "a header and no row": (
        {"head.csv": b"y,n,c\n"}, "head.csv", "csv", "",
        ["head.csv holds 0 rows after its header: too few to split into training and eval"]),
    "one row": (
        {"one.csv": b"y,n,c\n1,2,a\n"}, "one.csv", "csv", "",
        ["one.csv holds 1 row after its header: too few"]),
    "tabs in a csv file": (
        {"tabs.csv": ROWS.replace(",", "\t").encode()}, "tabs.csv", "csv", "",
        ["label column 'y' is not in", r"(columns: y\tn\tc)",
         'its header reads as one column, separated by tabs (format "tsv")']),
    "semicolons in a csv file": (
        {"semi.csv": ROWS.replace(",", ";").encode()}, "semi.csv", "csv", "",
        ["separated by ';', which zbus does not read (convert it to commas or tabs)"]),
    "a long header of semicolons": (   # the separator said, the header cut short
        {"wide.csv": (";".join(f"column_{i}" for i in range(30)) + "\n1;2\n" * 20).encode()},
        "wide.csv", "csv", "",
        ["(columns: column_0;column_1;column_2;column_3;column_4;column_5;colum…); its header "
         "reads as one column, separated by ';'"]),
    "a .gz file that is not gzip": (
        {"plain.csv.gz": ROWS.encode()}, "plain.csv.gz", "csv", "",
        ["plain.csv.gz is not gzip-compressed, though its name ends in .gz"]),
    "a gzipped file not named .gz": (
        {"packed.csv": gzip.compress(ROWS.encode())}, "packed.csv", "csv", "",
        ["packed.csv is gzip-compressed: name it packed.csv.gz"]),
    "a header-only gzipped file": (
        {"head.csv.gz": gzip.compress(b"y,n,c\n")}, "head.csv.gz", "csv", "",
        ["head.csv.gz holds 0 rows after its header"]),
    "a zip archive": (
        {"data.zip": zipped(ROWS)}, "data.zip", "csv", "",
        ["data.zip is a zip archive: unpack it"]),
    "a Parquet file read as csv": (
        {"t.parquet": parquet_bytes()}, "t.parquet", "csv", "",
        ['t.parquet is a Parquet file, not csv text: read it with format "parquet"']),
    "a csv file read as Parquet": (
        {"t.csv": ROWS.encode()}, "t.csv", "parquet", "",
        ["t.csv is text ('y,n,c'...), not Parquet: name its format"]),
    "UTF-16 text": (
        {"u16.csv": ROWS.encode("utf-16")}, "u16.csv", "csv", "",
        ["u16.csv is not UTF-8 text (UTF-16 or 32"]),
    "a Latin-1 header": (
        {"l1.csv": ROWS.replace("c\n", "c\xe9\n", 1).encode("latin-1")}, "l1.csv", "csv", "",
        ["its header is not UTF-8 text: convert the file to UTF-8"]),
    "a Parquet list of structs as a list field": (
        {"s.parquet": parquet_bytes(pa.array([[{"a": 1}]] * 20))}, "s.parquet", "parquet",
        'lists = {{ c = "" }}',
        ["[data] lists: column 'c' of", "is list<element: struct<a: int64>>: the items of a "
         "list column must be strings or integers"]),
    "a Parquet list column not named a list": (
        {"l.parquet": parquet_bytes([["a", "b"]] * 20)}, "l.parquet", "parquet", "",
        ["[data] sparse column 'c' of", "holds lists (list<element: string>): name it in "
         '[data] lists (c = "")']),
    "a text list field with no separator": (
        {"t.csv": ROWS.encode()}, "t.csv", "csv", 'lists = {{ c = "" }}',
        ["[data] lists: column 'c' of", "t.csv is text: give the separator its ids are "
         'joined with (c = "|")']),
    "an eval_path that does not exist": (
        {"t.csv": ROWS.encode()}, "t.csv", "csv", 'eval_path = "{dir}/eval.csv"',
        ["[data] eval_path", "eval.csv' does not exist"]),
}


@pytest.mark.parametrize("case", CASES)
def test_bad_data_is_one_line_naming_the_file_and_what_is_wrong(tmp_path, case):
    files, path, fmt, more, says = CASES[case]
    for name, data in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    text = job_text(tmp_path / path, fmt, more.format(dir=tmp_path))
    with pytest.raises(DataError) as got:
        read_everything(text, tmp_path / "cache")
    line = str(got.value)
    assert "\n" not in line and str(tmp_path) in line, line
    for words in says:
        assert words in line, line


def test_a_readme_beside_the_data_is_not_read_as_data(tmp_path):
    (tmp_path / "README.md").write_text("# my data\nthe columns are y, n, c\n")
    (tmp_path / "a.csv").write_text(ROWS)
    (tmp_path / "b.csv.gz").write_bytes(gzip.compress(ROWS.encode()))
    assert [Path(p).name for p in resolve_paths(str(tmp_path), "csv")] == ["a.csv", "b.csv.gz"]
    rows, rejected = read_everything(job_text(tmp_path), tmp_path / "cache")
    assert (rows, rejected) == (80, [])


def test_criteo_directories_take_the_criteo_release_names(tmp_path):
    for name in ("day_0", "day_1.gz", "train.txt", "README", "notes.md"):
        (tmp_path / name).write_text("x\n")
    assert sorted(Path(p).name for p in resolve_paths(str(tmp_path), "criteo")) == [
        "day_0", "day_1.gz", "train.txt"]


def test_a_path_with_a_tilde_is_under_the_home_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "t.csv").write_text(ROWS)
    assert resolve_paths("~/t.csv", "csv") == [str(tmp_path / "t.csv")]
    assert resolve_paths("~/*.csv", "csv") == [str(tmp_path / "t.csv")]


def test_lines_that_are_not_utf8_are_rejected_rows_and_the_rest_is_read(tmp_path):
    lines = ROWS.encode().splitlines(keepends=True)
    lines[3] = "1,3,caf\xe9\n".encode("latin-1")      # line 4
    lines[7] = "0,7,na\xefve\n".encode("latin-1")     # line 8
    (tmp_path / "l1.csv").write_bytes(b"".join(lines))
    rows, rejected = read_everything(job_text(tmp_path / "l1.csv"), tmp_path / "cache")
    assert rows == 38
    assert [(r.line, r.reason) for r in rejected] == [
        (4, "not UTF-8 text (convert the file to UTF-8)"),
        (8, "not UTF-8 text (convert the file to UTF-8)")]
    assert rejected[0].text == "1,3,caf\ufffd"


def test_an_empty_id_in_a_list_rejects_its_row_and_says_which_column(tmp_path):
    text = ROWS.replace("\n1,1,a1\n", "\n1,1,a1||b\n").replace("\n0,4,a1\n", "\n0,4,a|\n")
    (tmp_path / "l.csv").write_text(text.replace(",a", ",a|x"))
    rows, rejected = read_everything(job_text(tmp_path / "l.csv", more='lists = { c = "|" }'),
                                     tmp_path / "cache")
    assert rows == 38
    assert [(r.line, r.reason, r.text) for r in rejected] == [
        (3, "column 'c': empty id in a list", "1,1,a|x1||b"),
        (6, "column 'c': empty id in a list", "0,4,a|x|")]


def test_a_text_label_without_positive_says_what_to_set(tmp_path):
    (tmp_path / "t.csv").write_text(ROWS.replace("\n1,", "\nyes,").replace("\n0,", "\nno,"))
    rows, rejected = read_everything(job_text(tmp_path / "t.csv"), tmp_path / "cache")
    assert rows == 0 and len(rejected) == 40
    assert rejected[0].reason == "label 'no' is not a number (text labels need [data] positive)"


def test_every_row_of_a_file_of_one_row_can_be_scored(tmp_path):
    """zbus-predict scores every row with no split: eval_fraction 0 plans no eval part."""
    (tmp_path / "one.csv").write_text("y,n,c\n1,2,a\n")
    files = index_files([str(tmp_path / "one.csv")], "csv")
    parts, n_train = plan_parts(files, 0.0, 64)
    assert n_train == 1 and [(p.rows, p.eval) for p in parts] == [(1, False)]


@pytest.mark.parametrize("make,says", [
    (lambda d: d / "nope", "nope does not exist: EXPORT is an export (runs/<run>/export) or "
                           "a run with a checkpoint"),
    (lambda d: d, "is neither an export (it has no manifest.json: another directory, or an "
                  "export not finished) nor a run or checkpoint directory"),
    (lambda d: (d / "runs" / "r" / "checkpoints").mkdir(parents=True) or d / "runs" / "r",
     "r holds no complete checkpoint (no checkpoints/LATEST)"),
    (lambda d: (d / "f.csv").write_text(ROWS) and d / "f.csv", "f.csv is a file: EXPORT is"),
], ids=["missing", "another directory", "a run with no checkpoint", "a file"])
def test_predict_says_what_its_export_argument_should_be(tmp_path, capsys, make, says):
    where = make(tmp_path)
    with pytest.raises(SystemExit) as done:
        predict.main([str(where), str(tmp_path / "data.csv"), "--quiet"])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("zbus predict: ") and says in err, err


def test_prepare_without_a_job_says_to_pass_one(tmp_path, capsys, monkeypatch):
    for var in ("ZBUS_JOB", "ZBUS_DATA__SOURCE", "ZBUS_DATA__PATH", "ZBUS_DATA__FORMAT"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(SystemExit) as done:
        prepare.main(["--out", str(tmp_path / "out"), "--quiet"])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert err == ("zbus prepare: the job (built-in default job) has synthetic data, no file "
                   "to convert: pass --job naming the text data (or set ZBUS_DATA__SOURCE=file,"
                   " ZBUS_DATA__FORMAT and ZBUS_DATA__PATH)\n")
    assert not (tmp_path / "out").exists()


def test_prepare_prints_the_whole_data_section_that_reads_its_output(tmp_path, capsys,
                                                                      monkeypatch):
    """The section printed, pasted into a job file as it is, reads the Parquet files: the
    label as 0/1 (no positive), the columns by name (a Criteo job's I1..I13 and C1..C26
    written out), and the job's other [data] keys that are not their defaults."""
    for var in ("ZBUS_JOB", "ZBUS_DATA__SOURCE", "ZBUS_DATA__PATH", "ZBUS_DATA__FORMAT"):
        monkeypatch.delenv(var, raising=False)
    rows = "".join(f"{i % 2}\t" + "\t".join(str(i + j) for j in range(13)) + "\t"
                   + "\t".join(f"v{(i + j) % 5}" for j in range(26)) + "\n" for i in range(50))
    (tmp_path / "day_0").write_text(rows)
    (tmp_path / "job.toml").write_text(
        f'name = "c"\n[data]\npath = "{tmp_path / "day_0"}"\nformat = "criteo"\n'
        "log1p = false\nmax_rejected_fraction = 0.5\n")
    prepare.main(["--job", str(tmp_path / "job.toml"), "--out", str(tmp_path / "pq"),
                  "--quiet"])
    out = capsys.readouterr().out
    head, _, section = out.partition("\n")
    assert head.endswith("a job reads them with this [data] section (also in prepared.json):")
    assert section.splitlines()[:6] == [
        "[data]", 'source = "file"', 'format = "parquet"', f'path = "{tmp_path / "pq"}"',
        'label = "label"', "positive = []"]
    assert 'dense = ["I1", "I2", ' in section and '"C26"]' in section
    assert "log1p = false" in section and "max_rejected_fraction = 0.5" in section
    (tmp_path / "pq.toml").write_text('name = "p"\n' + section)
    job = load_job(str(tmp_path / "pq.toml"), environ={})
    rows_read, rejected = read_everything(
        (tmp_path / "pq.toml").read_text(), tmp_path / "cache")
    assert (rows_read, rejected) == (50, []) and job.data.log1p is False
    assert len(job.dense_fields) == 13 and len(job.sparse_fields) == 26
