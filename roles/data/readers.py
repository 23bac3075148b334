"""Reading a part of the data as blocks of rows, with pyarrow: csv (comma-separated, header
row, fields may be double-quoted), tsv (tab-separated, header row), criteo (tab-separated, no
header: label, I1..I13, C1..C26), parquet (columns by name); ``.gz`` text read transparently.
One record per line; a part is read in chunks of about ``CHUNK_BYTES`` cut at line ends, each
parsed by pyarrow into typed columns (no per-row Python on this path).

A row is rejected (counted, kept with its file and line number — its row number, counted from
1, in a Parquet file — and the reading goes on) when it is not UTF-8 text, has the wrong number
of fields, a number that does not parse, a NaN or infinite number or one beyond float32's
range, an unknown or missing label, or a missing, unparsable or out-of-range timestamp (unix
seconds within ±2⁵³, or ISO 8601). When pyarrow cannot convert a chunk (a bad number or byte in
it), that chunk alone is read again as text and checked column by column to find the rows at
fault. The line number of a rejected row of a plain text file whose lines were not counted
(``FileIndex.counted``: parts cut by bytes) is found when a row of its part is first rejected, by
counting the newlines before the part (once per part and process). A schema without
a label column (``zbus-predict`` on unlabelled rows) reads labels as NaN. Empty lines are
skipped. Missing values: an empty field or ``?`` is missing; a missing dense value becomes the
training mean (see ``transforms``), a missing categorical value is its field's own "missing"
key (``hashing``).

List columns (``Schema.lists``: the sparse fields that hold several ids, each with its
separator): a text column is parsed dictionary-encoded (the other categorical columns are
parsed as plain text, ``TEXT``, their keys hashed row by row: ``hashing``), and each distinct
value is split at its separator once (``pc.split_pattern``: the separator is
plain text, ``|``, ``;`` or ``::`` alike), its ids trimmed; a Parquet ``list<>`` or
``large_list<>`` column of strings or integers is taken as it is (an integer id is its decimal
text), and a Parquet text column given a separator is split as text is. Either way the block
holds a ``list<string>`` column, ids in their order (the newest last, as ``hashing`` keeps
them). An empty value or ``?`` (or a null list) is an empty list; a row with an empty, ``?`` or
null id *inside* a list (``a||b``, ``a|b|``) is rejected (``empty id in a list``), found on the
distinct values (text) or with vector operations (Parquet), so that rows without one cost no
Python. A Parquet list column whose items are neither strings nor integers, a list column that
is not named in ``[data] lists``, and a text column named there without a separator are
refused before any row is read (``check_types``, ``DataError``).
"""

from __future__ import annotations

import functools
import gzip
import math
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from roles.data.index import (
    CRITEO_COLUMNS,
    DataError,
    FileIndex,
    Part,
    open_data,
    parquet_file,
    storage_errors,
)
from roles.data.transforms import FLOAT32_MAX
from roles.storage.fs import is_uri
from zbus.files import atomic_write

CHUNK_BYTES = 8 << 20
PARQUET_BATCH_ROWS = 1 << 16
# the fast path parses a chunk in blocks of this size on pyarrow's CPU pool (a thread per core;
# OMP_NUM_THREADS caps it): 1.9x one thread's parse rate on 2 cores, and a feeder's ingest 1.3x
# (Criteo layout, 8 MB chunks; one whole-chunk block on the pool: 1.2x)
PARSE_BLOCK_BYTES = 2 << 20
MAX_TIMESTAMP = 2.0 ** 53  # seconds either side of 1970 that a float holds exactly
NUMBER = (r"^[+-]?((\d+\.?\d*|\.\d+)([eE][+-]?\d+)?|[Nn][Aa][Nn]|[Ii][Nn][Ff]"
          r"([Ii][Nn][Ii][Tt][Yy])?)$")
NULLS = ["", "?"]
NANS = pa.array(["nan", "+nan", "-nan"])   # a NaN written out: present, so not finite
CATEGORICAL = pa.dictionary(pa.int32(), pa.string())  # a list column, encoded while parsed:
#                                                       each distinct value split once
TEXT = pa.string()   # a single-valued categorical column on the fast path, kept in the chunks
#                      pyarrow parsed it in and hashed row by row (hashing): the Criteo layout's
#                      26 columns read in 1.34 us a row, against 2.24 dictionary-encoded and
#                      combined (their hashing 0.44 against 0.36)
LIST_TEXT = pa.list_(pa.string())   # a list column as a block holds it
__all__ = ["CRITEO_COLUMNS", "DataError", "RawBlock", "Rejected", "Schema", "check_columns",
           "check_types", "read_part"]


