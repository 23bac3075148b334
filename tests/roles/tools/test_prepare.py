"""zbus-prepare: text data converted into Parquet files reads back as the same rows (the same
labels, dense values and keys), with the rejected rows set aside, in bounded chunks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson

from roles.data.source import DataSource
from roles.data.stream import Preparer, Tally, eval_batches
from roles.data.transforms import DenseTransform
from roles.job.settings import parse_job
from roles.tools.prepare import prepare

JOB = """name = "p"
[data]
path = "{path}"
format = "{fmt}"
label = "y"
positive = {positive}
negative = {negative}
dense = ["n", "m"]
sparse = ["c", "d"]
eval_fraction = 0.25
"""


def rows_of(job_text: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    job = parse_job(job_text, environ={})
    source = DataSource(job)
    files, parts, _ = source.index()
    source.files = files
    prepare = Preparer(job.layout(), DenseTransform(False, np.zeros(2), np.ones(2)), None)
    tally = Tally()
    batches = [b for p in parts for b in eval_batches(source.blocks(p), prepare, tally, 1000)]
    return (np.concatenate([b.labels for b in batches]),
            np.concatenate([b.dense for b in batches]),
            np.concatenate([b.keys for b in batches]), tally.rejected)


def test_prepared_parquet_reads_back_as_the_text_rows(tmp_path: Path):
    lines = ["y,n,m,c,d"] + [f"{'yes' if i % 3 else 'no'},{i},{i % 7 or ''},c{i % 5}, d{i % 11}"
                             for i in range(1000)]
    lines[10] = "maybe,1,2,a,b"              # an unknown label: rejected, not written
    (tmp_path / "in.csv").write_text("\n".join(lines) + "\n")
    text_job = JOB.format(path=tmp_path / "in.csv", fmt="csv", positive='["yes"]',
                          negative='["no"]')
    report = prepare(parse_job(text_job, environ={}), tmp_path / "pq", rows_per_file=300,
                     row_group=100, show=False)
    assert (report["rows_read"], report["rows"], report["rejected"]) == (1000, 999, 1)
    assert [f["rows"] for f in report["files"]] == [300, 300, 300, 99]
    assert orjson.loads((tmp_path / "pq" / "prepared.json").read_bytes())["rows"] == 999
    assert "label 'maybe' is not a known value" in (tmp_path / "pq" / "rejected.tsv").read_text()
    pq_job = JOB.format(path=tmp_path / "pq", fmt="parquet", positive="[]", negative="[]")
    labels, dense, keys, rejected = rows_of(pq_job)
    t_labels, t_dense, t_keys, t_rejected = rows_of(text_job)
    assert (rejected, t_rejected) == (0, 1) and len(labels) == len(t_labels) == 999
    assert np.array_equal(labels, t_labels) and np.array_equal(keys, t_keys)
    assert np.array_equal(np.isnan(dense), np.isnan(t_dense))
    assert np.allclose(np.nan_to_num(dense), np.nan_to_num(t_dense))
