"""JSON events parsed as one Arrow table (``json_block``): the fast path of
``EventDecoder.decode`` for ``format = "json"``.

Decoding event by event in Python (``orjson.loads`` then a row of values) cost a stream job's
feeder a fifth of its CPU, and the feeder bounded the job; pyarrow's JSON reader parses a
batch of messages at once in C++. It is taken only where it gives exactly what the event-by-
event path gives, and it declines (``None``) everywhere else, so that the event-by-event path
decides, with its rejections and their reasons, what it always decided:

- every line must be an object (Arrow 26's reader crashes the process, a segmentation fault,
  on a first line ``null``: a hypothesis test found it), and the messages what both read
  alike: UTF-8, no CR (``_lines`` ends a line at LF only), no
  ``NaN`` or ``Infinity`` (Arrow reads them; they are not JSON), and Arrow must find one row
  per non-blank line (a line Arrow reads otherwise, or not at all, declines);
- every wanted column must come out as text, a whole number, a boolean or missing; a fraction
  only in a column read as a number (a dense feature, a label without ``positive``, the
  weight, the timestamp), since Arrow has lost whether ``1`` was written ``1.0``, which a
  sparse id's hash would tell; a list field's arrays only of text or whole numbers, and only
  when no ``null`` follows a ``[`` or a comma anywhere in the batch (Arrow 26 misreads
  ``[null, 1]``);
- no event is rejected (a batch with a bad event is decoded again event by event, which
  names each one);
- with an id field, every event has one.
"""

from __future__ import annotations

import io
import re
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from roles.data.readers import RawBlock, Schema, _block

NOT_JSON = (b"\r", b"NaN", b"Infinity")   # bytes after which Arrow and orjson may disagree
_READ = pj.ReadOptions(use_threads=False)
NULL_IN_ARRAY = re.compile(rb"[\[,]\s*null")   # or a string that holds "[null" or ",null"


def numeric_columns(schema: Schema) -> frozenset[str]:
    """The columns read as numbers, in which a fraction's spelling changes nothing."""
    labels = () if schema.positive else tuple(schema.label_columns)
    return frozenset((*schema.dense, *labels, schema.weight, schema.timestamp)) - {""}


class JsonBlocks:
    """``block``: a batch of messages as one Arrow table. What it learns as it goes: the types
    of the wanted columns in the last batch it took, given to Arrow for the next one as an
    explicit schema (no inference: 1.8x the events a second parsed on Adult's events with their
    numbers typed, 309,263 against 555,123 on AMD EPYC; no faster on text values); a batch they
    do not fit (a type changed) is read again with inference, which then decides as it always
    did."""

    def __init__(self, schema: Schema, wanted: list[str]):
        self.schema, self.wanted = schema, wanted
        self.numeric = numeric_columns(schema)
        self._types: pa.Schema | None = None   # the last batch's wanted columns, typed

    def block(self, payloads: Sequence[bytes], nbytes: int
              ) -> tuple[RawBlock, list[pa.Array], list[int]] | None:
        """The block of ``payloads``, the ``wanted`` columns as text (a numeric one as Arrow
        read it) and the events in each message, or None where this path declines (the
        module's docstring)."""
        data = b"\n".join(payloads)
        if any(b in data for b in NOT_JSON):
            return None
        counts = [object_lines(p) for p in payloads]
        if None in counts:
            return None
        total = sum(counts)   # type: ignore[arg-type]
        if total == 0:
            return None
        try:   # (Arrow checks a string's UTF-8 only when its column is used, and raises then)
            if not data.isascii():
                data.decode("utf-8")
        except UnicodeDecodeError:
            return None
        table = self._read(data)
        if table is None or table.num_rows != total:
            return None
        done = self._columns(table, data, total, nbytes)
        if done is None:
            return None
        self._types = pa.schema([table.schema.field(name) for name in self.wanted
                                 if name in table.column_names
                                 and _kept(table.schema.field(name).type)])
        block, columns = done
        return block, columns, counts   # type: ignore[return-value]

    def _read(self, data: bytes) -> pa.Table | None:
        if self._types is not None:
            try:
                return pj.read_json(io.BytesIO(data), read_options=_READ,
                                    parse_options=pj.ParseOptions(explicit_schema=self._types))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                self._types = None   # (a type changed: inferred again)
        try:
            return pj.read_json(io.BytesIO(data), read_options=_READ)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None

    def _columns(self, table: pa.Table, data: bytes, total: int, nbytes: int
                 ) -> tuple[RawBlock, list[pa.Array]] | None:
        schema = self.schema
        null_in_array = b"null" in data and NULL_IN_ARRAY.search(data) is not None
        names = set(table.column_names)
        columns = []
        for name in self.wanted:
            try:   # (Arrow 26 may raise here on what it misread, e.g. [null, null])
                column = table.column(name).combine_chunks() if name in names else None
                if column is None or column.null_count == len(column):
                    # missing, or null in every event, whatever type told: what inference
                    # gives
                    columns.append(pa.nulls(total, pa.string()))
                    continue
                column = _as_text(column, name in self.numeric,
                                  name in schema.lists and not null_in_array)
            except pa.ArrowException:
                return None
            if column is None:
                return None
            columns.append(column)
        kept = columns[:len(schema.columns())]
        block = _block(schema, pa.table(kept, names=schema.columns()) if kept else pa.table({}),
                       total, lambda: [(i, "") for i in range(total)], "", [], nbytes)
        if block.rejected:   # (each named by the event-by-event path)
            return None
        return block, columns


