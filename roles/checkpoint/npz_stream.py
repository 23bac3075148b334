"""A ``.npz`` written entry by entry, each from pieces, straight into the file on disk: the
format ``np.savez`` writes and ``np.load`` reads (a zip archive, ZIP_STORED, every entry zip64,
each entry a ``.npy`` file: the header of ``numpy.lib.format``, then the array's bytes in C
order), without the arrays whole in memory. An entry's shape (so its length) must be known
before its first byte; its pieces, given in order, must add up to exactly that. The file is
written through ``zbus.files.atomic_file``: a reader sees the old file or the whole
new one, and a failure part way (a piece that raises, pieces that do not add up) leaves the
destination as it was and no temporary file."""

from __future__ import annotations

import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np
from numpy.lib import format as npy

from zbus.files import atomic_file


@dataclass
class Entry:
    """An array of the file: ``name`` (``np.load`` gives it under that key), its dtype and
    shape, and its pieces: arrays of that dtype with the shape's trailing dimensions, which
    stacked along the first axis in the order given make the array. ``pieces`` is iterated
    once, when the entry is written (a generator reads its source then, not before)."""
    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    pieces: Iterable[np.ndarray]


def whole(name: str, array: np.ndarray) -> Entry:
    """An entry written from an array held whole (a small one)."""
    array = np.asarray(array)
    return Entry(name, array.dtype, array.shape, [array])


def _header(out: IO[bytes], dtype: np.dtype, shape: tuple[int, ...]) -> None:
    d = {"descr": npy.dtype_to_descr(dtype), "fortran_order": False,
         "shape": tuple(int(n) for n in shape)}   # ints, not numpy's: the header is their repr
    try:
        npy.write_array_header_1_0(out, d)
    except ValueError:   # a header over 64 KiB (a structured dtype with many fields)
        npy.write_array_header_2_0(out, d)


def _write_entry(out: IO[bytes], entry: Entry) -> None:
    dtype = np.dtype(entry.dtype)
    if dtype.hasobject:
        raise ValueError(f"{entry.name}: object arrays are not written")
    _header(out, dtype, entry.shape)
    trailing = entry.shape[1:]
    expected = int(np.prod(entry.shape, dtype=np.int64))
    written = 0
    for piece in entry.pieces:
        piece = np.ascontiguousarray(piece, dtype=dtype)
        if entry.shape and piece.shape[1:] != trailing:
            raise ValueError(f"{entry.name}: a piece of shape {piece.shape}, the entry is "
                             f"{entry.shape}")
        written += piece.size
        if written > expected:
            raise ValueError(f"{entry.name}: pieces of more than the {expected} values of "
                             f"shape {entry.shape}")
        if piece.size:
            out.write(piece.reshape(-1).view(np.uint8).data)
    if written != expected:
        raise ValueError(f"{entry.name}: pieces of {written} values, shape {entry.shape} "
                         f"has {expected}")


def write_npz(path: Path, entries: Iterable[Entry], durable: bool = True) -> int:
    """Write ``entries`` (in that order) as the ``.npz`` ``path``: to a temporary file,
    fsynced, renamed, its directory fsynced (``durable=False``: no fsync); the bytes written.
    Memory: the pieces one at a time, never an entry whole."""
    with atomic_file(path, durable) as f:
        with zipfile.ZipFile(f, mode="w", compression=zipfile.ZIP_STORED,
                             allowZip64=True) as zf:
            for entry in entries:
                # zip64 always, as np.savez: an entry's size is not known to zipfile up front
                with zf.open(f"{entry.name}.npy", "w", force_zip64=True) as out:
                    _write_entry(out, entry)
        size = f.tell()
    return size
