"""``zbus-prepare --out DIR``: convert the job's text data (CSV, TSV, Criteo; ``.gz`` too) into
Parquet files of a chosen size, so that large data is parsed once: a job then reads the columns
it needs, row group by row group, with no text to parse (``[data] format = "parquet"``).

Rows are read as the job reads them (``roles.data.readers``, chunk by chunk: the memory does
not grow with the data); rejected rows go to ``DIR/rejected.tsv`` and are not written. Each
output file holds about ``--rows-per-file`` rows in row groups of ``--row-group`` rows, in the
input's order, so the last ``eval_fraction`` of the rows stay the eval split. Columns: the
label as 0/1 (or none without a label), each dense column as float64 (null where missing), each
categorical column as text (null where missing), a list field (``[data] lists``) as a Parquet
``list<string>`` column (read back with no separator), the timestamp as int64 unix seconds
(several labels, ``[data] labels``: each its own column, null where missing; a weight column
as float64).
``DIR/prepared.json`` says what was written (files, rows, rejected rows, each dense column's
count, mean and standard deviation) and the ``[data]`` section that reads it, which is printed
at the end too, whole, to paste into a job file. A progress bar shows the rows converted, their
rate and the time left. A job without text data (the built-in one's is synthetic) is refused
in one line that says what to pass.

    zbus-prepare --job jobs/adult.toml --out data/adult-parquet [--rows-per-file 2000000]

A Criteo-layout file (``scripts/make_criteo.py`` writes one) needs a job whose ``[data]``
names it (only that section is read); with the built-in job, set it from the environment:
``ZBUS_DATA__SOURCE=file ZBUS_DATA__FORMAT=criteo ZBUS_DATA__PATH=/data/day_0.gz zbus-prepare
--out /data/day_0-parquet``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from roles.data.index import DataError, index_files, plan_parts, resolve_paths
from roles.data.readers import LIST_TEXT, RawBlock, Schema, read_part
from roles.data.rejected import RejectedRows
from roles.data.stats import Moments
from roles.job.cli import integer, load_job_or_exit
from roles.job.settings import DataConfig, Job, toml_value
from zbus.files import atomic_write


def table_of(schema: Schema, block: RawBlock) -> pa.Table:
    columns: dict[str, pa.Array] = {}
    labels = block.labels.reshape(len(block), -1)   # a column a label (NaN: missing)
    for t, name in enumerate(schema.label_columns):
        values = labels[:, t].astype(np.float32)
        columns[name] = pa.array(values, mask=np.isnan(values))
    for j, name in enumerate(schema.dense):
        values = block.dense[:, j]
        columns[name] = pa.array(values, mask=np.isnan(values))
    for name, values in zip(schema.sparse, block.sparse, strict=True):
        columns[name] = values.cast(LIST_TEXT if name in schema.lists else pa.string())
    if schema.timestamp and block.timestamps is not None:
        columns[schema.timestamp] = pa.array(block.timestamps)
    if schema.weight and block.weights is not None:
        columns[schema.weight] = pa.array(block.weights)
    return pa.table(columns)


class ParquetFiles:
    """Output files of about ``rows_per_file`` rows each, written one after another."""

    def __init__(self, out: Path, rows_per_file: int, row_group: int):
        self.out, self.rows_per_file, self.row_group = out, rows_per_file, row_group
        self.writer: pq.ParquetWriter | None = None
        self.in_file = 0
        self.files: list[dict] = []

    def write(self, table: pa.Table) -> None:
        while table.num_rows:
            if self.writer is None:
                name = f"part-{len(self.files):05d}.parquet"
                self.writer = pq.ParquetWriter(self.out / name, table.schema)
                self.files.append({"file": name, "rows": 0})
            take = min(table.num_rows, self.rows_per_file - self.in_file)
            self.writer.write_table(table.slice(0, take), row_group_size=self.row_group)
            self.in_file += take
            self.files[-1]["rows"] += take
            table = table.slice(take)
            if self.in_file >= self.rows_per_file:
                self.close()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer, self.in_file = None, 0


def data_section(job: Job, out: Path) -> dict:
    """The ``[data]`` keys of a job that reads the Parquet files in ``out``: the columns as
    written (labels as 0/1, every column by name), and the job's other ``[data]`` keys that
    are not their defaults (``eval_path``, text files, is left out)."""
    d = job.data
    section: dict = {"source": "file", "format": "parquet", "path": str(out.absolute()),
                     **({"labels": d.labels} if d.labels else {"label": d.label}),
                     "positive": [], "negative": [], "dense": job.dense_fields,
                     "sparse": job.sparse_fields}
    if d.lists:   # written as Parquet lists: no separator
        section["lists"] = dict.fromkeys(d.lists, "")
    if d.timestamp:
        section["timestamp"] = d.timestamp
    for f in dataclasses.fields(DataConfig):
        default = f.default if f.default_factory is dataclasses.MISSING \
            else f.default_factory()
        value = getattr(d, f.name)
        if f.name not in section and f.name not in ("eval_path", "synthetic") \
                and value != default:
            section[f.name] = value
    return section


def toml_section(name: str, keys: dict) -> str:
    """``[name]`` and its keys, one a line (strings, numbers, booleans, lists of them, and
    tables of those, inline: ``lists``, ``tables``)."""
    def value(v: object) -> str:
        if isinstance(v, dict):
            return "{" + ", ".join(f"{toml_value(k)} = {toml_value(x)}"
                                   for k, x in v.items()) + "}"
        return toml_value(v)

    return "\n".join([f"[{name}]", *(f"{k} = {value(v)}" for k, v in keys.items())])


def refusal(job: Job) -> str:
    """Why zbus-prepare has nothing to convert in ``job`` ("" when it has)."""
    d = job.data
    if d.source != "file":
        return (f"the job ({job.origin}) has synthetic data, no file to convert: pass --job "
                "naming the text data (or set ZBUS_DATA__SOURCE=file, ZBUS_DATA__FORMAT and "
                "ZBUS_DATA__PATH)")
    if d.format == "parquet":
        return (f"the job ({job.origin}) reads Parquet already: zbus-prepare converts text "
                "data (format csv, tsv or criteo)")
    return ""


def prepare(job: Job, out: Path, rows_per_file: int, row_group: int,
            show: bool = True) -> dict:
    d = job.data
    if reason := refusal(job):
        raise DataError(reason)
    schema = Schema(label=d.tasks[0], more_labels=tuple(d.tasks[1:]), dense=job.dense_fields,
                    sparse=job.sparse_fields, positive=tuple(d.positive),
                    negative=tuple(d.negative), timestamp=d.timestamp, lists=job.list_fields,
                    weight=d.weight)
    files = index_files(resolve_paths(d.path, d.format), d.format)
    parts, _ = plan_parts(files, d.eval_fraction, d.part_mb)
    out.mkdir(parents=True, exist_ok=True)
    rejected = RejectedRows(out / "rejected.tsv", out / ".rejected-parts")
    written = ParquetFiles(out, rows_per_file, row_group)
    moments = Moments.empty(len(schema.dense))
    rows_read = rows = 0
    started = time.monotonic()
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn(
            "{task.completed:,.0f}/{task.total:,.0f} rows"), TextColumn("{task.fields[rate]}"),
            TimeRemainingColumn(), disable=not show, transient=False) as bar:
        task = bar.add_task("zbus-prepare", total=sum(p.rows for p in parts), rate="")
        for part in parts:
            for block in rejected.watch(part.number, read_part(files, part, d.format, schema)):
                written.write(table_of(schema, block))
                moments = moments.merge(Moments.of(block.dense))
                rows_read += block.rows_read
                rows += len(block)
                rate = rows_read / max(time.monotonic() - started, 1e-9)
                bar.update(task, advance=block.rows_read, rate=f"{rate:,.0f} rows/s")
    written.close()
    transform = moments.transform(False)
    report = {
        "source": [f.path for f in files], "format": d.format, "files": written.files,
        "rows_read": rows_read, "rows": rows, "rejected": rejected.count,
        "seconds": round(time.monotonic() - started, 1),
        "dense": {name: {"count": int(moments.count[j]), "mean": float(transform.mean[j]),
                         "std": float(transform.std[j])}
                  for j, name in enumerate(schema.dense)},
        "job": data_section(job, out)}
    atomic_write(out / "prepared.json", orjson.dumps(report, option=orjson.OPT_INDENT_2))
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="zbus-prepare", description=__doc__.splitlines()[0])
    parser.add_argument("--job", help="job file (default: $ZBUS_JOB, else the built-in job)")
    parser.add_argument("--out", required=True, help="directory for the Parquet files")
    parser.add_argument("--rows-per-file", type=integer, default=2_000_000, metavar="N",
                        help="rows per output file (default 2,000,000)")
    parser.add_argument("--row-group", type=integer, default=131_072, metavar="N",
                        help="rows per Parquet row group (default 131,072)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    job = load_job_or_exit(args.job, "prepare")
    try:
        report = prepare(job, Path(args.out), args.rows_per_file, args.row_group,
                         show=not args.quiet)
    except (DataError, OSError) as exc:
        print(f"zbus prepare: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    print(f"zbus prepare: {report['rows']:,} rows in {len(report['files'])} Parquet file(s) "
          f"in {args.out} ({report['rejected']:,} rejected) in {report['seconds']} s; a job "
          f"reads them with this [data] section (also in prepared.json):\n"
          f"{toml_section('data', report['job'])}")


if __name__ == "__main__":
    main()
