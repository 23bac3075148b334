"""A Criteo-layout file of generated rows (label, 13 integer counts I1..I13, 26 categorical
values C1..C26 as 8 hex digits; tab-separated, no header), written block by block from the
built-in generator (bounded memory). The rows follow a planted logistic model with Criteo's
cardinalities, so a model trained on them has something to learn; ``missing`` of the values
are left empty, as in the real logs. ``scripts/make_criteo.py`` is its command line; tests call
``write_criteo``."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as csv

from roles.data.synthetic import BLOCK_ROWS, CRITEO_VOCAB, Generator

HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)


def hex8(ids: np.ndarray) -> pa.Array:
    """8 lower-case hex digits of each value's id, scrambled to look like Criteo's; -1 is
    empty."""
    scrambled = (ids.astype(np.uint64) * np.uint64(0x9E3779B1) + np.uint64(0x7F4A7C15)) \
        & np.uint64(0xFFFFFFFF)
    digits = np.empty((len(ids), 8), dtype=np.uint8)
    for i in range(8):
        digits[:, 7 - i] = HEX[((scrambled >> np.uint64(4 * i)) & np.uint64(15)).astype(int)]
    text = pa.array(digits.view("S8").reshape(-1)).cast(pa.string())
    return pc.if_else(pa.array(ids < 0), "", text)


def table_of(block) -> pa.Table:
    counts = block.dense
    columns = {"label": pa.array(block.labels.astype(np.int8))}
    for j in range(counts.shape[1]):
        column = counts[:, j]
        columns[f"I{j + 1}"] = pa.array(np.nan_to_num(column).astype(np.int64),
                                        mask=np.isnan(column))
    for f in range(block.values.shape[1]):
        columns[f"C{f + 1}"] = hex8(block.values[:, f])
    return pa.table(columns)


def write_criteo(out: Path | str, rows: int, *, gz: bool = False, seed: int = 1,
                 missing: float = 0.05, signal: float = 0.3, zipf: float = 1.1) -> Path:
    """``rows`` generated rows to ``out`` (gzipped at level 1 with ``gz``); its path."""
    gen = Generator(rows, CRITEO_VOCAB, 13, zipf, signal, 7, seed, missing=missing)
    options = csv.WriteOptions(include_header=False, delimiter="\t", quoting_style="none")
    sink = gzip.open(out, "wb", compresslevel=1) if gz else open(out, "wb")
    with sink:
        for b in range(-(-rows // BLOCK_ROWS)):
            csv.write_csv(table_of(gen.block(b)), sink, options)
    return Path(out)
