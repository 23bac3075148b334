"""A stream's messages as rows of the job's schema (``EventDecoder``): the same checks as a data
file's rows (``roles.data.readers``), so that an event trains exactly as the same row read from a
file would, and a malformed event is set aside with where it came from, never raised.

Formats (``[stream] format``):

- ``json``: one object per event keyed by column name; a message may hold several, one per
  line. A value is a string, a number, a boolean (a label: true is 1) or null (missing); a list
  field's value a JSON array of ids, or one string of ids with the field's separator, as in a
  file. Keys that are not columns of the job are ignored; a column missing from the object is
  missing, as an empty field of a file is.
- ``tsv`` / ``csv``: one line per event, its fields in the order of ``[stream] columns``
  (CSV quoting as Python's csv module reads it).

A rejected event is a ``Rejected`` whose ``file`` names the message
(``<topic>[<partition>]@<position>``) and whose ``line`` is the event's line in it (from 1).

With ``id_field`` (``[stream.labels] id_field``: impressions and their labels share it) each
accepted event's id is decoded too (``Decoded.ids``): an integer as it is, any other text
hashed to 64 bits (``event_id``); an event without one is rejected.
"""

from __future__ import annotations

import csv
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from roles.data.readers import RawBlock, Rejected, Schema, _block
from roles.events import Delivery
from roles.events.json_block import JsonBlocks, origins
from roles.job.stream_settings import FORMATS

MAX_SHOWN = 500   # characters of a rejected event kept with its reason
_TEXT = {str, type(None)}   # an event's values that go to the columns as they are


@dataclass
class Decoded:
    """A batch of messages decoded: the accepted events as a block, and for each of them the
    message it came from (``message``: an index into the deliveries decoded, ``line``: its line
    in that message, from 0) and its event time in seconds (the timestamp column, else the
    broker's time of its message); ``events`` counts every event read, rejected ones too."""

    block: RawBlock
    message: np.ndarray     # int64 [accepted]
    line: np.ndarray        # int64 [accepted]
    event_time_s: np.ndarray  # float64 [accepted]
    events: int
    ids: np.ndarray | None = None   # int64 [accepted]: with ``id_field``

    @property
    def rejected(self) -> list[Rejected]:
        return self.block.rejected


class EventDecoder:
    """``schema`` the job's columns; ``fmt`` one of ``FORMATS``; ``columns`` the fields of a
    tsv/csv line, in order (unused for json); ``topic`` names the messages in rejections;
    ``id_field`` an event's id (the module's docstring)."""

    def __init__(self, schema: Schema, fmt: str, topic: str, columns: Sequence[str] = (),
                 id_field: str = ""):
        if fmt not in FORMATS:
            raise ValueError(f"[stream] format must be one of {', '.join(FORMATS)}, got {fmt!r}")
        self.schema, self.fmt, self.topic = schema, fmt, topic
        self.schema_columns = schema.columns()
        self.id_field = id_field
        # the fields read: the schema's, then the id (when it is not one of them)
        self.wanted = self.schema_columns + ([id_field] if id_field and
                                       id_field not in self.schema_columns else [])
        self.id_at = self.wanted.index(id_field) if id_field else -1
        self.blocks = JsonBlocks(schema, self.wanted)
        if fmt != "json":
            missing = [c for c in self.wanted if c not in columns]
            if missing:
                raise ValueError(f"[stream] columns lacks {', '.join(missing)} (the job's "
                                 f"[data] columns; a {fmt} event's fields are named by "
                                 "[stream] columns, in order)")
            self.columns = list(columns)
            self.at = [self.columns.index(c) for c in self.wanted]

    def where(self, d: Delivery) -> str:
        return message_name(self.topic, d)

    def decode(self, deliveries: Sequence[Delivery]) -> Decoded:
        if self.fmt == "json":
            fast = self._decode_table(deliveries)
            if fast is not None:
                return fast
        return self._decode_rows(deliveries)

    def _decode_table(self, deliveries: Sequence[Delivery]) -> Decoded | None:
        """The whole batch parsed at once (``roles.events.json_block``), or None where that
        path cannot give what ``_decode_rows`` would."""
        payloads = [d.payload for d in deliveries]
        done = self.blocks.block(payloads, sum(map(len, payloads)))
        if done is None:
            return None
        block, columns, counts = done
        ids = None
        if self.id_at >= 0:
            given = columns[self.id_at]
            if not pa.types.is_string(given.type):   # (a numeric column's, as Arrow read it)
                given = given.cast(pa.string())
            if given.null_count or pc.any(pc.equal(given, "")).as_py():
                return None
            try:
                ids = given.cast(pa.int64()).to_numpy()
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                ids = np.fromiter(map(event_id, given.to_pylist()), dtype=np.int64,
                                  count=len(given))
        message, line = origins(counts)
        block.rows_read = len(message)
        return Decoded(block, message, line, self._event_time(block, deliveries, message),
                       len(message), ids)

    def _event_time(self, block: RawBlock, deliveries: Sequence[Delivery],
                    message: np.ndarray) -> np.ndarray:
        """Each event's time: its timestamp column, else its message's time at the broker."""
        if block.timestamps is not None:
            return block.timestamps.astype(np.float64)
        times = np.array([d.time_s for d in deliveries], dtype=np.float64)
        return times[message] if len(message) else np.zeros(0)

    def _decode_rows(self, deliveries: Sequence[Delivery]) -> Decoded:
        """Event by event: each malformed one named by its message and line."""
        rows: list[list[object]] = []
        raws: list[bytes] = []          # each accepted event's text, shown if _block rejects it
        origin: list[tuple[int, int]] = []
        rejected: list[Rejected] = []
        events = 0
        nbytes = 0
        row_of = self._row
        for m, d in enumerate(deliveries):
            nbytes += len(d.payload)
            for n, raw in enumerate(_lines(d.payload)):
                events += 1
                row, why = row_of(raw)
                if row is not None and self.id_at >= 0 and row[self.id_at] in (None, ""):
                    row, why = None, f"no {self.id_field!r} (the id its label is joined by)"
                if row is None:
                    rejected.append(Rejected(self.where(d), n + 1, why, _shown(raw)))
                    continue
                rows.append(row)
                raws.append(raw)
                origin.append((m, n))
        values = [list(column) for column in zip(*rows, strict=True)] if rows else \
            [[] for _ in self.wanted]
        block = self._block(values[:len(self.schema_columns)], raws, origin, deliveries, nbytes)
        kept = np.ones(len(origin), dtype=bool)
        for r in block.rejected:
            kept[r.line] = False
        block.rejected = sorted(rejected + [self._located(r, origin, deliveries)
                                            for r in block.rejected],
                                key=lambda r: (r.file, r.line))
        where = np.asarray(origin, dtype=np.int64).reshape(-1, 2)[kept]
        event_time = self._event_time(block, deliveries, where[:, 0])
        block.rows_read = events
        ids = None
        if self.id_at >= 0:
            ids = np.fromiter(map(event_id, values[self.id_at]), dtype=np.int64,
                              count=len(kept))[kept]
        return Decoded(block, where[:, 0].copy(), where[:, 1].copy(), event_time, events, ids)

    def _located(self, r: Rejected, origin: list[tuple[int, int]],
                 deliveries: Sequence[Delivery]) -> Rejected:
        m, n = origin[r.line]
        return Rejected(self.where(deliveries[m]), n + 1, r.reason, r.text)

    def _block(self, values: list[list[object]], raws: list[bytes],
               origin: list[tuple[int, int]], deliveries: Sequence[Delivery],
               nbytes: int) -> RawBlock:
        arrays = []
        for name, column in zip(self.schema_columns, values, strict=True):
            if name in self.schema.lists and any(isinstance(v, list) for v in column):
                sep = self.schema.lists[name]
                arrays.append(pa.array([v if isinstance(v, list) or v is None else
                                        _split_ids(str(v), sep) for v in column],
                                       pa.list_(pa.string())))
            else:
                arrays.append(pa.array(column, pa.string()))
        table = pa.table(arrays, names=self.schema_columns) if self.schema_columns else pa.table({})
        # _block names each rejected row by its index here (``line``); decode relocates it
        return _block(self.schema, table, len(origin),
                      lambda: [(i, _shown(raw)) for i, raw in enumerate(raws)], "", [], nbytes)

    def _row(self, raw: bytes) -> tuple[list[object] | None, str]:
        if self.fmt == "json":
            return _json_row(raw, self.wanted, self.schema.lists)
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            return None, "not UTF-8"
        fields = line.split("\t") if self.fmt == "tsv" else next(csv.reader([line]), [])
        if len(fields) != len(self.columns):
            return None, f"{len(fields)} fields, [stream] columns names {len(self.columns)}"
        return [fields[i] for i in self.at], ""


