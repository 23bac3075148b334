"""Plain text data is split and cut by bytes, with no pass over it (``roles.data.index``): the
parts cover every line once, whole; the eval split starts at the first line start at or after
the last ``eval_fraction`` of the data's bytes, the same on every run; a rejected row's line
number is exact though no line was counted; the statistics read only a sample's bytes."""

from __future__ import annotations

import gzip
import tempfile

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import roles.data.index as index
from roles.data.index import index_files, plan_parts
from roles.data.readers import Schema, read_part
from roles.data.source import DataSource
from roles.job.settings import load_job, parse_job


@settings(max_examples=80, deadline=None)
@given(st.lists(st.lists(st.text(st.characters(blacklist_characters="\n\r\t"), min_size=1,
                                 max_size=60), min_size=1, max_size=120),
                min_size=1, max_size=3),
       st.floats(0.0002, 0.02), st.sampled_from([0.0, 0.1, 0.3, 0.5]), st.booleans())
def test_byte_parts_cover_every_line_once_and_split_at_the_bytes(files_lines, part_mb,
                                                                 fraction, trailing):
    with tempfile.TemporaryDirectory() as tmp:
        paths, datas = [], []
        for i, lines in enumerate(files_lines):
            path = f"{tmp}/d{i}.tsv"
            body = ("\n".join(["h"] + lines) + ("\n" if trailing else "")).encode(
                "utf-8", errors="surrogatepass")
            with open(path, "wb") as f:
                f.write(body)
            paths.append(path)
            datas.append(body)
        files = index_files(paths, "tsv")
        assert not any(f.counted for f in files) and all(f.marks == [] for f in files)
        try:
            parts, n_train = plan_parts(files, fraction, part_mb)
        except index.DataError as exc:   # only when a split would leave a side empty
            assert "too few to split" in str(exc)
            return
        assert plan_parts(index_files(paths, "tsv"), fraction, part_mb) == (parts, n_train)
        for i, (f, data) in enumerate(zip(files, datas, strict=True)):
            mine = [p for p in parts if p.file == i]
            assert b"".join(data[p.start:p.end] for p in mine) == data[f.data_start:]
            assert all(data[p.start - 1:p.start] == b"\n" for p in mine)   # each begins a line
        # the eval parts are those from the first line start at or after the byte point
        total = sum(f.size - f.data_start for f in files)
        point = round(total * (1 - fraction))
        before, where = 0, []
        for f in files:
            where.append(before - f.data_start)   # a file's offset -> the data's byte
            before += f.size - f.data_start
        for p in parts:
            starts, ends = where[p.file] + p.start, where[p.file] + p.end
            if p.eval:
                assert starts >= point
            else:
                assert starts < point
                assert ends <= point or data_line_holds(datas[p.file], p.end, point -
                                                        where[p.file])
        assert [p.eval for p in parts] == sorted(p.eval for p in parts)   # training first
        if fraction == 0:
            assert not any(p.eval for p in parts)


def data_line_holds(data: bytes, end: int, point: int) -> bool:
    """The last training part ends at the line start at or after the point: no line start lies
    in [point, end)."""
    return b"\n" not in data[max(0, point - 1):end - 1]


def test_a_small_file_is_counted_whole_and_a_large_ones_rows_estimated(tmp_path):
    small = tmp_path / "s.csv"
    small.write_text("y,n\n" + "1,2\n" * 1000)
    f = index_files([str(small)], "csv")[0]
    assert f.rows == 1000 and not f.counted and index.exact_rows(f)
    large = tmp_path / "l.csv"
    large.write_text("y,n\n" + "".join(f"1,{i % 97}\n" for i in range(600_000)))
    f = index_files([str(large)], "csv")[0]
    assert not index.exact_rows(f) and abs(f.rows - 600_000) < 0.02 * 600_000
    parts, n_train = plan_parts([f], 0.2, 0.5)
    assert abs(n_train - 480_000) < 0.02 * 480_000
    data = large.read_bytes()
    counted = sum(data[p.start:p.end].count(b"\n") for p in parts)
    assert counted == 600_000 and len(parts) > 4


def test_a_gzipped_file_among_the_data_keeps_the_row_split(tmp_path):
    lines = "".join(f"1,{i}\n" for i in range(100))
    (tmp_path / "a.csv").write_text("y,n\n" + lines)
    (tmp_path / "b.csv.gz").write_bytes(gzip.compress(("y,n\n" + lines).encode()))
    files = index_files([str(tmp_path / "a.csv"), str(tmp_path / "b.csv.gz")], "csv")
    assert all(f.counted for f in files)
    parts, n_train = plan_parts(files, 0.25, 64)
    assert n_train == 150 and sum(p.rows for p in parts if p.eval) == 50


def test_a_rejected_rows_line_number_is_exact_without_a_count(tmp_path):
    path = tmp_path / "d.csv"
    rows = [f"1,{i}" for i in range(30_000)]
    rows[25_000] = "1,not-a-number"
    path.write_text("y,n\n" + "\n".join(rows) + "\n")
    files = index_files([str(path)], "csv")
    parts, _ = plan_parts(files, 0.0, 0.05)
    assert len(parts) > 3 and parts[-1].start > 0
    schema = Schema(label="y", dense=["n"], sparse=[])
    rejected = [r for p in parts for b in read_part(files, p, "csv", schema)
                for r in b.rejected]
    assert [(r.line, r.text) for r in rejected] == [(25_002, "1,not-a-number")]