@dataclass(frozen=True)
class Schema:
    label: str
    dense: list[str]
    sparse: list[str]
    positive: tuple[str, ...] = ()
    negative: tuple[str, ...] = ()
    timestamp: str = ""
    lists: dict[str, str] = field(default_factory=dict)  # list field -> its separator in text
    more_labels: tuple[str, ...] = ()   # the other tasks' label columns ([data] labels)
    weight: str = ""   # a column of sample weights ([data] weight)

    @property
    def label_columns(self) -> list[str]:
        """Every task's label column: one, several ([data] labels) or none."""
        return [self.label, *self.more_labels] if self.label else []

    def columns(self) -> list[str]:
        return [*self.label_columns, *self.dense, *self.sparse,
                *([self.timestamp] if self.timestamp else []),
                *([self.weight] if self.weight else [])]


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
class RawBlock:
    """Accepted rows of a chunk, in file order: label 0/1 (NaN without a label column; with
    several, ``[rows, tasks]``, NaN where a row has no value for a task), dense
    values (NaN = missing), one column per categorical field (a string or dictionary column,
    chunked or not; a ``list<string>`` column for a list field), timestamps (or None); and the
    rejected rows."""

    labels: np.ndarray
    dense: np.ndarray
    sparse: list[pa.Array | pa.ChunkedArray]
    timestamps: np.ndarray | None
    rows_read: int
    rejected: list[Rejected] = field(default_factory=list)
    bytes_read: int = 0   # of the file (text: the chunk's bytes, as read or decompressed)
    weights: np.ndarray | None = None   # float64, each row's [data] weight (or None)

    def __len__(self) -> int:
        return len(self.labels)


class _Reasons:
    """The first reason each row is rejected for (checks run in column order); only the rows
    rejected cost Python."""

    def __init__(self, n: int):
        self.why: dict[int, str] = {}
        self.flags = np.zeros(n, dtype=bool)

    def add(self, bad: np.ndarray, reason: Callable[[int], str]) -> None:
        for i in np.flatnonzero(bad & ~self.flags):
            self.set(int(i), reason(int(i)))

    def set(self, i: int, reason: str) -> None:
        if not self.flags[i]:
            self.why[i] = reason
            self.flags[i] = True

    def bad(self) -> np.ndarray:
        return self.flags.copy()


def _text(col: pa.Array) -> list[str]:
    return ["" if v is None else v for v in col.cast(pa.string()).to_pylist()]


class _LazyText:
    """``_text(col)[i]``, the column made Python strings only when a row is rejected (a
    reason names its value): every row's string cost a stream job's feeder a tenth of its
    decoding."""

    def __init__(self, col: pa.Array):
        self.col = col
        self.texts: list[str] | None = None

    def __getitem__(self, i: int) -> str:
        if self.texts is None:
            self.texts = _text(self.col)
        return self.texts[i]


def _read_whole(col: pa.Array) -> np.ndarray | None:
    """A text column as float64 when Arrow reads every value as a number as written (no
    blank, no ``?``, no space around it), else None (then each value is trimmed and matched
    against ``NUMBER``). What Arrow reads so, ``NUMBER`` matches, to the same value (223,115
    strings of digits, signs, points, exponents, ``nan``, ``inf`` and ``infinity`` spelt
    every way, spaces and hex: none read that ``NUMBER`` refuses, none to another value); a
    stream's JSON events carry numbers as text (``zbus-replay`` writes a file's fields as
    written), and the regular expression, the trim and the null tests were most of the
    decoding of Adult's six dense columns."""
    try:
        return col.cast(pa.string()).cast(pa.float64()).to_numpy(zero_copy_only=False)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None


