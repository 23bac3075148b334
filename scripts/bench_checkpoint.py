#!/usr/bin/env python
"""Benchmark: what a whole-job checkpoint costs a shard (``roles.checkpoint.shard``).

A shard's table of ``--rows`` keys (default 10M) of ``--dim`` floats (default 16), with its
Adagrad state, is checkpointed the way the shard does it at a cut: fork, and the child writes
the whole table or the rows changed since the previous file. Measured, each ``--repeat``
times (medians quoted):

- the shard's **pause**: the fork (the parent serves on while the child writes);
- the child's **write**: seconds and bytes, whole table and incremental (with ``--dirty`` of
  the rows changed since the previous file);
- the **baseline**: writing the same whole table from the loop, as a shard did before (the
  pause is then the whole write), and the ratio of pauses;
- the **copy-on-write cost**: the parent's Adagrad updates per second while a child writes,
  against the same updates with no child (the pages the parent writes are copied once).

    .venv/bin/python scripts/bench_checkpoint.py [--rows 10000000] [--dim 16]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from roles.algorithms.shard.applied import AppliedBatches
from roles.algorithms.shard.embedding_table import EmbeddingTable  # noqa: E402
from roles.checkpoint.files import save_npz  # noqa: E402
from roles.checkpoint.shard import ShardCheckpoints  # noqa: E402

BATCH_ROWS = 26_000  # distinct rows one batch of 1,024 Criteo samples touches, about


def build(rows: int, dim: int) -> EmbeddingTable:
    table = EmbeddingTable(dim, 0.05, 0.05, seed=1, capacity=rows)
    keys = np.random.default_rng(0).permutation(np.int64(rows) * 7)[:rows] - rows
    for lo in range(0, rows, 1_000_000):
        table.rows_for(keys[lo:lo + 1_000_000])
    return table


def train(table: EmbeddingTable, batches: int, rng: np.random.Generator) -> float:
    """Updates/s over ``batches`` Adagrad steps of BATCH_ROWS random rows."""
    grads = np.full((BATCH_ROWS, table.dim), 0.01, np.float32)
    started = time.perf_counter()
    for _ in range(batches):
        rows = np.unique(rng.integers(0, table.size, BATCH_ROWS))
        table.adagrad(rows, grads[:len(rows)])
    return batches / (time.perf_counter() - started)


def checkpoint(shard: ShardCheckpoints, number: int, root: Path) -> dict:
    pause = shard.begin(number, root, set(range(50_000)), {"updates": 0, "newest_epoch": 0,
                                                         "version": 0})
    started = time.perf_counter()
    assert shard.writing is not None
    ok, error = shard.writing.writer.wait()
    assert ok, error
    part = shard.poll(root)
    assert part is not None
    return {"pause_s": pause, "write_s": time.perf_counter() - started, "bytes": part.bytes,
            "kind": part.info["kind"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--dirty", type=float, default=0.05,
                        help="share of the rows changed between two checkpoints")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rng = np.random.default_rng(1)
    started = time.perf_counter()
    table = build(args.rows, args.dim)
    built_s = time.perf_counter() - started
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        root = Path(tmp)
        shard = ShardCheckpoints(0, table, full_every=1_000_000)
        full, delta, baseline = [], [], []
        number = 0
        for _ in range(args.repeat):
            number += 1
            shard.force_full = True
            full.append(checkpoint(shard, number, root))
            changed = rng.choice(table.size, int(args.dirty * table.size), replace=False)
            table.adagrad(np.sort(changed), np.full((len(changed), args.dim), 0.01,
                                                    np.float32))
            number += 1
            delta.append(checkpoint(shard, number, root))
            t0 = time.perf_counter()  # the baseline: the whole table written in the loop
            by_row, live = table.key_of_row()
            save_npz(root / "in-loop.npz", keys=by_row, live=live,
                     weights=table.weights[:table.size], accum=table.accum[:table.size])
            baseline.append(time.perf_counter() - t0)
            for old in sorted(root.glob("0*"))[:-2]:
                shutil.rmtree(old, ignore_errors=True)
        # copy-on-write: the parent's updates while a child writes the whole table
        alone = [train(table, 30, rng) for _ in range(args.repeat)]
        during = []
        for _ in range(args.repeat):
            number += 1
            shard.force_full = True
            shard.begin(number, root, AppliedBatches(), {"updates": 0, "newest_epoch": 0,
                                                         "version": 0})
            during.append(train(table, 30, rng))
            assert shard.writing is not None
            shard.writing.writer.wait()
            shard.poll(root)

    def med(runs: list[dict], key: str) -> float:
        return statistics.median(r[key] for r in runs)

    result = {
        "rows": args.rows, "dim": args.dim, "dirty": args.dirty, "repeat": args.repeat,
        "table_built_s": round(built_s, 1),
        "full": {"pause_ms": round(1000 * med(full, "pause_s"), 1),
                 "write_s": round(med(full, "write_s"), 2),
                 "mb": round(med(full, "bytes") / 2**20, 1)},
        "incremental": {"pause_ms": round(1000 * med(delta, "pause_s"), 1),
                        "write_s": round(med(delta, "write_s"), 2),
                        "mb": round(med(delta, "bytes") / 2**20, 1)},
        "baseline_in_loop_pause_s": round(statistics.median(baseline), 2),
        "pause_ratio_to_baseline": round(med(full, "pause_s") / statistics.median(baseline), 4),
        "updates_per_s": {"alone": round(statistics.median(alone), 1),
                          "while_a_child_writes": round(statistics.median(during), 1),
                          "ratio": round(statistics.median(during) / statistics.median(alone),
                                         2)},
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
