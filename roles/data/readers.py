"""Readers for the three file formats, one record per line, ``.gz`` read transparently.

- ``csv``: comma-separated, header row (fields may be double-quoted);
- ``tsv``: tab-separated, header row;
- ``criteo``: tab-separated, no header: label, 13 integer columns I1..I13, 26 hex columns C1..C26.

A row is rejected (counted, kept with its file and line number, and the training goes on) when
it has the wrong number of fields, a number that does not parse, a NaN or infinite number or
one beyond float32's range, an unknown or missing label, or a missing, unparsable or
out-of-range timestamp (unix seconds within ±2⁵³, or ISO 8601). A
schema without a label column (``zbus-predict`` on unlabelled rows) reads labels as NaN. Empty
lines are skipped.
Missing values: an empty field or ``?`` is missing; a missing dense value becomes the training
mean (see ``transforms``), a missing categorical value is its field's own "missing" key.
"""

from __future__ import annotations

import csv
import glob
import gzip
import io
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from roles.data.transforms import FLOAT32_MAX
from roles.job.rundir import atomic_write

MISSING = ("", "?")
MAX_TIMESTAMP = 2.0 ** 53  # seconds either side of 1970 that a float holds exactly
CRITEO_COLUMNS = ["label", *(f"I{i}" for i in range(1, 14)), *(f"C{i}" for i in range(1, 27))]


class DataError(ValueError):
    """The data cannot be read as the job describes it (missing file or column, ...)."""


@dataclass(frozen=True)
class Schema:
    label: str
    dense: list[str]
    sparse: list[str]
    positive: tuple[str, ...] = ()
    negative: tuple[str, ...] = ()
    timestamp: str = ""


@dataclass(frozen=True)
class Rejected:
    file: str
    line: int
    reason: str
    text: str


def write_rejected(path: Path, rejected: list[Rejected]) -> None:
    """rejected.tsv: file, line number, reason and the row as read, one rejected row a line."""
    def clean(text: str) -> str:
        return text.replace("\t", "\\t").replace("\n", "\\n")

    lines = ["file\tline\treason\trow"]
    lines += [f"{clean(r.file)}\t{r.line}\t{clean(r.reason)}\t{clean(r.text)}" for r in rejected]
    atomic_write(path, ("\n".join(lines) + "\n").encode())


@dataclass
class RawTable:
    """Accepted rows, in file order: label 0/1, dense values (NaN = missing), categorical
    values as text, timestamps (or None); plus the rejected rows."""

    labels: np.ndarray
    dense: np.ndarray
    sparse: np.ndarray
    timestamps: np.ndarray | None
    rows_read: int
    rejected: list[Rejected] = field(default_factory=list)


def resolve_paths(path: str) -> list[str]:
    """A file, or every file a glob matches (sorted)."""
    if any(c in path for c in "*?["):
        paths = sorted(p for p in glob.glob(path) if os.path.isfile(p))
    else:
        paths = [path] if os.path.isfile(path) else []
    if not paths:
        raise DataError(f"[data] path {path!r} matches no file")
    return paths


def _open(path: str) -> io.TextIOBase:
    if path.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8", errors="replace", newline="")
    return open(path, encoding="utf-8", errors="replace", newline="")


def _splitter(fmt: str):
    if fmt == "csv":
        def split(line: str) -> list[str]:
            if '"' in line:
                return next(csv.reader([line]))
            return line.split(",")
        return split
    return lambda line: line.split("\t")


class _RowError(Exception):
    pass