def _numbers(name: str, col: pa.Array, reasons: _Reasons, label: bool = False) -> np.ndarray:
    """A column as float64 (NaN where missing); rows with a bad number get their reason (for
    the ``label`` column: that a text label needs ``positive``)."""
    read = None
    if pa.types.is_floating(col.type) or pa.types.is_integer(col.type):
        values = col.cast(pa.float64()).to_numpy(zero_copy_only=False)
        raw = None
    elif (read := _read_whole(col)) is not None:   # every value a number as written
        values, raw = read, _LazyText(col)
    else:
        trimmed = pc.utf8_trim_whitespace(col.cast(pa.string()))
        missing = pc.or_(pc.is_null(trimmed), pc.fill_null(pc.is_in(trimmed, pa.array(NULLS)),
                                                            False))
        ok = pc.or_(missing, pc.fill_null(pc.match_substring_regex(trimmed, NUMBER), False))
        good = pc.if_else(ok, pc.if_else(missing, None, trimmed), None)
        values = good.cast(pa.float64()).to_numpy(zero_copy_only=False)
        raw = _LazyText(col)
        unparsable = ~ok.to_numpy(zero_copy_only=False)
        reasons.add(unparsable, (lambda i: f"label {raw[i].strip()!r} is not a number "
                                           "(text labels need [data] positive)") if label
                    else (lambda i: f"column {name!r}: cannot parse {raw[i].strip()!r} as a "
                          "number"))
    values = np.asarray(values, dtype=np.float64)
    if read is not None:   # (a NaN written out is present: only a null is missing)
        present = ~np.isnan(values) | ~col.is_null().to_numpy(zero_copy_only=False)
    else:
        present = ~np.isnan(values) if raw is None else ~np.isnan(values) | pc.fill_null(
            pc.is_in(pc.utf8_lower(trimmed), NANS), False).to_numpy(zero_copy_only=False)
    finite = np.isfinite(values)

    def text(i: int) -> str:
        return raw[i].strip() if raw is not None else repr(float(values[i]))

    if raw is not None:
        reasons.add(present & ~finite, lambda i: f"column {name!r}: non-finite value "
                                                 f"{text(i)!r}")
    else:  # typed: NaN cannot be told from missing here, but infinities can
        reasons.add(np.isinf(values), lambda i: f"column {name!r}: non-finite value "
                                                f"{text(i)!r}")
    with np.errstate(invalid="ignore"):
        reasons.add(finite & (np.abs(values) > FLOAT32_MAX),
                    lambda i: f"column {name!r}: {text(i)!r} is out of float32 range")
    return values


def _labels(schema: Schema, col: pa.Array, reasons: _Reasons, name: str = "",
            missing: bool = False) -> np.ndarray:
    """0/1 of one label column; a missing value rejects the row, or is NaN with ``missing``
    (one of several labels)."""
    if schema.positive:
        raw = pc.utf8_trim_whitespace(col.cast(pa.string()))
        absent = pc.or_(pc.is_null(raw), pc.fill_null(pc.is_in(raw, pa.array(NULLS)), False)
                        ).to_numpy(zero_copy_only=False)   # (a null is in no value set)
        pos_np = pc.fill_null(pc.is_in(raw, pa.array(list(schema.positive))), False).to_numpy(
            zero_copy_only=False)
        neg_np = pc.fill_null(pc.is_in(raw, pa.array(list(schema.negative))), False).to_numpy(
            zero_copy_only=False) if schema.negative else ~absent & ~pos_np
        text = _LazyText(raw)
        if not missing:
            reasons.add(absent, lambda i: "missing label")
        reasons.add(~pos_np & ~neg_np & ~absent,
                    lambda i: f"label {text[i]!r} is not a known value")
        return np.where(absent, np.nan, pos_np).astype(np.float32)
    values = _numbers(name or schema.label, col, reasons, label=True)
    if not missing:
        reasons.add(np.isnan(values), lambda i: "missing label")
    with np.errstate(invalid="ignore"):
        return np.where(np.isnan(values), np.nan, values > 0).astype(np.float32)


def _weights(name: str, col: pa.Array, reasons: _Reasons) -> np.ndarray:
    """A sample weight column: a number >= 0 on every row (a missing or negative one rejects
    the row)."""
    values = _numbers(name, col, reasons)
    reasons.add(np.isnan(values), lambda i: f"missing weight (column {name!r})")
    with np.errstate(invalid="ignore"):
        reasons.add(values < 0, lambda i: f"weight {float(values[i])!r} is negative (column "
                                          f"{name!r})")
    return values


def _task_labels(schema: Schema, table: pa.Table, reasons: _Reasons) -> np.ndarray:
    """``[rows, tasks]``: each label column's 0/1, NaN where missing (that task masked for the
    row); a row without any label is rejected."""
    out = np.stack([_labels(schema, table.column(name).combine_chunks(), reasons, name,
                            missing=True) for name in schema.label_columns], axis=1)
    reasons.add(np.isnan(out).all(axis=1),
                lambda i: f"missing labels (none of {', '.join(schema.label_columns)})")
    return out


def _parse_timestamp(text: str) -> int | None:
    """Unix seconds, or an ISO 8601 date or date-time (UTC unless it says otherwise)."""
    try:
        value = float(text)
    except ValueError:
        try:
            when = datetime.fromisoformat(text)
        except ValueError:
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        try:
            return int(when.timestamp())
        except (OverflowError, ValueError):
            return None
    if not math.isfinite(value) or abs(value) > MAX_TIMESTAMP:
        raise OverflowError
    return int(value)


