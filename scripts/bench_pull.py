#!/usr/bin/env python
"""Epoch time with one worker 3x slower than the other: the pull queue against a static equal
split, against the ideal, measured in one run.

- ideal: total work / sum of speeds, with each worker's speed measured alone (1 worker), and
  the split of the samples between them that this needs (in proportion to the measured speeds,
  not to the slowdowns asked for);
- pull: both workers on zbus's sample queue (small prefetch, sized buffers, the batches taken
  ahead sized for the link from ``grants_ahead`` up (printed per run: each worker's take
  window at its last heartbeat), straggler copies at the end of a pass);
- static equal split: each worker gets half of every epoch, so an epoch cannot end before the
  slow worker has done its half: at best (slow alone) / 2, computed from the same measurement.

The workers' speeds come from ``--slowdown`` (2x and 6x: the slow one is 3x slower), which
idles rather than computes, so that on a small machine the shared cores do not decide the
result. The built-in synthetic data (80,000 training rows, 313 batches of 256 an epoch), MLP
512-256, 1 shard; epoch times are training passes only.

    .venv/bin/python scripts/bench_pull.py [--repeats 3] [--epochs 2] [--set train__grants_ahead=1]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from roles.testbed.local_cluster import LocalCluster, setting_pair  # noqa: E402  (the test harness)

FAST, SLOW = 2.0, 6.0


def run(workdir: Path, epochs: int, slowdowns: list[float], settings: dict[str, object]) -> dict:
    with LocalCluster(workdir, None, transport="tcp", cluster__workers=len(slowdowns),
                      cluster__shards=1, model__hidden=[512, 256], train__epochs=epochs,
                      train__torch_threads=1, checkpoint__every_s=0, **settings) as c:
        if c.run_job(timeout=900, slowdown=dict(enumerate(slowdowns))) != 0:
            raise SystemExit(f"run failed:\n{c.logs()}")
        s = c.summary()
    return {"epoch_s": statistics.median(e["train_s"] for e in s["per_epoch"]),
            "workers": s["workers"], "auc": s["auc"],
            "windows": {w: t.get("take_window") for w, t in s.get("take_windows", {}).items()},
            "links": {w: t.get("sample_links") for w, t in s.get("take_windows", {}).items()}}


def ideal_of(fast_s: float, slow_s: float) -> tuple[float, float]:
    """From the epoch times of each worker alone: the ideal epoch of both together (the work
    split in proportion to their speeds) and that split, fast : slow (its samples per second
    over the slow one's)."""
    return 1 / (1 / fast_s + 1 / slow_s), slow_s / fast_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--set", action="append", default=[], metavar="SECTION__KEY=VALUE",
                        help="a job setting for every run, e.g. train__grants_ahead=1")
    args = parser.parse_args()
    settings = dict(setting_pair(kv) for kv in args.set)
    cases = {"fast alone": [FAST], "slow alone": [SLOW], "pull": [FAST, SLOW]}
    results: dict[str, list[dict]] = {name: [] for name in cases}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for name, slowdowns in cases.items():
                got = run(Path(tmp) / f"{name.replace(' ', '-')}-{r}", args.epochs, slowdowns,
                          settings)
                results[name].append(got)
                print(f"  run {r + 1} {name}: epoch {got['epoch_s']:.2f} s, "
                      f"{got['workers']}, auc {got['auc']:.4f}, batches asked ahead "
                      f"{got['windows']}, sample queue links {got['links']}", flush=True)
    epoch = {name: statistics.median(g["epoch_s"] for g in runs)
             for name, runs in results.items()}
    ideal, ideal_split = ideal_of(epoch["fast alone"], epoch["slow alone"])
    static = epoch["slow alone"] / 2
    split = statistics.median(g["workers"]["worker-0"] / max(1, g["workers"]["worker-1"])
                              for g in results["pull"])
    auc = statistics.median(g["auc"] for g in results["pull"])
    print(f"\nmedians of {args.repeats}; workers slowed {FAST:g}x and {SLOW:g}x; alone: fast "
          f"{epoch['fast alone']:.2f} s, slow {epoch['slow alone']:.2f} s an epoch"
          + "".join(f", {kv}" for kv in args.set))
    print("| case | epoch (s) | ÷ ideal | samples fast : slow |")
    print("|---|---|---|---|")
    print(f"| ideal: 1 / (1/fast + 1/slow) | {ideal:.2f} | 1.00 | {ideal_split:.2f} : 1 |")
    print(f"| pull queue (measured, AUC {auc:.4f}) | {epoch['pull']:.2f} | "
          f"{epoch['pull'] / ideal:.2f} | {split:.2f} : 1 |")
    print(f"| static equal split (bound: slow / 2) | {static:.2f} | {static / ideal:.2f} | "
          "1.00 : 1 |")


if __name__ == "__main__":
    main()