class _RowParser:
    def __init__(self, columns: list[str], schema: Schema, where: str):
        index = {name: i for i, name in enumerate(columns)}
        wanted = ([("label", schema.label)] if schema.label else []) \
            + [("dense", c) for c in schema.dense] \
            + [("sparse", c) for c in schema.sparse] \
            + ([("timestamp", schema.timestamp)] if schema.timestamp else [])
        for kind, name in wanted:
            if name not in index:
                raise DataError(f"[data] {kind} column {name!r} is not in {where} "
                                f"(columns: {', '.join(columns)})")
        self.width = len(columns)
        self.label = index[schema.label] if schema.label else None  # None: scoring only
        self.label_name = schema.label
        self.dense = [(c, index[c]) for c in schema.dense]
        self.sparse = [index[c] for c in schema.sparse]
        self.timestamp = index[schema.timestamp] if schema.timestamp else None
        self.positive = set(schema.positive)
        self.negative = set(schema.negative)

    def parse(self, fields: list[str]) -> tuple[float, list[float], list[str], int]:
        if len(fields) != self.width:
            raise _RowError(f"expected {self.width} fields, got {len(fields)}")
        return (self._label(fields[self.label].strip()) if self.label is not None else math.nan,
                [self._number(name, fields[i]) for name, i in self.dense],
                ["" if (v := fields[i].strip()) in MISSING else v for i in self.sparse],
                self._timestamp(fields[self.timestamp]) if self.timestamp is not None else 0)

    def _label(self, raw: str) -> float:
        if self.positive:
            if raw in self.positive:
                return 1.0
            if raw in self.negative or (not self.negative and raw not in MISSING):
                return 0.0
            raise _RowError(f"label {raw!r} is not a known value")
        value = self._number(self.label_name, raw)
        if math.isnan(value):
            raise _RowError("missing label")
        return 1.0 if value > 0 else 0.0

    @staticmethod
    def _number(name: str, raw: str) -> float:
        raw = raw.strip()
        if raw in MISSING:
            return math.nan
        try:
            value = float(raw)
        except ValueError:
            raise _RowError(f"column {name!r}: cannot parse {raw!r} as a number") from None
        if not math.isfinite(value):
            raise _RowError(f"column {name!r}: non-finite value {raw!r}")
        if abs(value) > FLOAT32_MAX:  # features train as float32
            raise _RowError(f"column {name!r}: {raw!r} is out of float32 range")
        return value

    def _timestamp(self, raw: str) -> int:
        """Unix seconds, or an ISO 8601 date or date-time (UTC unless it says otherwise)."""
        text = raw.strip()
        if text in MISSING:
            raise _RowError("missing timestamp")
        try:
            value = float(text)
        except ValueError:
            try:
                when = datetime.fromisoformat(text)
                if when.tzinfo is None:
                    when = when.replace(tzinfo=UTC)
                return int(when.timestamp())
            except (ValueError, OverflowError):
                raise _RowError(f"timestamp {text!r} is neither unix seconds nor an ISO 8601 "
                                "date/time") from None
        if not math.isfinite(value) or abs(value) > MAX_TIMESTAMP:
            raise _RowError(f"timestamp {text!r} is out of range")
        return int(value)


def _lines(path: str) -> Iterator[tuple[int, str]]:
    with _open(path) as f:
        for number, line in enumerate(f, start=1):
            yield number, line.rstrip("\r\n")


def read_table(paths: list[str], fmt: str, schema: Schema) -> RawTable:
    split = _splitter(fmt)
    labels: list[float] = []
    dense: list[list[float]] = []
    sparse: list[list[str]] = []
    stamps: list[int] = []
    rejected: list[Rejected] = []
    rows_read = 0
    for path in paths:
        lines = _lines(path)
        if fmt == "criteo":
            columns = CRITEO_COLUMNS
        else:
            try:
                _, header = next(lines)
            except StopIteration:
                raise DataError(f"{path} is empty (a header row is expected)") from None
            columns = [c.strip() for c in split(header.lstrip("\ufeff"))]
        parser = _RowParser(columns, schema, path)
        for number, line in lines:
            if not line.strip():
                continue
            rows_read += 1
            try:
                label, numbers, values, stamp = parser.parse(split(line))
            except (_RowError, csv.Error) as exc:
                rejected.append(Rejected(path, number, str(exc), line))
                continue
            labels.append(label)
            dense.append(numbers)
            sparse.append(values)
            stamps.append(stamp)
    n = len(labels)
    return RawTable(
        labels=np.asarray(labels, dtype=np.float32),
        dense=np.asarray(dense, dtype=np.float64).reshape(n, len(schema.dense)),
        sparse=np.asarray(sparse, dtype=str).reshape(n, len(schema.sparse)),
        timestamps=np.asarray(stamps, dtype=np.int64) if schema.timestamp else None,
        rows_read=rows_read,
        rejected=rejected,
    )
