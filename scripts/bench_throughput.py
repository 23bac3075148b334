#!/usr/bin/env python
"""Throughput of the cluster against the no-communication limit, measured in one run.

The same model (embeddings + MLP, sparse Adagrad + Adam), data and batch size are trained
(1) in one plain PyTorch process (``roles.tools.reference``) and (2) by the cluster on this host
over TCP loopback, for each cluster shape. Samples/s counts training only (the cluster's start-up,
about 5 s of process starts and imports, and evaluation are excluded on both sides). Every
measurement is repeated, each cluster run right after its single-process run; the table shows
medians, the ratio of the medians, and the median of the ratios of those back-to-back pairs
(the sturdier figure on a noisy machine).

    .venv/bin/python scripts/bench_throughput.py [--repeats 3] [--batch 1024] [--rows 200000]
        [--shapes 1x1,2x2] [--set train__grants_ahead=1 ...]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from roles.job.settings import load_job
from roles.testbed.local_cluster import (  # noqa: E402  (the test harness)
    LocalCluster,
    clean_environ,
    setting_pair,
    toml_value,
)
from roles.tools.reference import train_reference


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--rows", type=int, default=200_000, help="synthetic rows")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--shapes", default="1x1,2x2", help="workers x shards, comma-separated")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION__KEY=VALUE",
                        help="a job setting for the cluster's runs, e.g. train__grants_ahead=1")
    args = parser.parse_args()
    settings = {"train__batch_size": args.batch, "train__epochs": args.epochs,
                "data__synthetic__rows": args.rows}
    env = clean_environ()
    env.update({f"ZBUS_{k.upper()}": toml_value(v) for k, v in settings.items()})
    job = load_job(None, environ=env)
    # no checkpoints in the figures (the built-in job takes one every 2 s so that a demo can
    # be resumed): their cost is bench_checkpoint.py's, the reference has none
    cluster_only = {"checkpoint__every_s": 0, **dict(setting_pair(kv) for kv in args.set)}
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    rows, trained = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        for workers, shards in shapes:
            single, cluster, aucs = [], [], []
            for r in range(args.repeats):
                reference = train_reference(job)
                single.append(reference["samples_per_s"])
                trained = reference["samples_trained"] // args.epochs
                workdir = Path(tmp) / f"{workers}x{shards}-{r}"
                with LocalCluster(workdir, transport="tcp", cluster__workers=workers,
                                  cluster__shards=shards, **settings, **cluster_only) as c:
                    if c.run_job(timeout=600) != 0:
                        raise SystemExit(f"cluster run failed:\n{c.logs()}")
                    s = c.summary()
                cluster.append(s["samples_per_s"])
                aucs.append(s["auc"])
                print(f"  {workers}w/{shards}s run {r + 1}: single {single[-1]:,.0f}/s, "
                      f"cluster {cluster[-1]:,.0f}/s, auc {s['auc']:.4f}", flush=True)
            paired = statistics.median(m / o for m, o in zip(cluster, single, strict=True))
            rows.append((workers, shards, statistics.median(single),
                         statistics.median(cluster), paired, statistics.median(aucs)))
    print(f"\nbatch {args.batch}, {trained:,} training rows x {args.epochs} epochs, "
          f"medians of {args.repeats}" + "".join(f", {kv}" for kv in args.set))
    print("| workers/shards | single process (samples/s) | cluster (samples/s) | "
          "ratio of medians | median of paired ratios | cluster AUC |")
    print("|---|---|---|---|---|---|")
    for workers, shards, one, many, paired, auc in rows:
        print(f"| {workers}/{shards} | {one:,.0f} | {many:,.0f} | {many / one:.2f} | "
              f"{paired:.2f} | {auc:.4f} |")


if __name__ == "__main__":
    main()
