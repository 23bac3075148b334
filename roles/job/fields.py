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
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

PAD = np.iinfo(np.int64).min   # an empty slot of a list field (no key hashes to it)
DEFAULT_MAX_LEN = 50
SYNTHETIC_ITEM_FIELDS = ("item", "genres", "history")


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

    # -- made from the job's settings ----------------------------------------------------------
    @classmethod
    def of(cls, fields: list[str], lists: Mapping[str, str], tables: Mapping[str, list[str]],
           dim: int, dims: Mapping[str, int], pooling: Mapping[str, str],
           max_len: Mapping[str, int]) -> FieldLayout:
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
        return cls(fields=tuple(fields), tables=tuple(own[f] for f in fields),
                   dims=tuple(int(dims.get(own[f], dim)) for f in fields),
                   widths=tuple(int(max_len.get(f, DEFAULT_MAX_LEN)) if f in lists else 1
                                for f in fields),
                   pooling=tuple(pooling.get(f, "mean") if f in lists else "" for f in fields),
                   separators=tuple(lists.get(f, "") for f in fields))

    # -- what the fields are -------------------------------------------------------------------
    @property
    def row_dim(self) -> int:
        """The width a shard keeps every row at: the widest table's."""
        return max(self.dims)

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
    def sample_major(self) -> bool:
        """Every field single-valued at the full row width: a worker lays its grid out sample
        by sample and hands the network the fields side by side (``roles.model.sparse_input``),
        each field's vectors a strided view of them."""
        return not self.has_lists and all(d == self.row_dim for d in self.dims)

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
