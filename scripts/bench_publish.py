#!/usr/bin/env python
"""What live serving costs a job that nobody follows: the same file job with serving cuts every
``--publish-ms`` (``[serving] publish_ms``, 200 by default) against none (``0``), alternated,
every role its own process over loopback TCP; samples/s while training (the epochs' train_s),
medians and the paired ratios. ``--split``: instead, the pull queue's split between a worker
slowed 20x and one slowed 60x (``tests/jobs/test_workers.py``'s uneven job, bar 2.5 : 1), with
and without cuts.

    .venv/bin/python scripts/bench_publish.py [--job jobs/adult.toml] [--repeats 3] [--split]
        [--set cluster__shards=1 ...]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from bench_serve import cpu_name  # (scripts/ is the script's own directory)

from roles.testbed.local_cluster import LocalCluster, setting_pair

REPO = Path(__file__).resolve().parent.parent


def run(job: Path, publish_ms: int, split: bool, settings: dict) -> float:
    with tempfile.TemporaryDirectory(prefix="bench-publish-") as tmp, \
            LocalCluster(Path(tmp), job.resolve(), transport="tcp",
                         serving__publish_ms=publish_ms, **settings) as c:
        if c.run_job(timeout=1800, slowdown={0: 20.0, 1: 60.0} if split else None) != 0:
            raise SystemExit(f"the job failed:\n{c.logs()}")
        s = c.summary()
    if split:
        return s["workers"]["worker-0"] / s["workers"]["worker-1"]
    return s["samples_trained"] / sum(e["train_s"] for e in s["per_epoch"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", type=Path, default=REPO / "jobs" / "adult.toml")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--publish-ms", type=int, default=200)
    parser.add_argument("--split", action="store_true")
    parser.add_argument("--set", action="append", default=[], type=setting_pair,
                        help="a job setting, section__key=value")
    args = parser.parse_args()
    settings = dict(args.set)
    if args.split:
        settings.setdefault("cluster__shards", 1)
    on, off = [], []
    what = "fast : slow worker" if args.split else "samples/s"
    fmt = ".3f" if args.split else ",.0f"
    for r in range(args.repeats):
        on.append(run(args.job, args.publish_ms, args.split, settings))
        off.append(run(args.job, 0, args.split, settings))
        print(f"run {r + 1}: cuts every {args.publish_ms} ms {on[-1]:{fmt}}, none "
              f"{off[-1]:{fmt}} ({what})", flush=True)
    paired = [a / b for a, b in zip(on, off, strict=True)]
    print(f"\n{args.job.name}, {cpu_name()}: {what}, medians of {args.repeats}: cuts every "
          f"{args.publish_ms} ms {statistics.median(on):{fmt}}, none "
          f"{statistics.median(off):{fmt}}; paired ratios "
          f"{', '.join(f'{x:.3f}' for x in paired)} (median {statistics.median(paired):.3f})")


if __name__ == "__main__":
    main()
