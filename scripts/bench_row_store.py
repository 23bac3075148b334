#!/usr/bin/env python
"""A served model's memory with its rows on disk (``zbus-serve --max-rows``) against held in
memory, on a table of ``--keys`` keys, in one run.

Trains the Adult job (every role its own process), then adds ``--keys`` random keys with rows
to its export's shard files (the Adult keys stay: the scores are the job's), and in a fresh
process for each way loads the export (``ExportedModel``: every row in memory, or
``max_rows = --max-rows``: a ``RowStore`` built on disk, memory-mapped) and scores the Adult
file ``--repeats`` times: the process's peak RSS and anonymous memory once loaded and after
scoring, the load's seconds, the median seconds of a scoring pass, and whether both ways give
the same probabilities.

    .venv/bin/python scripts/bench_row_store.py [--keys 10000000] [--max-rows 100000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from bench_serve import cpu_name  # (scripts/ is the script's own directory)

from roles.checkpoint.model_files import embeddings_file, load_default_rows, load_embeddings
from roles.checkpoint.npz_stream import Entry, whole, write_npz
from roles.testbed.jobs import ADULT_JOB, REPO
from roles.testbed.local_cluster import LocalCluster

PIECE = 1 << 20


def grow(export: Path, extra: int, seed: int = 7) -> None:
    """Each shard file of the export with ``extra`` / shards more random keys and rows,
    written piece by piece."""
    shards = sorted(export.glob("embeddings-ps-*.npz"))
    for i, path in enumerate(shards):
        keys, rows = load_embeddings(path)
        defaults = load_default_rows(path)
        n = extra // len(shards)
        width = rows.shape[1]
        rng = np.random.default_rng([seed, i])

        def more_keys(n=n, rng=rng, keys=keys):
            yield keys
            for lo in range(0, n, PIECE):
                yield rng.integers(-2**63, 2**63 - 1, min(PIECE, n - lo), dtype=np.int64)

        def more_rows(n=n, rows=rows, width=width):
            yield rows
            fill = np.random.default_rng(seed).normal(0, 0.05, (PIECE, width)).astype(np.float32)
            for lo in range(0, n, PIECE):
                yield fill[:min(PIECE, n - lo)]

        entries = [Entry("keys", np.dtype(np.int64), (len(keys) + n,), more_keys()),
                   Entry("rows", np.dtype(np.float32), (len(keys) + n, width), more_rows())]
        if defaults is not None:
            entries.append(whole("defaults", defaults))
        write_npz(export / embeddings_file(i), entries)


MEASURE = r"""
import json, resource, sys, time
import numpy as np
from pathlib import Path
from roles.serving.model import ExportedModel
from roles.testbed.serving import predicted

def anon():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
    return None

export, data, max_rows, repeats, out = sys.argv[1:6]
start = time.perf_counter()
model = ExportedModel(Path(export), int(max_rows))
load_s = time.perf_counter() - start
loaded = anon()
times, probs = [], None
for _ in range(int(repeats)):
    start = time.perf_counter()
    probs = predicted(model, Path(data))
    times.append(time.perf_counter() - start)
np.save(out, probs)
print(json.dumps({"keys": len(model.keys), "on_disk": model.store is not None,
                  "load_s": load_s, "anon_loaded_mb": loaded, "anon_after_mb": anon(),
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "score_s": times}))
"""


def measure(export: Path, data: Path, max_rows: int, repeats: int, out: Path) -> dict:
    got = subprocess.run([sys.executable, "-c", MEASURE, str(export), str(data), str(max_rows),
                          str(repeats), str(out)], capture_output=True, text=True, cwd=REPO)
    if got.returncode != 0:
        raise SystemExit(got.stderr)
    return json.loads(got.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=10_000_000)
    ap.add_argument("--max-rows", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-row-store-") as tmp:
        where = Path(tmp)
        with LocalCluster(where / "run", ADULT_JOB, transport="tcp", train__epochs=1) as c:
            if c.run_job(timeout=600) != 0:
                raise SystemExit(f"the job failed:\n{c.logs()}")
            export = c.run_dir / "export"
        started = time.perf_counter()
        grow(export, args.keys)
        print(f"CPU: {cpu_name()}; the Adult export grown by {args.keys:,} keys in "
              f"{time.perf_counter() - started:.1f} s", flush=True)
        data = REPO / "data" / "adult.csv.gz"
        runs = {"in memory": measure(export, data, 0, args.repeats, where / "memory.npy"),
                f"max_rows {args.max_rows:,}": measure(export, data, args.max_rows,
                                                       args.repeats, where / "disk.npy")}
        same = np.array_equal(np.load(where / "memory.npy"), np.load(where / "disk.npy"))
    print("\n| rows held | keys | load (s) | anonymous MB loaded; after scoring | peak RSS MB "
          "| a pass over 48,842 rows (s, median) |\n|---|---|---|---|---|---|")
    for name, r in runs.items():
        print(f"| {name} | {r['keys']:,} | {r['load_s']:.1f} | {r['anon_loaded_mb']:,.0f}; "
              f"{r['anon_after_mb']:,.0f} | {r['peak_rss_mb']:,.0f} | "
              f"{statistics.median(r['score_s']):.3f} |")
    print(f"\nthe same probabilities both ways: {same}")


if __name__ == "__main__":
    main()