def _timestamps(col: pa.Array, reasons: _Reasons) -> np.ndarray:
    try:  # the common case: every value is unix seconds
        values = pc.cast(pc.utf8_trim_whitespace(col.cast(pa.string())), pa.float64())
        nums = values.to_numpy(zero_copy_only=False)
        if np.isfinite(nums).all() and (np.abs(nums) <= MAX_TIMESTAMP).all():
            return nums.astype(np.int64)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    texts = [t.strip() for t in _text(col)]
    out = np.zeros(len(texts), dtype=np.int64)
    for i, text in enumerate(texts):
        if text in NULLS:
            reasons.add(np.eye(1, len(texts), i, dtype=bool)[0], lambda _: "missing timestamp")
            continue
        try:
            value = _parse_timestamp(text)
        except OverflowError:
            reasons.set(i, f"timestamp {text!r} is out of range")
            continue
        if value is None:
            reasons.set(i, f"timestamp {text!r} is neither unix seconds nor an ISO 8601 "
                           "date/time")
        else:
            out[i] = value
    return out


def check_columns(schema: Schema, columns: list[str], where: str) -> None:
    wanted = [("label", name) for name in schema.label_columns] \
        + [("dense", c) for c in schema.dense] + [("sparse", c) for c in schema.sparse] \
        + ([("timestamp", schema.timestamp)] if schema.timestamp else []) \
        + ([("weight", schema.weight)] if schema.weight else [])
    for kind, name in wanted:
        if name not in columns:
            hint = _header_hint(columns)   # with one: the columns matter less, shown shorter
            raise DataError(f"[data] {kind} column {name!r} is not in {where} (columns: "
                            f"{_shown(', '.join(columns), 60 if hint else 200)}){hint}")


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or (
        pa.types.is_dictionary(t) and _is_text(t.value_type))


def _is_id(t: pa.DataType) -> bool:
    """A list item type whose values are ids: text or integers (dictionary-encoded or not)."""
    if pa.types.is_dictionary(t):
        return _is_id(t.value_type)
    return _is_text(t) or pa.types.is_integer(t)


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t)


def check_types(schema: Schema, types: pa.Schema, where: str) -> None:
    """A Parquet file's sparse columns fit the schema: a list field's column is a list of
    strings or integers, or text given a separator (split as text is); a single-valued field's
    column is no list."""
    for name in schema.sparse:
        if name not in types.names:
            continue   # check_columns says so
        t = types.field(name).type
        if name in schema.lists:
            if _is_list(t) and not _is_id(t.value_type):
                raise DataError(f"[data] lists: column {name!r} of {where} is {t}: the items "
                                "of a list column must be strings or integers")
            if not _is_list(t) and not _is_text(t):
                raise DataError(f"[data] lists: column {name!r} of {where} is {t}, neither a "
                                "list of ids nor text")
            if _is_text(t) and not schema.lists[name]:
                raise DataError(f"[data] lists: column {name!r} of {where} is text, not a "
                                "list: give the separator its ids are joined with ([data] "
                                f"lists {name} = \"|\")")
        elif _is_list(t):
            raise DataError(f"[data] sparse column {name!r} of {where} holds lists ({t}): name "
                            f"it in [data] lists ({name} = \"\")")


