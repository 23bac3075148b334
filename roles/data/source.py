"""A job's data as parts: where the rows are (the files' index, or the built-in generator),
how a row reads (the schema), and the rows of any part, chunk by chunk (``readers``).

A block holds one column per sparse field, in the job's order: text for a single-valued field,
``list<string>`` for a list field (``[data] lists``; the generator's ``genres`` and
``history`` with ``[data.synthetic] items``), which the ``Preparer`` (``stream``) hashes into
the job's slots (``Job.layout()``)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pyarrow as pa

from roles.data.index import (
    Advance,
    DataError,
    FileIndex,
    Part,
    index_files,
    parquet_schema,
    plan_parts,
    resolve_paths,
    stat,
    synthetic_parts,
)
from roles.data.readers import (
    CHUNK_BYTES,
    LIST_TEXT,
    RawBlock,
    Rejected,
    Schema,
    check_columns,
    check_types,
    read_part,
)
from roles.data.stats import (
    PartSummary,
    cached_summary,
    merge_summaries,
    sample_chunk_bytes,
    summarize,
    summary_key,
)
from roles.data.stream import Preparer
from roles.data.synthetic import BLOCK_ROWS, Generator
from roles.job.settings import Job

ORACLE_ROWS = 1_000_000   # eval rows the oracle AUC of synthetic data is measured on, at most


class DataSource:
    def __init__(self, job: Job, with_label: bool = True):
        data = job.data
        self.job = job
        self.fmt = data.format
        self.synthetic = data.source == "synthetic"
        labelled = with_label and not self.synthetic
        self.schema = Schema(label=data.tasks[0] if labelled else "",
                             dense=job.dense_fields, sparse=job.sparse_fields,
                             positive=tuple(data.positive), negative=tuple(data.negative),
                             timestamp=data.timestamp, lists=job.list_fields,
                             more_labels=tuple(data.tasks[1:]) if labelled else (),
                             weight=data.weight if labelled else "")
        self.cache_dir = Path(os.environ.get("ZBUS_CACHE_DIR") or data.cache_dir).expanduser()
        self.generator: Generator | None = None
        self.files: list[FileIndex] = []
        self.bytes_read = 0   # of the data files, over every part read
        if self.synthetic:
            s = data.synthetic
            self.generator = Generator(s.rows, s.vocab, s.dense, s.zipf, s.signal, s.days,
                                       s.seed, items=s.items, history=s.history,
                                       genres=s.genres, drift=s.drift,
                                       conversion=s.conversion)

    # -- the index (made by one feeder, told to the others through control) -------------------
    def index(self, advance: Advance | None = None) -> tuple[list[FileIndex], list[Part], int]:
        """Every file's index, the parts and the number of training rows; ``advance`` is told
        of the bytes read as the files are indexed (``data_bytes`` is the whole)."""
        data = self.job.data
        more = {} if advance is None else {"advance": advance}
        if self.generator is not None:
            parts, n_train = synthetic_parts(data.synthetic.rows, data.eval_fraction,
                                             data.part_rows)
            return [], parts, n_train
        files = index_files(resolve_paths(data.path, self.fmt), self.fmt, self.cache_dir,
                            **more)
        eval_files = index_files(resolve_paths(data.eval_path, self.fmt, "[data] eval_path"),
                                 self.fmt, self.cache_dir, **more) \
            if data.eval_path else None
        parts, n_train = plan_parts(files, data.eval_fraction, data.part_mb, eval_files)
        for f in files + (eval_files or []):
            if f.header:  # csv, tsv, parquet: every column the job names is there
                check_columns(self.schema, f.header, f.path)
            if f.kind == "parquet":   # and holds lists where the job wants them
                check_types(self.schema, parquet_schema(f.path), f.path)
        return files + (eval_files or []), parts, n_train

    def adopt(self, files: list[dict]) -> None:
        """The files as another feeder indexed them: check this host's copies and read those."""
        mine = []
        for f in files:
            try:
                size = stat(f["path"]).st_size   # an object's: DataError naming it
            except OSError as exc:
                raise DataError(f"{f['path']}: {exc.strerror} on this host") from None
            if size != f["size"]:
                raise DataError(f"{f['path']} has {size} bytes on this host and {f['size']} "
                                "where the data was indexed: every feeder must read the same "
                                "files")
            mine.append(FileIndex(**{**f, "marks": f.get("marks", [])}))
        self.files = mine

    def data_bytes(self) -> int:
        """The size of the data's files (what indexing reads at most), 0 for the generator."""
        if self.generator is not None:
            return 0
        data = self.job.data
        paths = resolve_paths(data.path, self.fmt) + (
            resolve_paths(data.eval_path, self.fmt, "[data] eval_path") if data.eval_path
            else [])
        return sum(stat(p).st_size for p in paths)

    @staticmethod
    def describe(files: list[FileIndex]) -> list[dict]:
        return [asdict(f) for f in files]

    # -- rows -------------------------------------------------------------------------------
    def _counted(self, block: RawBlock) -> RawBlock:
        self.bytes_read += block.bytes_read
        return block

    def blocks(self, part: Part, schema: Schema | None = None,
               chunk_bytes: int = CHUNK_BYTES) -> Iterator[RawBlock]:
        """The part's rows, block by block: of ``schema``'s columns (the job's by default; a
        file's), a text file's read in chunks of about ``chunk_bytes``."""
        if self.generator is None:  # (map: no frame here holds a block while it is used)
            yield from map(self._counted, read_part(self.files, part, self.fmt,
                                                    schema or self.schema, chunk_bytes))
            return
        end = part.first_row + part.rows
        for lo in range(part.first_row, end, BLOCK_ROWS):
            rows = self.generator.rows_between(lo, min(end, lo + BLOCK_ROWS))
            sparse = []
            for f in range(rows.values.shape[1]):
                ids = rows.values[:, f]
                sparse.append(pa.array(ids, mask=ids < 0).cast(pa.string()))
            if self.generator.items:
                genres = rows.genres[rows.genres >= 0]   # row by row, in order
                sparse.append(_lists((rows.genres >= 0).sum(axis=1), genres))
                sparse.append(_lists(rows.history_lengths, rows.history))
            yield RawBlock(labels=rows.labels, dense=rows.dense, sparse=sparse,
                           timestamps=rows.timestamps if self.schema.timestamp or
                           self.job.data.decay_base > 1 else None, rows_read=len(rows.labels))

    def summary(self, part: Part, log1p: bool, sample_rows: int, whole: bool,
                rejected: list[Rejected] | None = None) -> PartSummary:
        """A training part's statistics (``roles.data.stats``): cached for files (under
        ``cache_dir``, keyed by the file as indexed), made again for the generator. Only the
        columns they need are parsed (the label, the dense fields, the timestamp: a row is
        rejected here for those alone), a sample in a chunk of about its size
        (``sample_chunk_bytes``). The rejected rows it reads go to ``rejected`` (only when
        they are read, not cached)."""
        schema = replace(self.schema, sparse=[], lists={})

        def make() -> PartSummary:
            return summarize(self.blocks(part, schema, CHUNK_BYTES if whole
                                         else sample_chunk_bytes(part, sample_rows)),
                             part.number, len(self.schema.dense), log1p, sample_rows, whole,
                             rejected)

        if self.generator is not None:
            return make()
        key = summary_key(self.files[part.file], part, self.fmt, schema, log1p,
                          sample_rows, whole)
        return cached_summary(self.cache_dir / f"part-{key}.json", make)

    def preparer(self, parts: list[Part],
                 held: Callable[[Part], Iterable[RawBlock]] | None = None) -> Preparer:
        """The preparation of rows every feeder gets from control (``roles.data.stats``: each
        training part's summary, merged in part order), made here in one process (the
        reference trainer, benchmarks). ``held``: a part's blocks as already read (the
        preloaded reference), summarised from memory instead of read again (nor cached)."""
        d = self.job.data
        training = [p for p in parts if not p.eval]
        sample = -(-d.stats_rows // max(1, len(training)))
        whole = d.decay_base > 1.0
        summaries = [self.summary(p, d.log1p, sample, whole) if held is None else
                     summarize(iter(held(p)), p.number, len(self.schema.dense), d.log1p, sample,
                               whole) for p in training]
        transform, newest = merge_summaries(summaries, d.log1p, len(self.schema.dense))
        return Preparer.for_job(self.job, transform, newest)

    def oracle_scores(self, parts: list[Part]) -> tuple[np.ndarray, np.ndarray] | None:
        """Synthetic data: the labels and true probabilities of (up to ``ORACLE_ROWS`` of) the
        eval rows, whose AUC is the best any model can reach; None for real data."""
        if self.generator is None:
            return None
        labels, probs, left = [], [], ORACLE_ROWS
        for part in parts:
            if part.eval and left > 0:
                rows = self.generator.rows_between(part.first_row,
                                                   part.first_row + min(part.rows, left))
                labels.append(rows.labels)
                probs.append(rows.probs)
                left -= len(rows.labels)
        return (np.concatenate(labels), np.concatenate(probs)) if labels else None


def _lists(lengths: np.ndarray, ids: np.ndarray) -> pa.Array:
    """``list<string>``: row i the next ``lengths[i]`` of ``ids``, as decimal text."""
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids).cast(pa.string()),
                                    type=LIST_TEXT)
