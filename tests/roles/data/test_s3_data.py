"""The job's data read from object storage (``s3://``), against a local S3 server (moto, the
``s3`` fixture): an object's index, parts and rows are those of the same bytes on a local disk
(TSV, gzipped TSV, Parquet: the same blocks, the same line numbers for rejected rows, each row
once however many feeders share the parts); prefixes and globs list as directories do; a
missing object or bucket is one line naming the URI; and whole jobs read Parquet and TSV from
S3 with two feeders and an eval_path on S3."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from resumes import every_row_once

from roles.data import index as index_mod
from roles.data.index import DataError, FileIndex, index_files, plan_parts, resolve_paths
from roles.data.readers import Schema, read_part
from roles.job.settings import parse_job
from roles.tools import predict, reference

ROWS = 30_000
SCHEMA = Schema(label="y", dense=["n"], sparse=["c", "rid"])
BAD_LINES = (17, 4_321, 29_999)   # file lines (1 is the header) of rows that are rejected


def table(rows: int = ROWS, seed: int = 0) -> pa.Table:
    """Rows with a signal (the label follows n and c), and a unique id per row (rid)."""
    rng = np.random.default_rng(seed)
    n = rng.normal(size=rows)
    c = rng.integers(0, 40, size=rows)
    effect = np.random.default_rng(99).normal(size=40)
    y = (rng.random(rows) < 1 / (1 + np.exp(-(2 * n + 1.5 * effect[c])))).astype(np.int64)
    return pa.table({"y": y, "n": np.round(n, 4), "c": [f"c{v}" for v in c],
                     "rid": [f"r{i}" for i in range(rows)]})


def tsv_bytes(t: pa.Table, bad: tuple[int, ...] = BAD_LINES) -> bytes:
    lines = ["y\tn\tc\trid"] + ["\t".join(str(v) for v in row.values())
                                for row in t.to_pylist()]
    for line in bad:
        y, _, c, rid = lines[line - 1].split("\t")
        lines[line - 1] = "\t".join([y, "not-a-number", c, rid])
    return ("\n".join(lines) + "\n").encode()


def parquet_bytes(t: pa.Table, row_group: int) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(t, sink, row_group_size=row_group)
    return sink.getvalue().to_pybytes()


@pytest.fixture(scope="module")
def files(s3, tmp_path_factory):
    """name -> (local path, URI, format) of the same bytes on disk and in the bucket."""
    where = tmp_path_factory.mktemp("s3data")
    prefix = s3.fresh_prefix("data").removeprefix(s3.uri() + "/")
    made = {"tsv": ("d.tsv", tsv_bytes(table()), "tsv"),
            "gzip": ("d.tsv.gz", gzip.compress(tsv_bytes(table())), "tsv"),
            # > 65,536 rows in row groups that do not divide it: batches across row groups
            "parquet": ("d.parquet", parquet_bytes(table(100_000, seed=1), 7_000), "parquet")}
    out = {}
    for kind, (name, data, fmt) in made.items():
        (where / name).write_bytes(data)
        out[kind] = (str(where / name), s3.put(f"{prefix}/{name}", data), fmt)
    return out


def blocks_of(files: list[FileIndex], part, fmt: str) -> list[tuple]:
    out = []
    for b in read_part(files, part, fmt, SCHEMA):
        out.append((b.labels.tolist(), np.nan_to_num(b.dense, nan=-7.0).tolist(),
                    [col.to_pylist() for col in b.sparse], b.rows_read,
                    [(r.line, r.reason, r.text) for r in b.rejected]))
    return out


def without_place(f: FileIndex) -> dict:
    return {k: v for k, v in f.__dict__.items() if k not in ("path", "mtime_ns")}


@pytest.mark.inprocess   # against the S3 server (a process of its own)
@pytest.mark.parametrize("kind", ["tsv", "gzip", "parquet"])
def test_an_object_reads_as_the_same_bytes_on_a_local_disk(s3, files, kind, monkeypatch):
    for var, value in s3.env.items():
        monkeypatch.setenv(var, value)
    local, uri, fmt = files[kind]
    assert resolve_paths(uri, fmt) == [uri]
    on_disk, in_s3 = index_files([local], fmt), index_files([uri], fmt)
    assert in_s3[0].path == uri and in_s3[0].mtime_ns > 0
    assert without_place(in_s3[0]) == without_place(on_disk[0])
    part_mb = 0.05 if kind != "parquet" else 0.02
    parts, n_train = plan_parts(on_disk, 0.2, part_mb)
    assert plan_parts(in_s3, 0.2, part_mb) == (parts, n_train)
    assert len(parts) >= (2 if kind == "gzip" else 6)
    if kind == "parquet":   # and parts of many row groups: batches across their bounds
        whole, _ = plan_parts(on_disk, 0.2, 64)
        assert whole[0].rows > 65_536 and len(whole) == 2
        parts += whole
    rejected = []
    for part in parts:
        local_blocks = blocks_of(on_disk, part, fmt)
        assert blocks_of(in_s3, part, fmt) == local_blocks, part
        rejected += [r for block in local_blocks for r in block[4]]
        for r in read_part(in_s3, part, fmt, SCHEMA):   # rejected rows name the object
            assert all(x.file == uri for x in r.rejected)
    if kind == "parquet":
        assert [len(b[0]) for b in blocks_of(in_s3, whole[0], fmt)] == [65_536, 14_464]
    else:
        assert [line for line, _, _ in rejected] == list(BAD_LINES)
        assert all("cannot parse 'not-a-number'" in why for _, why, _ in rejected)


@pytest.mark.inprocess   # against the S3 server (a process of its own)
@pytest.mark.parametrize("feeders", [2, 3])
@pytest.mark.parametrize("kind", ["tsv", "gzip", "parquet"])
def test_feeders_sharing_an_objects_parts_read_every_row_once(s3, files, kind, feeders,
                                                              monkeypatch):
    """Each feeder reads its consecutive parts (as control hands them out) from its own copy of
    the index, as a feeder adopts it: every row is read by exactly one of them."""
    for var, value in s3.env.items():
        monkeypatch.setenv(var, value)
    _, uri, fmt = files[kind]
    indexed = index_files([uri], fmt)
    parts, _ = plan_parts(indexed, 0.2, 0.05 if kind != "parquet" else 0.02)
    seen: list[str] = []
    for share in range(feeders):
        mine = [p for i, p in enumerate(parts) if i * feeders // len(parts) == share]
        adopted = [FileIndex(**f.__dict__) for f in indexed]
        for part in mine:
            for b in read_part(adopted, part, fmt, SCHEMA):
                seen += b.sparse[1].to_pylist()
    total = indexed[0].rows - (0 if kind == "parquet" else len(BAD_LINES))
    assert len(seen) == total and len(set(seen)) == total


@pytest.mark.inprocess   # against the S3 server (a process of its own)
def test_a_prefix_and_a_glob_list_as_a_directory_does(s3, monkeypatch):
    for var, value in s3.env.items():
        monkeypatch.setenv(var, value)
    prefix = s3.fresh_prefix("dir")
    key = prefix.removeprefix(s3.uri() + "/")
    for name in ("b.tsv", "a.tsv.gz", "README.md", "sub/c.tsv"):
        s3.put(f"{key}/{name}", b"y\tn\tc\trid\n1\t2\tc\tr\n")
    assert resolve_paths(prefix, "tsv") == [f"{prefix}/a.tsv.gz", f"{prefix}/b.tsv"]
    assert resolve_paths(prefix + "/", "tsv") == [f"{prefix}/a.tsv.gz", f"{prefix}/b.tsv"]
    assert resolve_paths(f"{prefix}/*.tsv", "tsv") == [f"{prefix}/b.tsv"]
    with pytest.raises(DataError, match=r"is a directory with no parquet data file in it "
                                        r"\(looked for \*\.parquet; found README\.md, "):
        resolve_paths(prefix, "parquet")


@pytest.mark.inprocess   # against the S3 server (a process of its own)
def test_a_missing_object_or_bucket_is_one_line_naming_it(s3, monkeypatch):
    for var, value in s3.env.items():
        monkeypatch.setenv(var, value)
    for uri in (s3.uri("no/such.tsv"), "s3://no-such-bucket-zbus/d.tsv"):
        with pytest.raises(DataError) as got:
            resolve_paths(uri, "tsv")
        line = str(got.value)
        assert "\n" not in line and uri in line and line.startswith("[data] path"), line


@pytest.mark.inprocess   # against the S3 server (a process of its own)
def test_an_objects_index_is_cached_locally_by_its_uri_size_and_time(s3, files, tmp_path,
                                                                     monkeypatch):
    for var, value in s3.env.items():
        monkeypatch.setenv(var, value)
    _, uri, fmt = files["gzip"]   # counted (a plain text object is not: nothing to cache)
    cache = tmp_path / "cache"
    index_files([files["tsv"][1]], fmt, cache)
    assert not cache.exists()
    first = index_files([uri], fmt, cache)
    assert len(list(cache.glob("index-*.json"))) == 1

    def refuse(*args, **kwargs):
        raise AssertionError("indexed again")

    monkeypatch.setattr(index_mod, "index_file", refuse)
    assert index_files([uri], fmt, cache) == first   # from the cache: nothing read again
    key = uri.removeprefix(s3.uri() + "/")
    s3.put(key, gzip.compress(tsv_bytes(table(), bad=())))  # it changes: indexed again
    with pytest.raises(AssertionError, match="indexed again"):
        index_files([uri], fmt, cache)
    s3.put(key, gzip.compress(tsv_bytes(table())))


def test_a_uri_in_the_job_is_kept_as_written(tmp_path):
    text = '[data]\nsource = "file"\nformat = "tsv"\nsparse = ["c"]\npath = "s3://b/x/day1.tsv"\n' \
           'eval_path = "s3://b/x/day2.tsv"\n'
    job = parse_job(text, base_dir=tmp_path, environ={})
    assert (job.data.path, job.data.eval_path) == ("s3://b/x/day1.tsv", "s3://b/x/day2.tsv")
    job = parse_job(text, base_dir=tmp_path, environ={"ZBUS_DATA__PATH": "s3://b/y/"})
    assert job.data.path == "s3://b/y/"
    local = parse_job(text.replace("s3://b/x/day1.tsv", "d.tsv"), base_dir=tmp_path,
                      environ={})
    assert local.data.path == str(tmp_path / "d.tsv")


# -- whole jobs --------------------------------------------------------------------------------

JOB = """name = "s3-{fmt}"
[data]
source = "file"
format = "{fmt}"
path = "{path}"
eval_path = "{eval_path}"
label = "y"
dense = ["n"]
sparse = ["c"]
part_mb = {part_mb}
shuffle_buffer = 2048
[model]
embedding_dim = 4
hidden = [16]
[train]
epochs = 2
batch_size = 256
sync_every = 8
[cluster]
workers = 2
shards = 1
feeders = 2
"""


def s3_job(cluster, s3, monkeypatch, tmp_path: Path, fmt: str, path: str, eval_path: str,
           part_mb: float = 0.02):
    """The job's cluster, its roles in this process: they reach the S3 server through the
    AWS variables of this process's environment, as a role's process does through its own."""
    job = tmp_path / f"job-{fmt}.toml"
    job.write_text(JOB.format(fmt=fmt, path=path, eval_path=eval_path, part_mb=part_mb))
    for var, value in s3.env.items():
        monkeypatch.setenv(var, value)
    c = cluster(job)
    c.env.update(s3.env)
    return c


@pytest.mark.inprocess
@pytest.mark.parametrize("fmt", ["parquet", "tsv"])
def test_a_job_trains_on_data_in_s3_with_two_feeders(cluster, s3, tmp_path, fmt, monkeypatch,
                                                     capsys):
    prefix = s3.fresh_prefix(f"job-{fmt}").removeprefix(s3.uri() + "/")
    train, held_out = table(12_000, seed=2), table(3_000, seed=3)
    if fmt == "parquet":   # a prefix of two objects
        s3.put(f"{prefix}/train/a.parquet", parquet_bytes(train.slice(0, 6_000), 1_000))
        s3.put(f"{prefix}/train/b.parquet", parquet_bytes(train.slice(6_000), 1_000))
        s3.put(f"{prefix}/eval.parquet", parquet_bytes(held_out, 1_000))
        path, eval_path = s3.uri(f"{prefix}/train"), s3.uri(f"{prefix}/eval.parquet")
    else:
        path = s3.put(f"{prefix}/train.tsv", tsv_bytes(train, bad=()))
        eval_path = s3.put(f"{prefix}/eval.tsv.gz", gzip.compress(tsv_bytes(held_out, bad=())))
    c = s3_job(cluster, s3, monkeypatch, tmp_path, fmt, path, eval_path)
    assert c.run_job(timeout=120) == 0, c.logs()
    s = c.summary()
    assert s["ok"] and s["rejected_rows"] == 0, s
    assert s["eval_samples"] == 3_000, s
    every_row_once(s, 12_000, 2)
    assert len(set(s["parts"]["owners"])) == 2, s["parts"]   # both feeders read parts
    assert s["auc"] > 0.75, s["auc"]
    for node in c.procs:
        assert "Traceback" not in c.log(node), c.log(node)
    if fmt == "tsv":   # zbus-predict scores the export on the eval rows, DATA in the bucket
        predict.main([str(c.run_dir / "export"), eval_path, "--json"])
        got = orjson.loads(capsys.readouterr().out)
        assert got["scored"] == 3_000 and got["auc"] > 0.75, got


@pytest.mark.inprocess
def test_a_missing_object_fails_the_job_in_one_line_naming_it(cluster, s3, tmp_path,
                                                              monkeypatch):
    missing = s3.uri("nowhere/train.parquet")
    c = s3_job(cluster, s3, monkeypatch, tmp_path, "parquet", missing,
               s3.uri("nowhere/eval.parquet"))
    c.start_role("control")
    c.start_role("feeder")
    assert c.wait(timeout=60) == 1, c.logs()
    s = c.summary()
    assert s["status"] == "failed" and f"'{missing}' does not exist" in s["reason"], s
    assert "\n" not in s["reason"]
    assert "Traceback" not in c.log("feeder-0") + c.log("control-0")


@pytest.mark.inprocess   # against the S3 server (a process of its own)
def test_reference_reads_data_in_s3_and_says_a_missing_object_in_one_line(s3, tmp_path,
                                                                          monkeypatch, capsys):
    """zbus-reference (its main, in this process: the environment is this process's)."""
    prefix = s3.fresh_prefix("tools").removeprefix(s3.uri() + "/")
    uri = s3.put(f"{prefix}/d.parquet", parquet_bytes(table(4_000, seed=4), 1_000))
    job = tmp_path / "job.toml"
    job.write_text(JOB.format(fmt="parquet", path=uri, eval_path="", part_mb=0.02)
                   .replace('eval_path = ""\n', "").replace("epochs = 2", "epochs = 1"))
    for var, value in {**s3.env, "ZBUS_CACHE_DIR": str(tmp_path / "cache")}.items():
        monkeypatch.setenv(var, value)
    reference.main(["--job", str(job), "--threads", "1"])
    assert '"auc"' in capsys.readouterr().out
    monkeypatch.setenv("ZBUS_DATA__PATH", s3.uri("no/such.parquet"))
    with pytest.raises(SystemExit) as missing:
        reference.main(["--job", str(job), "--threads", "1"])
    err = capsys.readouterr().err
    assert missing.value.code == 2 and "Traceback" not in err, err
    assert err.strip() == (f"zbus reference: [data] path "
                           f"'{s3.uri('no/such.parquet')}' does not exist")