def _shown(text: str, width: int = 200) -> str:
    """``text`` on one line, its control characters escaped, cut to ``width``."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text if len(text) <= width else text[:width - 1] + "…"


SEPARATORS = {"\t": "tabs (format \"tsv\")", ",": "commas (format \"csv\")",
              ";": "';', which zbus does not read (convert it to commas or tabs)",
              "|": "'|', which zbus does not read (convert it to commas or tabs)"}


def _header_hint(columns: list[str]) -> str:
    """Why a header may lack the job's columns: it was split at the wrong separator, or it is
    not UTF-8 text."""
    if any("\ufffd" in c for c in columns):
        return "; its header is not UTF-8 text: convert the file to UTF-8"
    if len(columns) == 1:
        for sep, what in SEPARATORS.items():
            if sep in columns[0]:
                return f"; its header reads as one column, separated by {what}"
    return ""


def _empty_ids(items: pa.Array) -> np.ndarray:
    """Which ids of a list are empty: null, or empty or ``?`` once trimmed."""
    trimmed = pc.utf8_trim_whitespace(items)
    bad = pc.or_kleene(pc.is_null(items), pc.is_in(trimmed, pa.array(NULLS)))
    return np.asarray(pc.fill_null(bad, True).to_numpy(zero_copy_only=False), dtype=bool)


def _split(name: str, col: pa.Array, sep: str, reasons: _Reasons) -> pa.Array:
    """A text column of lists as ``list<string>``: each distinct value split at ``sep`` once,
    its ids trimmed; an empty value or ``?`` is an empty list, and a row whose list holds an
    empty id gets its reason."""
    if not pa.types.is_dictionary(col.type):
        col = pc.dictionary_encode(col.cast(pa.string()))
    values = pc.utf8_trim_whitespace(col.dictionary.cast(pa.string()))
    d = len(values)
    empty = _empty_ids(values)   # a value empty as an id would be: an empty list
    split = pc.split_pattern(values, sep)
    counts = pc.fill_null(pc.list_value_length(split), 0).to_numpy(
        zero_copy_only=False).astype(np.int64)
    items = pc.utf8_trim_whitespace(split.flatten().filter(pa.array(np.repeat(~empty,
                                                                              counts))))
    counts[empty] = 0
    entry = np.repeat(np.arange(d), counts)
    bad_entry = np.zeros(d + 1, dtype=bool)
    bad_entry[entry[_empty_ids(items)]] = True
    offsets = np.zeros(d + 2, dtype=np.int64)   # one entry more: the empty list of a null
    np.cumsum(counts, out=offsets[1:d + 1])
    offsets[d + 1] = offsets[d]
    lists = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), items)
    index = col.indices.fill_null(d).to_numpy(zero_copy_only=False)
    reasons.add(bad_entry[index], lambda i: f"column {name!r}: empty id in a list")
    return lists.take(pa.array(index))


def _listed(name: str, col: pa.Array, reasons: _Reasons) -> pa.Array:
    """A Parquet list column as ``list<string>`` (integer ids as their decimal text; a null
    list an empty one); a row whose list holds an empty or null id gets its reason."""
    col = col.cast(LIST_TEXT)
    counts = pc.fill_null(pc.list_value_length(col), 0).to_numpy(
        zero_copy_only=False).astype(np.int64)
    empty = _empty_ids(col.flatten())
    if empty.any():
        rows = np.repeat(np.arange(len(col)), counts)[empty]
        reasons.add(np.bincount(rows, minlength=len(col)) > 0,
                    lambda i: f"column {name!r}: empty id in a list")
    return pc.fill_null(col, pa.scalar([], LIST_TEXT)) if col.null_count else col


def _list_column(name: str, col: pa.Array, sep: str, reasons: _Reasons) -> pa.Array:
    return _listed(name, col, reasons) if _is_list(col.type) else _split(name, col, sep,
                                                                          reasons)


def _block(schema: Schema, table: pa.Table, rows_read: int, lines: Callable[[], list],
           path: str, rejected: list[Rejected], nbytes: int) -> RawBlock:
    """Checked, typed columns of a parsed chunk; ``lines()`` gives (line number, text) of
    each row of ``table``, asked only when a row is rejected."""
    n = table.num_rows
    reasons = _Reasons(n)
    if schema.more_labels:
        labels = _task_labels(schema, table, reasons)
    elif schema.label:
        labels = _labels(schema, table.column(schema.label).combine_chunks(), reasons)
    else:
        labels = np.full(n, np.nan, dtype=np.float32)
    dense = np.empty((n, len(schema.dense)), dtype=np.float64)
    for j, name in enumerate(schema.dense):
        dense[:, j] = _numbers(name, table.column(name).combine_chunks(), reasons)
    stamps = _timestamps(table.column(schema.timestamp).combine_chunks(), reasons) \
        if schema.timestamp else None
    weights = _weights(schema.weight, table.column(schema.weight).combine_chunks(), reasons) \
        if schema.weight else None
    lists = {name: _list_column(name, table.column(name).combine_chunks(), schema.lists[name],
                                reasons) for name in schema.sparse if name in schema.lists}
    bad = reasons.bad()
    if bad.any():
        where = lines()
        rejected = sorted(rejected + [Rejected(path, where[i][0], reasons.why[int(i)],
                                               where[i][1]) for i in np.flatnonzero(bad)],
                          key=lambda r: r.line)
        keep = np.flatnonzero(~bad)
        table = table.take(pa.array(keep))
        lists = {name: col.take(pa.array(keep)) for name, col in lists.items()}
        labels, dense = labels[keep], dense[keep]
        stamps = None if stamps is None else stamps[keep]
        weights = None if weights is None else weights[keep]
    sparse = [lists[name] if name in lists else table.column(name)   # as parsed, chunked
              for name in schema.sparse]
    return RawBlock(labels, dense, sparse, stamps, rows_read, rejected, nbytes, weights)


@functools.lru_cache(maxsize=1024)
def _lines_before(path: str, size: int, mtime_ns: int, data_start: int, offset: int) -> int:
    """The newlines in bytes [data_start, offset) of a text file (of this size and modification
    time: a changed file is counted again)."""
    del size, mtime_ns   # (the cache's key)
    count = 0
    with storage_errors(path), open_data(path) as src:
        src.seek(data_start)
        left = offset - data_start
        while left > 0 and (data := src.read(min(CHUNK_BYTES, left))):
            count += data.count(b"\n")
            left -= len(data)
    return count


class _TextChunks:
    """Line-aligned chunks of rows [first_row, first_row + rows) of a text file, of about
    ``chunk_bytes``."""

    def __init__(self, f: FileIndex, part: Part, chunk_bytes: int = CHUNK_BYTES):
        self.f, self.part, self.chunk_bytes = f, part, chunk_bytes

    def first_line(self) -> int:
        """The file line number of the part's first line: from its first row, or (a file not
        counted) by counting the lines before it, asked only when a row is rejected."""
        f, part = self.f, self.part
        header_lines = 1 if f.header else 0
        if f.counted:
            return part.first_row + header_lines + 1
        return _lines_before(f.path, f.size, f.mtime_ns, f.data_start,
                             part.start) + header_lines + 1

    def __iter__(self) -> Iterator[tuple[bytes, int]]:
        """(chunk, the part's lines before it: its first line is ``first_line()`` + that)."""
        f, part = self.f, self.part
        header_lines = 1 if f.header else 0
        line = 0
        if f.kind == "text":
            with open_data(f.path) as src:
                src.seek(part.start)
                left = part.end - part.start
                rest = b""
                while left > 0 or rest:
                    data = src.read(min(self.chunk_bytes, left)) if left > 0 else b""
                    left -= len(data)
                    buf = rest + data
                    cut = len(buf) if left <= 0 else buf.rfind(b"\n") + 1
                    if cut == 0:
                        rest = buf
                        continue
                    chunk, rest = buf[:cut], buf[cut:]
                    yield chunk, line
                    line += chunk.count(b"\n")
            return
        yield from self._gzip(header_lines)

    def _gzip(self, header_lines: int) -> Iterator[tuple[bytes, int]]:
        f, part = self.f, self.part
        line = 0
        skip = part.first_row + header_lines
        wanted = part.rows
        done = 0
        rest = b""
        try:
            with open_data(f.path) as raw, gzip.GzipFile(fileobj=raw, mode="rb") as src:
                while wanted > 0:
                    data = src.read(CHUNK_BYTES)
                    buf = rest + data
                    cut = buf.rfind(b"\n") + 1 if data else len(buf)
                    chunk, rest = buf[:cut], buf[cut:]
                    if skip:
                        have = chunk.count(b"\n")
                        if have <= skip:
                            skip -= have
                            done += have
                            if not data:
                                break
                            continue
                        at = -1
                        for _ in range(skip):
                            at = chunk.find(b"\n", at + 1)
                        chunk, skip = chunk[at + 1:], 0
                    lines = chunk.split(b"\n", wanted)
                    if len(lines) > wanted:  # the part ends inside this chunk
                        chunk = b"\n".join(lines[:wanted]) + b"\n"
                    take = min(wanted, chunk.count(b"\n") + (0 if chunk.endswith(b"\n")
                                                              or not chunk else 1))
                    if chunk:
                        yield chunk, line
                    line += take
                    wanted -= take
                    if not data:
                        break
        except (EOFError, OSError, zlib.error) as exc:
            raise DataError(f"{f.path} is damaged after line {self.first_line() + line - 1}: "
                            f"{exc}") from None


def _physical_rows(chunk: bytes, first: int) -> list[tuple[int, str]]:
    """(line number, text) of each row pyarrow reads in ``chunk``: it ends a row at \\n, \\r\\n
    or a lone \\r, and skips empty rows; line numbers count \\n only (as the index does)."""
    out = []
    for i, raw in enumerate(chunk.split(b"\n")):
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        for piece in raw.split(b"\r"):
            if piece:
                out.append((first + i, piece.decode("utf-8", errors="replace")))
    return out


def _accepted_rows(chunk: bytes, first: int, invalid: list[Rejected]) -> list[tuple[int, str]]:
    """(line number, text) of each row of the parsed table: the chunk's rows but those set
    aside for their number of fields."""
    out = _physical_rows(chunk, first)
    for r in invalid:  # in order, each the first remaining row of its line and text
        at = next((i for i, (line, text) in enumerate(out)
                   if line == r.line and text == r.text), None)
        if at is not None:
            del out[at]
    return out


class _ChunkParser:
    """pyarrow's CSV parser over one file's chunks: typed columns, or every wanted column as
    text (to find the rows at fault in a chunk that does not convert)."""

    def __init__(self, f: FileIndex, fmt: str, schema: Schema):
        self.path = f.path
        self.columns = f.header or CRITEO_COLUMNS
        check_columns(schema, self.columns, f.path)
        for name in schema.sparse:
            if name in schema.lists and not schema.lists[name]:
                raise DataError(f"[data] lists: column {name!r} of {f.path} is text: give the "
                                f"separator its ids are joined with ({name} = \"|\")")
        self.wanted = schema.columns()
        self.parse_options = dict(delimiter="," if fmt == "csv" else "\t",
                                  quote_char='"' if fmt == "csv" else False)
        label_type = pa.string() if schema.positive else pa.float64()
        self.typed = {**dict.fromkeys(schema.label_columns, label_type),
                      **dict.fromkeys(schema.dense, pa.float64()),
                      **{name: CATEGORICAL if name in schema.lists else TEXT
                         for name in schema.sparse},
                      **({schema.timestamp: pa.string()} if schema.timestamp else {}),
                      **({schema.weight: pa.float64()} if schema.weight else {})}
        self.texts = {**dict.fromkeys(self.wanted, pa.string()),
                      **dict.fromkeys(schema.sparse, CATEGORICAL)}

    def parse(self, chunk: bytes, first: int, types: dict,
              ragged: bool = False) -> tuple[pa.Table, list[Rejected]]:
        """The chunk's rows, and (with ``ragged``, which costs a call per bad row, and a
        quarter of the speed) its rows with the wrong number of fields; without it, a chunk
        that has one raises ArrowInvalid."""
        invalid: list[tuple[int, Rejected]] = []   # pyarrow's row number, the row
        width = len(self.columns)

        def handler(row: pacsv.InvalidRow) -> str:
            invalid.append((row.number or 0, Rejected(
                self.path, 0, f"expected {width} fields, got {row.actual_columns}", row.text)))
            return "skip"

        options = pacsv.ParseOptions(**self.parse_options,
                                     invalid_row_handler=handler if ragged else None)
        # the ragged path reads one block on one thread: pyarrow numbers its bad rows then
        block = len(chunk) + 1024 if ragged else PARSE_BLOCK_BYTES
        table = pacsv.read_csv(pa.py_buffer(chunk), read_options=pacsv.ReadOptions(
            column_names=self.columns, use_threads=not ragged, block_size=block),
            parse_options=options,
            convert_options=pacsv.ConvertOptions(column_types=types, include_columns=self.wanted,
                                                 null_values=NULLS, strings_can_be_null=True))
        if not invalid:
            return table, []
        rows = _physical_rows(chunk, first)
        return table, [Rejected(r.file, rows[n - 1][0] if 0 < n <= len(rows) else first,
                                r.reason, r.text) for n, r in invalid]


def _without_non_utf8(chunk: bytes, first: int, path: str) -> tuple[bytes, list[Rejected]]:
    """The chunk with each line that is not UTF-8 text emptied (pyarrow skips an empty line;
    the line numbers stay), and those lines as rejected rows."""
    try:
        chunk.decode("utf-8")
        return chunk, []
    except UnicodeDecodeError:
        pass
    lines, rejected = chunk.split(b"\n"), []
    for i, line in enumerate(lines):
        try:
            line.decode("utf-8")
        except UnicodeDecodeError:
            rejected.append(Rejected(path, first + i, "not UTF-8 text (convert the file to "
                                     "UTF-8)", line.rstrip(b"\r").decode("utf-8", "replace")))
            lines[i] = b""
    return b"\n".join(lines), rejected


def _out_of_range(col: pa.ChunkedArray) -> bool:
    """A NaN, an infinity or a number beyond float32's range in a parsed column."""
    return bool(pc.any(pc.is_nan(col)).as_py()
                or pc.any(pc.greater(pc.abs(col), FLOAT32_MAX)).as_py())


def _numeric(schema: Schema) -> list[str]:
    """The columns parsed as numbers on the fast path."""
    return [*([] if schema.positive else schema.label_columns), *schema.dense,
            *([schema.weight] if schema.weight else [])]


def _rows_of(chunks: _TextChunks, before: int, chunk: bytes) -> list[tuple[int, str]]:
    """(line number, text) of each row of a chunk read on the fast path (nothing set aside),
    the part's ``before`` lines after its first."""
    return _accepted_rows(chunk, chunks.first_line() + before, [])


def _read_text(f: FileIndex, part: Part, fmt: str, schema: Schema,
               chunk_bytes: int = CHUNK_BYTES) -> Iterator[RawBlock]:
    parser = _ChunkParser(f, fmt, schema)
    chunks = _TextChunks(f, part, chunk_bytes)
    for chunk, before in chunks:
        lines: Callable[[], list] = functools.partial(_rows_of, chunks, before, chunk)
        try:   # (no row is set aside on this path: no line number is asked for)
            table, invalid = parser.parse(chunk, 0, parser.typed)
            if any(_out_of_range(table.column(c)) for c in _numeric(schema)):
                raise pa.ArrowInvalid("NaN or out of range")  # the text path says which row
        except pa.ArrowInvalid:  # a ragged row, a bad number or a line that is not UTF-8 text
            first = chunks.first_line() + before   # in the chunk: find the rows
            chunk, unreadable = _without_non_utf8(chunk, first, f.path)
            table, invalid = parser.parse(chunk, first, parser.texts, ragged=True)
            invalid = unreadable + invalid
            lines = functools.partial(_accepted_rows, chunk, first, invalid)
        block = _block(schema, table, table.num_rows + len(invalid), lines, f.path,
                       invalid, len(chunk))
        del chunk, table, lines   # not held while the block is used (a feeder makes several
        yield block               # parts' batches ahead: each would hold its chunk's text)


def _read_parquet(f: FileIndex, part: Part, schema: Schema) -> Iterator[RawBlock]:
    check_columns(schema, f.header, f.path)
    source = parquet_file(f.path)
    check_types(schema, source.schema_arrow, f.path)
    groups = [g for g, first in f.marks
              if first < part.first_row + part.rows
              and first + source.metadata.row_group(g).num_rows > part.first_row]
    row = f.marks[groups[0]][1] if groups else 0
    for batch in _parquet_batches(source, groups, schema.columns(), is_uri(f.path)):
        lo = max(part.first_row - row, 0)
        hi = min(part.first_row + part.rows - row, batch.num_rows)
        at = row
        row += batch.num_rows
        if lo >= hi:
            continue
        table = pa.Table.from_batches([batch.slice(lo, hi - lo)])
        start = at + lo

        def lines(table=table, start=start) -> list[tuple[int, str]]:
            rows = table.to_pylist()
            return [(start + i + 1, "\t".join("" if v is None else str(v) for v in r.values()))
                    for i, r in enumerate(rows)]

        yield _block(schema, table, table.num_rows, lines, f.path, [], table.nbytes)


def _parquet_batches(source: pq.ParquetFile, groups: list[int], columns: list[str],
                     by_group: bool) -> Iterator[pa.RecordBatch]:
    """The row groups' rows in batches of ``PARQUET_BATCH_ROWS`` (the last one shorter), as
    pyarrow's ``iter_batches`` cuts them across row groups; ``by_group`` (an object, read with
    ``pre_buffer``, which fetches every row group asked for at once) asks pyarrow for one row
    group at a time and cuts the same batches from them, so that one row group is held."""
    if not by_group:
        yield from source.iter_batches(row_groups=groups, columns=columns,
                                       batch_size=PARQUET_BATCH_ROWS)
        return
    held: list[pa.RecordBatch] = []
    count = 0
    for g in groups:
        for batch in source.iter_batches(row_groups=[g], columns=columns,
                                         batch_size=PARQUET_BATCH_ROWS):
            held.append(batch)
            count += batch.num_rows
            while count >= PARQUET_BATCH_ROWS:
                table = pa.Table.from_batches(held)
                yield table.slice(0, PARQUET_BATCH_ROWS).combine_chunks().to_batches()[0]
                rest = table.slice(PARQUET_BATCH_ROWS)
                held, count = rest.to_batches(), rest.num_rows
    if count:
        yield pa.Table.from_batches(held).combine_chunks().to_batches()[0]


def read_part(files: list[FileIndex], part: Part, fmt: str, schema: Schema,
              chunk_bytes: int = CHUNK_BYTES) -> Iterator[RawBlock]:
    """The part's rows, chunk by chunk (a text file's of about ``chunk_bytes``; an object's: a
    DataError naming it when the store fails)."""
    f = files[part.file]
    with storage_errors(f.path):
        if f.kind == "parquet":
            yield from _read_parquet(f, part, schema)
        else:
            yield from _read_text(f, part, fmt, schema, chunk_bytes)
