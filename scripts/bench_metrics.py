#!/usr/bin/env python
"""What the metrics production watches cost (issue #55: at most 2 % of throughput): a
two-label job's AUC, log loss, NE, calibration and GAUC per task, against the job that runs
them, in one run.

Writes ``--rows`` rows of two chained labels (``roles.testbed.two_labels``; the last fifth the
eval file), then runs the ``mmoe`` job of both labels on a cluster (every role its own process,
2 workers and 2 shards over loopback TCP) ``--repeats`` times with ``[metrics] group_by =
"c0"`` (every metric, the GAUC too) and as many times without (no GAUC: the histogram figures
cannot be switched off), alternating. In the same process, the metric code alone on scores of
the same shapes: a feeder's ``TaskScores.add`` and ``GroupScores.add`` over every eval batch of
every epoch, control's merge and figures, and a stream feeder's progressive validation
(``Progressive.add``, per training batch). Prints medians: the jobs' samples/s and seconds, the
metric code's seconds, and each as a share of the job's time (eval metrics: their seconds over
the job's end to end; progressive: its time per event times the job's samples/s).

    .venv/bin/python scripts/bench_metrics.py [--rows 400000] [--epochs 1] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from bench_serve import cpu_name  # (scripts/ is the script's own directory)
from bench_tasks import TASKS, job_file, split

from roles.algorithms.shared.grouped import GroupScores
from roles.algorithms.shared.metrics import TaskScores
from roles.algorithms.shared.progressive import Progressive
from roles.job.settings import load_job
from roles.testbed.local_cluster import LocalCluster
from roles.testbed.two_labels import write_two_labels


def cluster_run(where: Path, job: Path) -> dict:
    with LocalCluster(where, job, transport="tcp") as c:
        started = time.perf_counter()
        if c.run_job(timeout=3600) != 0:
            raise SystemExit(f"{job.name} failed:\n{c.logs()}")
        seconds = time.perf_counter() - started
        s = c.summary()
    return {"samples_per_s": s["samples_per_s"], "seconds": seconds,
            "eval_samples": s["eval_samples"], "epochs": len(s["per_epoch"]),
            "gauc": s["tasks"]["click"]["gauc"], "auc": s["tasks"]["click"]["auc"]}


def metric_code(rows: int, epochs: int, eval_batch: int, groups: int, cap: int,
                seed: int) -> dict[str, float]:
    """Seconds of the eval metrics over ``rows`` eval rows each epoch (a feeder's adds,
    control's merge and figures), and of progressive validation per event."""
    rng = np.random.default_rng(seed)
    labels = (rng.random((rows, len(TASKS))) < [0.2, 0.03]).astype(np.float32)
    probs = rng.random((rows, len(TASKS))).astype(np.float32)
    keys = rng.integers(0, groups, rows).astype(np.int64) * 7919
    started = time.perf_counter()
    for _ in range(epochs):
        scores, grouped = TaskScores(len(TASKS)), GroupScores(len(TASKS), cap)
        for lo in range(0, rows, eval_batch):
            hi = min(rows, lo + eval_batch)
            scores.add(labels[lo:hi], probs[lo:hi])
            grouped.add(keys[lo:hi], labels[lo:hi], probs[lo:hi])
        merged, all_groups = TaskScores(len(TASKS)), GroupScores(len(TASKS), 0)
        merged.merge(TaskScores.of(scores.counts(), scores.loss_sums(), scores.prob_sums(),
                                   scores.rows))
        g, lab, p = grouped.rows()
        all_groups.merge(GroupScores.of(len(TASKS), 0, grouped.level, g, lab, p))
        merged.record(TASKS, all_groups)
    eval_s = time.perf_counter() - started
    progressive, batch, events = Progressive(10_000), 256, 200_000
    times = np.arange(batch, dtype=np.float64)
    started = time.perf_counter()
    for lo in range(0, events, batch):
        at = lo % (rows - batch)   # (the eval rows' labels and scores again, a batch a time)
        progressive.add(labels[at:at + batch, 0], probs[at:at + batch, 0], times)
    per_event = (time.perf_counter() - started) / events
    return {"eval_s": eval_s, "progressive_s_per_event": per_event}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=400_000)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    print(f"CPU: {cpu_name()}; {args.rows:,} rows, {args.epochs} epoch(s), medians of "
          f"{args.repeats}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-metrics-") as tmp:
        where = Path(tmp)
        write_two_labels(where / "all.csv", args.rows, seed=5)
        train, eval_, _ = split(where / "all.csv", where, args.rows)
        jobs = {"every metric (group_by c0)": job_file(
                    where, "gauc", train, eval_, TASKS, "mmoe", args.epochs)
                .read_text().replace("[model]", '[metrics]\ngroup_by = "c0"\n[model]'),
                "no GAUC": job_file(where, "plain", train, eval_, TASKS, "mmoe",
                                    args.epochs).read_text()}
        paths = {}
        for name, text in jobs.items():
            paths[name] = where / f"{name.split()[0]}.toml"
            paths[name].write_text(text)
        job = load_job(str(paths["every metric (group_by c0)"]))
        runs: dict[str, list[dict]] = {name: [] for name in jobs}
        code: list[dict[str, float]] = []
        for r in range(args.repeats):
            for name, path in paths.items():
                out = cluster_run(where / f"{path.stem}-{r}", path)
                runs[name].append(out)
                print(f"  {name}: {out['samples_per_s']:,.0f} samples/s, "
                      f"{out['seconds']:.1f} s, AUC {out['auc']:.4f}, GAUC {out['gauc']}",
                      flush=True)
            first = runs["every metric (group_by c0)"][0]
            code.append(metric_code(first["eval_samples"], first["epochs"],
                                    job.train.eval_batch, groups=2000,
                                    cap=job.metrics.group_rows, seed=r))

    def med(values: list[float]) -> float:
        return statistics.median(values)

    print("\n| job | samples/s | end to end (s) |\n|---|---|---|")
    for name, outs in runs.items():
        print(f"| {name} | {med([o['samples_per_s'] for o in outs]):,.0f} | "
              f"{med([o['seconds'] for o in outs]):.1f} |")
    full = runs["every metric (group_by c0)"]
    seconds = med([o["seconds"] for o in full])
    rate = med([o["samples_per_s"] for o in full])
    eval_s = med([c["eval_s"] for c in code])
    per_event = med([c["progressive_s_per_event"] for c in code])
    print(f"\neval metrics (every task's five figures and GAUC over {full[0]['eval_samples']:,} "
          f"rows x {full[0]['epochs']} epoch(s)): {eval_s:.3f} s, {100 * eval_s / seconds:.2f} % "
          f"of the job's {seconds:.1f} s")
    print(f"progressive validation: {per_event * 1e9:.0f} ns an event, "
          f"{100 * per_event * rate:.2f} % of an event's time at the job's {rate:,.0f} "
          "samples/s")
    plain = med([o["samples_per_s"] for o in runs["no GAUC"]])
    print(f"samples/s with every metric over without the GAUC: {rate / plain:.3f}")


if __name__ == "__main__":
    main()
