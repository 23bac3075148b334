"""The statistics a job needs before its first batch, from a bounded read of the training parts.

Per training part, its first ``sample_rows`` accepted rows (of their label, dense and timestamp
columns alone, read in a chunk about the sample's size, ``sample_chunk_bytes``: no more of a
part is parsed than the sample needs, give or take a chunk) (all of them when decay needs the
data's newest time: then every row's timestamp is read): each dense column's count, mean and
sum of squared deviations after the log1p (merged over parts with Chan's formula, so any
number of feeders gives the same figures in part order), the newest timestamp, and the rows
read and rejected on the way. Control merges every part's summary into the dense transform
(``transforms``) and the newest time bucket for decay, and publishes them; each feeder's
summaries of the parts it reads are cached under ``[data] cache_dir`` with the data's index.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import orjson

from roles.data.index import FileIndex, Part, cache_name
from roles.data.readers import CHUNK_BYTES, RawBlock, Rejected, Schema
from roles.data.transforms import DenseTransform, signed_log1p
from zbus.files import atomic_write

STATS_VERSION = 2          # 2: the label, dense and timestamp columns alone are read
SAMPLE_CHUNK_BYTES = 256 << 10   # a sample is read in chunks of at least this many bytes


@dataclass
class Moments:
    """Count, mean and sum of squared deviations of each column (NaN = missing)."""

    count: np.ndarray
    mean: np.ndarray
    m2: np.ndarray

    @classmethod
    def empty(cls, columns: int) -> Moments:
        return cls(np.zeros(columns), np.zeros(columns), np.zeros(columns))

    @classmethod
    def of(cls, values: np.ndarray) -> Moments:
        present = ~np.isnan(values)
        count = present.sum(axis=0).astype(np.float64)
        filled = np.where(present, values, 0.0)
        mean = np.divide(filled.sum(axis=0), count, out=np.zeros(values.shape[1]),
                         where=count > 0)
        m2 = (np.where(present, values - mean, 0.0) ** 2).sum(axis=0)
        return cls(count, mean, m2)

    def merge(self, other: Moments) -> Moments:
        n = self.count + other.count
        delta = other.mean - self.mean
        share = np.divide(other.count, n, out=np.zeros_like(n), where=n > 0)
        mean = self.mean + delta * share
        m2 = self.m2 + other.m2 + delta ** 2 * self.count * share
        return Moments(n, mean, m2)

    def transform(self, log1p: bool) -> DenseTransform:
        var = np.divide(self.m2, self.count, out=np.zeros_like(self.m2), where=self.count > 0)
        std = np.sqrt(var)
        return DenseTransform(log1p=log1p, mean=self.mean.copy(),
                              std=np.where(std > 1e-9, std, 1.0))


@dataclass
class PartSummary:
    part: int
    rows_read: int                # rows read for the summary (all the part's, or a sample)
    rows: int                     # of which accepted
    rejected: int
    moments: Moments
    newest: int | None            # newest timestamp read (None without timestamps)
    complete: bool                # the whole part was read

    def to_json(self) -> dict:
        d = asdict(self)
        d["moments"] = {k: v.tolist() for k, v in asdict(self.moments).items()}
        return d

    @classmethod
    def from_json(cls, d: dict) -> PartSummary:
        m = {k: np.asarray(v, dtype=np.float64) for k, v in d["moments"].items()}
        return cls(**{**d, "moments": Moments(**m)})


def summarize(blocks: Iterator[RawBlock], part: int, columns: int, log1p: bool,
              sample_rows: int, whole: bool, rejected: list[Rejected] | None = None,
              ) -> PartSummary:
    """Read ``blocks`` (a part's) until ``sample_rows`` accepted rows have been seen, or to the
    end when ``whole``; ``rejected`` collects the rows set aside on the way."""
    moments, newest = Moments.empty(columns), None
    read = accepted = bad = 0
    complete = True
    for block in blocks:
        read += block.rows_read
        bad += len(block.rejected)
        if rejected is not None:
            rejected.extend(block.rejected)
        take = len(block) if whole else max(0, min(len(block), sample_rows - accepted))
        if take:
            values = block.dense[:take]
            moments = moments.merge(Moments.of(signed_log1p(values) if log1p else values))
        accepted += len(block)
        if block.timestamps is not None and len(block.timestamps):
            top = int(block.timestamps.max())
            newest = top if newest is None else max(newest, top)
        if not whole and accepted >= sample_rows:
            complete = False
            break
    return PartSummary(part, read, accepted, bad, moments, newest, complete)


def sample_chunk_bytes(part: Part, sample_rows: int) -> int:
    """How much of a part to parse at a time for its sample: the sample's bytes (the part's
    bytes per row, as indexed) and an eighth more, so that one chunk holds it; at least
    ``SAMPLE_CHUNK_BYTES`` (a part whose bytes are not indexed: gzip, Parquet), at most
    ``CHUNK_BYTES``. Every chunk costs a parse call per column: in chunks of 256 KiB (about a
    thousand Criteo rows) a sample took 5.7 us of CPU a row; the rows summarised are the same
    whatever the chunk."""
    size = part.end - part.start
    if size <= 0 or part.rows <= 0:
        return SAMPLE_CHUNK_BYTES
    return max(SAMPLE_CHUNK_BYTES, min(CHUNK_BYTES, sample_rows * size // part.rows * 9 // 8))


def summary_key(f: FileIndex, part: Part, fmt: str, schema: Schema, log1p: bool,
                sample_rows: int, whole: bool) -> str:
    """The cache key of a part's summary: the file as indexed, the part, and what is read."""
    return hashlib.sha256(orjson.dumps([STATS_VERSION, cache_name(f.path), f.size,
                                        f.mtime_ns, part.as_list(), fmt, asdict(schema),
                                        log1p, sample_rows, whole])).hexdigest()[:24]


def cached_summary(path: Path, make: Callable[[], PartSummary]) -> PartSummary:
    """The summary cached at ``path``, else ``make()`` (then cached there)."""
    if path.exists():
        try:
            return PartSummary.from_json(orjson.loads(path.read_bytes()))
        except (orjson.JSONDecodeError, TypeError, KeyError):
            pass
    summary = make()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, orjson.dumps(summary.to_json()), durable=False)
    return summary


def merge_summaries(summaries: list[PartSummary], log1p: bool, columns: int
                    ) -> tuple[DenseTransform, int | None]:
    """The dense transform and the newest timestamp of the training data, from every training
    part's summary (merged in part order)."""
    moments, newest = Moments.empty(columns), None
    for s in sorted(summaries, key=lambda s: s.part):
        moments = moments.merge(s.moments)
        if s.newest is not None:
            newest = s.newest if newest is None else max(newest, s.newest)
    return moments.transform(log1p), newest