def message_name(topic: str, d: Delivery) -> str:
    """A message as rejected.tsv names it: ``<topic>[<partition>]@<position>``."""
    return f"{topic}[{d.partition}]@{d.position}"


def event_id(value: object) -> int:
    """An event's id as an int64: an integer as it is (when it fits), other text its 64-bit
    BLAKE2b hash (the same in every process, unlike ``hash``)."""
    text = str(value).strip()
    try:
        n = int(text)
        if -(1 << 63) <= n < (1 << 63):
            return n
    except ValueError:
        pass
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little",
                          signed=True)


def _lines(payload: bytes) -> list[bytes]:
    """The events of one message: its non-blank lines (a trailing newline or CR ends a line)."""
    return [line.rstrip(b"\r") for line in payload.split(b"\n") if line.strip()]


def _json_row(raw: bytes, wanted: list[str], lists: dict[str, str]
              ) -> tuple[list[object] | None, str]:
    try:
        event = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return None, f"not JSON ({str(exc).split(':')[0]})"
    if not isinstance(event, dict):
        return None, f"a JSON {type(event).__name__}, not an object keyed by column name"
    row: list[object] = list(map(event.get, wanted))
    if set(map(type, row)) <= _TEXT:   # text, as a file holds it: as it is
        return row, ""
    row = []
    for name in wanted:
        value = event.get(name)
        if value is None or isinstance(value, str):
            row.append(value)
        elif isinstance(value, bool):
            row.append("1" if value else "0")
        elif isinstance(value, int | float):
            row.append(repr(value) if isinstance(value, float) else str(value))
        elif isinstance(value, list) and name in lists:
            if not all(isinstance(v, str | int) and not isinstance(v, bool) for v in value):
                return None, f"column {name!r}: a list of ids holds something else"
            row.append([str(v) for v in value])
        else:
            return None, f"column {name!r}: a JSON {type(value).__name__} where one value is " \
                         "expected"
    return row, ""


def _split_ids(text: str, sep: str) -> list[str]:
    """A list field's text as a file gives it (``roles.data.readers._split``), for a batch in
    which other events give that field as a JSON array."""
    text = text.strip()
    return [] if text in ("", "?") else [s.strip() for s in text.split(sep)]


def _shown(raw: bytes) -> str:
    text = raw.decode("utf-8", "replace")
    return text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN] + "..."
