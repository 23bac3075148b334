#!/usr/bin/env python
"""The label join's memory (``roles.algorithms.feeding.label_join``) at a stream's rate: does it
stay at window x rate, whatever the stream's length?

Feeds ``--minutes`` of event time at ``--rate`` impressions a second through a ``LabelJoin`` of
``--window-s``, in chunks of one second: each impression gets a label (a click, 1, with
probability ``--ctr``; else a 0) after a delay drawn uniform in [0, 1.5 x window), so about a
third arrive after the window (late: counted, not joined) and their impressions leave as
negatives. Every ``--sample-s`` of event time it records the join's own bytes (``nbytes``: its
arrays and index) and this process's RSS; prints the largest after the first window and the
counts. The strongest alternative is no join at all (labels inline in the impressions), whose
memory is zero: the figure is what waiting for late labels costs.

    .venv/bin/python scripts/bench_join.py [--rate 50000] [--window-s 60] [--minutes 10]
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np
import psutil

from roles.algorithms.feeding.label_join import LabelJoin


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=50_000, help="impressions a second")
    parser.add_argument("--window-s", type=float, default=60.0)
    parser.add_argument("--minutes", type=float, default=10.0, help="of event time")
    parser.add_argument("--ctr", type=float, default=0.05)
    parser.add_argument("--sample-s", type=int, default=30)
    args = parser.parse_args()
    rng = np.random.default_rng(1)
    join = LabelJoin(args.window_s)
    me = psutil.Process()
    seconds = int(args.minutes * 60)
    pending: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}   # second -> labels due
    samples = []
    joined = 0
    started = time.perf_counter()
    base_rss = me.memory_info().rss
    for t in range(seconds):
        ids = t * args.rate + np.arange(args.rate, dtype=np.int64)
        out, _ = join.add_impressions(ids, np.full(args.rate, float(t)), ids)
        joined += len(out)
        delay = rng.uniform(0, 1.5 * args.window_s, args.rate).astype(np.int64)
        clicks = (rng.random(args.rate) < args.ctr).astype(np.float64)
        for d in np.unique(delay):
            at = delay == d
            pending.setdefault(t + int(d), []).append((ids[at], clicks[at]))
        for due_ids, due_labels in pending.pop(t, []):
            joined += len(join.add_labels(due_ids, due_labels, np.full(len(due_ids), float(t))))
        if t % args.sample_s == 0 or t == seconds - 1:
            samples.append((t, join.nbytes(), me.memory_info().rss - base_rss, join.waiting()))
    wall = time.perf_counter() - started
    after = [s for s in samples if s[0] >= args.window_s * 1.5] or samples
    held = args.window_s * args.rate
    c = join.counts
    print(f"{platform.processor() or platform.machine()}: {seconds * args.rate:,} impressions "
          f"at {args.rate:,}/s of event time, window {args.window_s:g} s, in {wall:.1f} s "
          f"({seconds * args.rate / wall:,.0f} impressions/s joined)")
    print("| event time s | join bytes | RSS growth | ids waiting |")
    print("|---|---|---|---|")
    for t, nbytes, rss, waiting in samples:
        print(f"| {t} | {nbytes / 2**20:,.0f} MiB | {rss / 2**20:,.0f} MiB | {waiting:,} |")
    top = max(s[1] for s in after)
    print(f"\nafter warm-up: join at most {top / 2**20:,.0f} MiB "
          f"({top / held:.0f} bytes per impression of one window, {held:,.0f}), "
          f"RSS growth at most {max(s[2] for s in after) / 2**20:,.0f} MiB; first "
          f"{after[0][1] / 2**20:,.0f} MiB, last {after[-1][1] / 2**20:,.0f} MiB")
    print(f"joined {c.joined:,}, expired as negatives {c.expired_negative:,}, labels late "
          f"{c.labels_late:,}, unmatched {c.labels_unmatched:,}")


if __name__ == "__main__":
    main()