def test_the_statistics_read_only_about_their_sample(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("label,n,c\n" + "".join(f"{i % 2},{i % 101},x{i % 7}\n"
                                            for i in range(400_000)))
    job = tmp_path / "job.toml"
    job.write_text(f'name = "s"\n[data]\npath = "{path}"\nformat = "csv"\n'
                   'dense = ["n"]\nsparse = ["c"]\nstats_rows = 2000\npart_mb = 1\n'
                   f'cache_dir = "{tmp_path / "cache"}"\n'
                   "[model]\nembedding_dim = 4\nhidden = [4]\n[train]\nbatch_size = 64\n"
                   "[cluster]\nworkers = 1\nshards = 1\n")
    source = DataSource(load_job(job))
    files, parts, _ = source.index()
    source.files = files
    training = [p for p in parts if not p.eval]
    summary = source.summary(training[0], False, 2000, False)
    assert summary.rows >= 2000 and not summary.complete
    assert source.bytes_read < 2 * (1 << 20)   # a chunk or two, not the part
    assert np.isclose(summary.moments.mean[0], 50.0, atol=3.0)


def test_the_sample_is_read_in_one_chunk_of_its_size_and_summarised_as_in_small_ones(tmp_path):
    from dataclasses import replace

    from roles.data.stats import SAMPLE_CHUNK_BYTES, sample_chunk_bytes, summarize
    path = tmp_path / "d.csv"
    path.write_text("label,n,c\n" + "".join(f"{i % 2},{i % 101},x{i % 7}\n"
                                            for i in range(400_000)))
    source = DataSource(parse_job(f'[data]\npath = "{path}"\nformat = "csv"\ndense = ["n"]\n'
                                  f'sparse = ["c"]\npart_mb = 4\n'
                                  f'cache_dir = "{tmp_path / "cache"}"\n', environ={}))
    files, parts, _ = source.index()
    source.files = files
    part = next(p for p in parts if not p.eval)
    sample = 60_000                       # about 660 KB of this part's rows
    chunk = sample_chunk_bytes(part, sample)
    per_row = (part.end - part.start) / part.rows
    assert sample * per_row < chunk < 1.2 * sample * per_row   # the sample and an eighth
    whole = source.summary(part, False, sample, False)
    assert whole.rows >= sample and not whole.complete
    assert source.bytes_read <= chunk + (1 << 16)   # one chunk
    schema = replace(source.schema, sparse=[], lists={})
    small = summarize(source.blocks(part, schema, SAMPLE_CHUNK_BYTES), part.number, 1,
                      False, sample, False)
    # the same rows summarised (more are read in small chunks' last block): the same counts,
    # and moments merged over other blocks, equal to rounding
    assert small.moments.count.tolist() == whole.moments.count.tolist() == [sample]
    assert np.allclose(small.moments.mean, whole.moments.mean, rtol=1e-12, atol=0)
    assert np.allclose(small.moments.m2, whole.moments.m2, rtol=1e-12, atol=0)
    assert sample_chunk_bytes(replace(part, start=0, end=0), sample) == SAMPLE_CHUNK_BYTES
    assert sample_chunk_bytes(part, 10**9) == 8 << 20   # at most CHUNK_BYTES


def test_a_feeder_names_parts_of_an_uncounted_file_by_their_bytes(tmp_path):
    from roles.algorithms.feeding.parts import FeederParts
    from roles.protocol.datapath import PartMap

    path = tmp_path / "d.csv"
    path.write_text("y,n\n" + "1,2\n" * 600_000)   # more than the sampled blocks: estimated
    files = index_files([str(path)], "csv")
    parts, n_train = plan_parts(files, 0.25, 1)
    m = PartMap(version=0, n_train=n_train, resume={},
                body=PartMap.body_of(DataSource.describe(files)),
                parts=np.array([p.as_list() for p in parts], dtype=np.int64),
                owners=np.zeros(len(parts), dtype=np.int32))
    feeder = FeederParts(0)
    feeder.take(m)
    last = parts[-1]
    assert feeder.describe([last.number]) == (f"{last.number} (eval bytes {last.start}.."
                                              f"{last.end} of file 0)")


def test_the_plain_adult_csvs_split_by_bytes(tmp_path):
    """``adult_text``'s split (the integration tests count on it): every row once, and the
    eval rows those from the line start at or after the last 20 % of the bytes."""
    from harness import ADULT_TEXT_EVAL_ROWS, ADULT_TEXT_TRAIN_ROWS, adult_text

    path = adult_text(tmp_path)
    files = index_files([path], "csv")
    parts, _ = plan_parts(files, 0.2, 0.5)
    data = open(path, "rb").read()
    rows = {is_eval: sum(data[p.start:p.end].count(b"\n") for p in parts if p.eval == is_eval)
            for is_eval in (False, True)}
    assert (rows[False], rows[True]) == (ADULT_TEXT_TRAIN_ROWS, ADULT_TEXT_EVAL_ROWS)
