"""A served model's rows on disk (``zbus-serve --max-rows N``): a table with more rows than a
process is to hold is copied, piece by piece, from its export or checkpoint files into files
memory-mapped from a directory of its own (``RowStore``), and found there by the shard's own
open-addressing index (``roles.algorithms.shard.kernels``: probe and place, compiled), itself a
memory-mapped file. The process's own memory holds a piece (``CHUNK`` rows) while it builds,
nothing after: the rows a request reads are paged in by the kernel, which keeps the hot ones
in its page cache and drops cold ones when memory is short, whatever the table's size.

The files: ``keys.npy`` (int64, each row's key), ``rows.npy`` (float32 [rows, width]) and
``slots.npy`` (int32 row numbers, a power of two at least twice the rows, -1 empty, -2 a key
dropped by a later file of a checkpoint's chain). Export and checkpoint files are ``.npz``
archives of stored (not compressed) ``.npy`` entries (``np.savez``,
``roles.checkpoint.npz_stream``): ``mapped`` reads each entry in place, without loading it.
"""

from __future__ import annotations

import shutil
import struct
import tempfile
import weakref
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from numpy.lib import format as npy

from roles.algorithms.shard import kernels
from roles.checkpoint.files import read_meta

CHUNK = 1 << 18          # rows copied at a time while building
LOCAL_HEADER = 30        # a zip local file header's fixed part, then its name and extra field
TOMBSTONE = -2


def mapped(path: Path) -> dict[str, np.ndarray]:
    """Every numeric array of an ``.npz`` of stored entries, memory-mapped read-only (an empty
    one as an empty array); object arrays (a file's ``meta``) are left out."""
    out: dict[str, np.ndarray] = {}
    with zipfile.ZipFile(path) as z, open(path, "rb") as f:
        for info in z.infolist():
            if info.compress_type != zipfile.ZIP_STORED:
                raise ValueError(f"{path}: {info.filename} is compressed: it cannot be mapped")
            f.seek(info.header_offset + 26)
            name_len, extra_len = struct.unpack("<HH", f.read(4))
            f.seek(info.header_offset + LOCAL_HEADER + name_len + extra_len)
            version = npy.read_magic(f)
            read = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
            shape, fortran, dtype = read(f)
            if dtype.hasobject:
                continue
            name = info.filename.removesuffix(".npy")
            if int(np.prod(shape)) == 0:
                out[name] = np.zeros(shape, dtype)
            else:
                out[name] = np.memmap(path, dtype=dtype, mode="r", offset=f.tell(), shape=shape,
                                      order="F" if fortran else "C")
    return out


def pieces(n: int) -> Iterator[slice]:
    for lo in range(0, n, CHUNK):
        yield slice(lo, min(n, lo + CHUNK))


class RowStore:
    """At most ``capacity`` keys' rows of ``width``, in files under a temporary directory
    (``parent``: where it is made) removed once the store is no longer used."""

    def __init__(self, capacity: int, width: int, parent: str | None = None):
        self.dir = Path(tempfile.mkdtemp(prefix="zbus-rows-", dir=parent))
        self._cleanup = weakref.finalize(self, shutil.rmtree, self.dir, True)
        capacity = max(capacity, 1)
        slots = 1 << max(4, (2 * capacity - 1).bit_length())
        self.slot_rows = npy.open_memmap(self.dir / "slots.npy", "w+", np.int32, (slots,))
        for part in pieces(slots):
            self.slot_rows[part] = kernels.EMPTY
        self.keys = npy.open_memmap(self.dir / "keys.npy", "w+", np.int64, (capacity,))
        self.rows = npy.open_memmap(self.dir / "rows.npy", "w+", np.float32, (capacity, width))
        self.size = 0      # rows written (a key dropped keeps its row, unreachable)
        self.dropped = 0   # keys dropped by a later file
        self._loops = kernels.loops()

    def __len__(self) -> int:
        return self.size

    @property
    def held(self) -> int:
        """The keys that have a row."""
        return self.size - self.dropped

    def upsert(self, keys: np.ndarray, rows: np.ndarray) -> None:
        """Distinct keys' rows: a key here already gets its new row, a new one a row of its
        own."""
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        at = self._loops.probe(self.slot_rows, self.keys, keys, False)
        here = at >= 0
        self.rows[at[here]] = rows[here]
        new = np.flatnonzero(~here)
        if not len(new):
            return
        if self.size + len(new) > len(self.keys):
            raise ValueError(f"more than the {len(self.keys)} keys the store was made for")
        numbers = np.arange(self.size, self.size + len(new), dtype=np.int64)
        self.rows[numbers] = rows[new]
        self._loops.place(self.slot_rows, self.keys, keys[new], numbers)
        self.size += len(new)

    def drop(self, keys: np.ndarray) -> None:
        """These keys have no row any more (a key absent is ignored)."""
        slots = self._loops.probe(self.slot_rows, self.keys,
                                  np.ascontiguousarray(keys, dtype=np.int64), True)
        gone = slots[slots >= 0]
        self.slot_rows[gone] = TOMBSTONE
        self.dropped += len(gone)

    def find(self, flat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Whether each key has a row, and its row (zero where it has none)."""
        at = self._loops.probe(self.slot_rows, self.keys,
                               np.ascontiguousarray(flat, dtype=np.int64), False)
        found = at >= 0
        out = np.zeros((len(flat), self.rows.shape[1]), dtype=np.float32)
        out[found] = self.rows[at[found]]
        return found, out

    # -- building ------------------------------------------------------------------------------
    def add_export(self, path: Path) -> None:
        """An export's shard file (``embeddings-ps-<i>.npz``: ``keys``, ``rows``)."""
        m = mapped(path)
        for part in pieces(len(m["keys"])):
            self.upsert(m["keys"][part], m["rows"][part])

    def add_chain(self, files: list[Path]) -> None:
        """A shard's chain of checkpoint files, in order (``roles.checkpoint.shard``: a full
        file's live rows, then each later file's dropped keys and changed rows)."""
        for path in files:
            m = mapped(path)
            full = read_meta(m)["kind"] == "full"   # (its meta: bytes, mapped as the rest)
            if not full:
                for part in pieces(len(m["dropped"])):
                    self.drop(m["dropped"][part])
            for part in pieces(len(m["keys"])):
                keys, rows = np.asarray(m["keys"][part]), np.asarray(m["weights"][part])
                if full:
                    live = np.asarray(m["live"][part])
                    keys, rows = keys[live], rows[live]
                self.upsert(keys, rows)


def keys_in(paths: list[Path], name: str = "keys") -> int:
    """How many keys the files hold, from their headers (an upper bound of a chain's)."""
    return sum(len(mapped(p)[name]) for p in paths)
