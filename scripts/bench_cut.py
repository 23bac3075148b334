#!/usr/bin/env python
"""What a serving cut costs a shard (``RowPublisher.cut``: the rows changed since the previous
cut, their keys, gathered), against what a shard's own incremental checkpoint does to find
them (every row's key and liveness, then its dirty bitmap: ``roles.checkpoint.shard``), on the
same table: ``--rows`` keys, then ``--batches`` batches of ``--keys`` keys each (Zipf-drawn:
hot keys come back within a cut) trained between two cuts. Medians of ``--repeats``; the time
of the training itself beside them, for scale.

    .venv/bin/python scripts/bench_cut.py [--rows 10000000] [--batches 40] [--keys 20000]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from bench_serve import cpu_name  # (scripts/ is the script's own directory)

from roles.algorithms.shard.embedding_table import EmbeddingTable
from roles.serving.publishing import RowPublisher


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--keys", type=int, default=20_000)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    t = EmbeddingTable(args.dim, 0.01, 0.05, capacity=args.rows)
    for start in range(0, args.rows, 1_000_000):
        t.create(np.arange(start, min(start + 1_000_000, args.rows), dtype=np.int64))
    pub = RowPublisher(0, t)
    pub.cut(1)
    train, cut, scan, changed = [], [], [], []
    for r in range(args.repeats):
        t.clear_dirty()
        batches = [np.unique(rng.zipf(1.1, args.keys) % args.rows).astype(np.int64)
                   for _ in range(args.batches)]
        started = time.perf_counter()
        for keys in batches:
            rows = t.lookup(keys)
            t.adagrad(rows, np.full((len(rows), args.dim), 0.01, np.float32))
        train.append(time.perf_counter() - started)
        started = time.perf_counter()
        delta = pub.cut(r + 2)
        cut.append(time.perf_counter() - started)
        started = time.perf_counter()   # what an incremental checkpoint file takes
        by_row, live = t.key_of_row()
        dirty = np.flatnonzero(t.dirty[:t.size] & live)
        by_row[dirty], np.take(t.weights, dirty, axis=0)
        scan.append(time.perf_counter() - started)
        changed.append(len(delta.keys))
        assert len(dirty) == len(delta.keys)
    m = statistics.median
    print(f"CPU: {cpu_name()}; table {args.rows:,} rows of {args.dim}, {args.batches} batches "
          f"of up to {args.keys:,} keys between cuts, {m(changed):,.0f} distinct rows changed "
          f"(median of {args.repeats})")
    print("| | median ms |")
    print("|---|---|")
    print(f"| the batches' training (lookup + Adagrad) | {m(train) * 1e3:.1f} |")
    print(f"| the cut (RowPublisher.cut: marked rows, their keys, rows gathered) | "
          f"{m(cut) * 1e3:.1f} |")
    print(f"| what an incremental checkpoint does (the table's keys and liveness, dirty rows "
          f"gathered) | {m(scan) * 1e3:.1f} |")
    print(f"\ncut / the checkpoint's way: {m(cut) / m(scan):.2f}x; cut / training: "
          f"{m(cut) / m(train):.3f}")


if __name__ == "__main__":
    main()