def object_lines(payload: bytes) -> int | None:
    """The events of a message whose every non-blank line opens a JSON object, or None. (One
    count where every line does, as publishers write them, not a list of the lines.)"""
    data = np.frombuffer(payload, np.uint8)
    ends = np.flatnonzero(data == 10)   # (an array's look: twice as fast as counting "\n{")
    ends = ends[:-1] if payload.endswith(b"\n") else ends
    if payload[:1] == b"{" and (data[ends + 1] == 123).all():
        return len(ends) + 1
    lines = [line for line in payload.split(b"\n") if line.strip()]
    return len(lines) if all(line[:1] == b"{" for line in lines) else None


def _kept(kind: pa.DataType) -> bool:
    """A type told to Arrow for the next batch: one the batch path takes (not null, which
    any value changes)."""
    if pa.types.is_list(kind):
        return pa.types.is_string(kind.value_type) or pa.types.is_int64(kind.value_type)
    return pa.types.is_string(kind) or pa.types.is_int64(kind) or \
        pa.types.is_floating(kind) or pa.types.is_boolean(kind)


def _as_text(column: pa.Array, numeric: bool, arrays: bool) -> pa.Array | None:
    """``column`` as the event-by-event path would give it (strings, or ``list<string>`` for a
    list field's arrays; a ``numeric`` one's numbers as they are), or None where it cannot say
    the same."""
    kind = column.type
    if pa.types.is_string(kind) or (numeric and pa.types.is_floating(kind)):
        return column   # (a number is read as one from text or typed alike)
    if numeric and pa.types.is_int64(kind):   # (past 2^53 rounded, as from its text)
        return column.cast(pa.float64(), safe=False)
    if pa.types.is_null(kind):
        return pa.nulls(len(column), pa.string())
    if pa.types.is_int64(kind):   # (a sparse id written as a number: its text is hashed)
        return column.cast(pa.string())
    if pa.types.is_boolean(kind):
        return pc.if_else(column, "1", "0")
    if arrays and pa.types.is_list(kind) and (pa.types.is_string(kind.value_type)
                                              or pa.types.is_int64(kind.value_type)
                                              or pa.types.is_null(kind.value_type)):
        return column.cast(pa.list_(pa.string()))
    return None


def origins(counts: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """For events in ``counts`` per message, each one's message and its line in it (from 0)."""
    sizes = np.asarray(counts, dtype=np.int64)
    message = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)
    starts = np.cumsum(sizes) - sizes
    return message, np.arange(int(sizes.sum()), dtype=np.int64) - np.repeat(starts, sizes)
