"""The sparse fields as every role sees them: which hold one id and which several (list fields,
pooled or kept as sequences), the embedding table each looks up, its width, and how a batch's
keys are laid out, in the feeder, on the wire and in the worker.

In a feeder a sample's keys are one int64 row of *slots*: one slot per single-valued field, and
``max_len`` slots per list field, its ids in the order given (the newest last), left-aligned and
padded with ``PAD``. A batch crosses the bus as a *grid* of key occurrences, **field-major**:
field 0's occurrences for every sample in order, then field 1's, ...: a single-valued field has
one per sample (a missing value is its field's own key), a list field as many as each sample's
list holds (0 for an empty list). ``bounds`` (fields + 1 integers) says where each field's run
begins; a batch's lengths (int32 [samples, list fields]) give the rest, so a worker knows every
occurrence's sample and place without seeing a key.

Tables: a field in no ``[data.tables]`` entry has a table of its own, named as the field; the
fields of one table hash their ids with the table's name (``roles.data.hashing``), so the same
id is the same key, and the same row, in each. A shard keeps every row at the widest table's
width (``row_dim``); a field reads the first ``dims[f]`` columns of its rows.

Weights per id (the wide part of ``wide_deep``, the first order of ``deepfm``): *derived*
fields, after the data's, whose keys are made from the data fields' keys (``derived_keys``),
not read. ``wide:<field>`` holds one weight per id of its field (a vector of one weight per
task; a list field's is a list, summed) in a table of its own; ``cross:<a>*<b>`` one weight
per pair (or tuple) of ids of single-valued fields, their keys hashed together (Cheng et al.
2016's crossed columns). ``sources[f]`` names the data fields a derived field is made of
(empty for a data field).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

PAD = np.iinfo(np.int64).min   # an empty slot of a list field (no key hashes to it)
DEFAULT_MAX_LEN = 50
SYNTHETIC_ITEM_FIELDS = ("item", "genres", "history")
WIDE, CROSS = "wide:", "cross:"   # the names of the derived fields begin so


def wide_name(field: str) -> str:
    """The derived field of one weight per id of ``field``."""
    return f"{WIDE}{field}"


def cross_name(fields: Sequence[str]) -> str:
    """The derived field of one weight per tuple of ids of ``fields``."""
    return CROSS + "*".join(fields)


class LayoutError(ValueError):
    """A job whose fields, lists, tables, widths or pooling do not fit together."""


@dataclass(frozen=True)
class FieldLayout:
    fields: tuple[str, ...]        # every sparse field, in the job's order
    tables: tuple[str, ...]        # the table each field looks up
    dims: tuple[int, ...]          # the width each field's rows are read at
    widths: tuple[int, ...]        # slots per field: 1, or a list field's max_len
    pooling: tuple[str, ...]       # "" (one id), "mean", "sum" or "none" (a sequence)
    separators: tuple[str, ...]    # a list field's separator in text formats ("" otherwise)
    sources: tuple[tuple[int, ...], ...] = ()   # a derived field's data fields; () for all data

    # -- made from the job's settings ----------------------------------------------------------
    @classmethod
    def of(cls, fields: list[str], lists: Mapping[str, str], tables: Mapping[str, list[str]],
           dim: int, dims: Mapping[str, int], pooling: Mapping[str, str],
           max_len: Mapping[str, int], per_id: int = 0,
           crosses: Sequence[Sequence[str]] = ()) -> FieldLayout:
        """``per_id``: a weight-per-id field (``wide:<f>``) of that width for every data field
        (0: none); ``crosses``: a ``cross:`` field of that width for each tuple of
        single-valued fields."""
        names = set(fields)
        for name in lists:
            if name not in names:
                raise LayoutError(f"[data] lists names {name!r}, which is not a sparse field")
        table_of: dict[str, str] = {}
        for table, members in tables.items():
            if not members:
                raise LayoutError(f"[data.tables] {table} lists no field")
            for f in members:
                if f not in names:
                    raise LayoutError(f"[data.tables] {table} names {f!r}, which is not a "
                                      "sparse field")
                if f in table_of:
                    raise LayoutError(f"[data.tables] {f!r} is in two tables "
                                      f"({table_of[f]} and {table})")
                table_of[f] = table
            if table in names and table not in members:
                raise LayoutError(f"[data.tables] {table}: a table named as the field {table!r} "
                                  "must hold it (a field outside it has a table of that name)")
        own = {f: table_of.get(f, f) for f in fields}
        for table in dims:
            if table not in own.values():
                raise LayoutError(f"[model.dims] names {table!r}, which is neither a table of "
                                  "[data.tables] nor a field in none")
        for key, what in ((pooling, "[model.pooling]"), (max_len, "[model.max_len]")):
            for name in key:
                if name not in lists:
                    raise LayoutError(f"{what} names {name!r}, which is not a list field "
                                      "([data] lists)")
        data = cls(fields=tuple(fields), tables=tuple(own[f] for f in fields),
                   dims=tuple(int(dims.get(own[f], dim)) for f in fields),
                   widths=tuple(int(max_len.get(f, DEFAULT_MAX_LEN)) if f in lists else 1
                                for f in fields),
                   pooling=tuple(pooling.get(f, "mean") if f in lists else "" for f in fields),
                   separators=tuple(lists.get(f, "") for f in fields))
        return data.with_derived(per_id, crosses) if per_id or crosses else data

    def with_derived(self, width: int, crosses: Sequence[Sequence[str]]) -> FieldLayout:
        """This layout of data fields and, after them, a ``wide:`` field per data field and a
        ``cross:`` field per tuple of ``crosses``, each ``width`` wide in a table of its own."""
        width = max(1, width)
        for f in self.fields:
            if f.startswith((WIDE, CROSS)):
                raise LayoutError(f"sparse field {f!r}: names beginning {WIDE!r} or {CROSS!r} "
                                  "are the weights per id's (wide_deep, deepfm)")
        names = [wide_name(f) for f in self.fields]
        sources: list[tuple[int, ...]] = [(f,) for f in range(len(self.fields))]
        for cross in crosses:
            if isinstance(cross, str) or len(cross) < 2 or len(set(cross)) != len(cross):
                raise LayoutError(f"[model.options] crosses: each cross is a list of two or "
                                  f"more different sparse fields, got {cross!r}")
            at = []
            for f in cross:
                if f not in self.fields:
                    raise LayoutError(f"[model.options] crosses names {f!r}, which is not a "
                                      f"sparse field ({', '.join(self.fields)})")
                if self.is_list(self.fields.index(f)):
                    raise LayoutError(f"[model.options] crosses names {f!r}, a list field: "
                                      "a cross is of single-valued fields")
                at.append(self.fields.index(f))
            if cross_name(cross) in names:
                raise LayoutError(f"[model.options] crosses holds {list(cross)} twice")
            names.append(cross_name(cross))
            sources.append(tuple(at))
        kept = [self.widths[s[0]] if len(s) == 1 else 1 for s in sources]
        return FieldLayout(
            fields=self.fields + tuple(names), tables=self.tables + tuple(names),
            dims=self.dims + (width,) * len(names), widths=self.widths + tuple(kept),
            pooling=self.pooling + tuple("sum" if len(s) == 1 and self.is_list(s[0]) else ""
                                         for s in sources),
            separators=self.separators + ("",) * len(names),
            sources=((),) * len(self.fields) + tuple(sources))

    # -- what the fields are -------------------------------------------------------------------
    @property
    def row_dim(self) -> int:
        """The width a shard keeps every row at: the widest table's."""
        return max(self.dims)

    @functools.cached_property
    def data_fields(self) -> int:
        """How many fields are read (the first ones); the others are derived."""
        return len(self.fields) - sum(1 for s in self.sources if s)

    @property
    def derived_fields(self) -> list[str]:
        """The weights per id's fields (``wide:``, ``cross:``), in order."""
        return list(self.fields[self.data_fields:])

    @property
    def slots(self) -> int:
        return sum(self.widths)

    @functools.cached_property
    def _starts(self) -> list[int]:
        return [sum(self.widths[:f]) for f in range(len(self.widths) + 1)]

    @functools.cached_property
    def has_lists(self) -> bool:
        return any(self.pooling)

    @functools.cached_property
    def one_width(self) -> bool:
        """Every field is read at the full row width."""
        return all(d == self.row_dim for d in self.dims)

    @functools.cached_property
    def sample_major(self) -> bool:
        """Every field single-valued at the full row width: a worker lays its grid out sample
        by sample and hands the network the fields side by side (``roles.model.sparse_input``),
        each field's vectors a strided view of them."""
        return not self.has_lists and self.one_width

    def widths_at(self, positions: np.ndarray, bounds: list[int] | np.ndarray
                  ) -> np.ndarray | None:
        """float32: the width of the field (its table) at each grid position; None where
        every field is read at the full row width (row-wise Adagrad's mean over a row's
        values: ``EmbeddingTable.adagrad``)."""
        if self.one_width:
            return None
        return np.asarray(self.dims, np.float32)[field_of(positions, bounds)]

    def slot_range(self, f: int) -> slice:
        return slice(self._starts[f], self._starts[f + 1])

    def is_list(self, f: int) -> bool:
        return bool(self.pooling[f])

    @property
    def list_fields(self) -> list[str]:
        return [n for f, n in enumerate(self.fields) if self.is_list(f)]

    @property
    def sequence_fields(self) -> list[str]:
        """The list fields the network gets as sequences (pooling ``none``)."""
        return [n for n, p in zip(self.fields, self.pooling, strict=True) if p == "none"]

    def sparse_dims(self) -> dict[str, int]:
        """Each field's width as the network receives it."""
        return dict(zip(self.fields, self.dims, strict=True))

    def table_fields(self, table: str) -> list[str]:
        return [n for n, t in zip(self.fields, self.tables, strict=True) if t == table]

    # -- a batch -------------------------------------------------------------------------------
    def lengths(self, keys: np.ndarray) -> np.ndarray:
        """int32 [samples, list fields]: how many ids each sample's list fields hold."""
        if not self.has_lists:
            return np.zeros((len(keys), 0), dtype=np.int32)
        cols = [(keys[:, self.slot_range(f)] != PAD).sum(axis=1)
                for f in range(len(self.fields)) if self.is_list(f)]
        if not cols:
            return np.zeros((len(keys), 0), dtype=np.int32)
        return np.stack(cols, axis=1).astype(np.int32)

    def grid(self, keys: np.ndarray) -> tuple[np.ndarray, list[int]]:
        """A batch's slots (int64 [samples, slots]) as its grid of key occurrences, field-major,
        and the bounds of each field's run."""
        if not self.has_lists:   # one slot per field: the grid is the transpose
            n = len(keys)
            return np.ascontiguousarray(keys.T, dtype=np.int64).reshape(-1), \
                [n * f for f in range(len(self.fields) + 1)]
        runs, bounds = [], [0]
        for f in range(len(self.fields)):
            block = keys[:, self.slot_range(f)]
            run = block[:, 0] if not self.is_list(f) else block[block != PAD]
            runs.append(run)
            bounds.append(bounds[-1] + len(run))
        flat = np.concatenate(runs) if runs else np.zeros(0, np.int64)
        return np.ascontiguousarray(flat, dtype=np.int64), bounds

    def bounds(self, samples: int, lengths: np.ndarray) -> list[int]:
        """The grid's bounds from a batch's lengths (as ``grid`` makes them)."""
        out, li = [0], 0
        for f in range(len(self.fields)):
            if self.is_list(f):
                out.append(out[-1] + int(lengths[:, li].sum()))
                li += 1
            else:
                out.append(out[-1] + samples)
        return out


def field_of(positions: np.ndarray, bounds: list[int] | np.ndarray) -> np.ndarray:
    """The field of each grid position."""
    return np.searchsorted(np.asarray(bounds), positions, side="right") - 1
