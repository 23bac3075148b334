#!/usr/bin/env python
"""Several labels, sample weights and negative down-sampling ([data] labels, weight,
negative_rate): each task of a multi-task job against the same task trained alone, and the
cluster against ``zbus-reference`` (one process, the same network and data), in one run.

Writes ``--rows`` rows of two chained labels (``roles.testbed.two_labels``: click, then
purchase among clicks, with each task's oracle AUC), the last fifth as the eval file. Then, for
each network of ``--networks`` (default ``mlp``, ``shared_bottom``, ``mmoe``, ``ple``,
``esmm``), the job of both labels, and each label alone (``mlp``); every job on a cluster
(every role its own process, 2 workers and 2 shards over loopback TCP) and in one process
(``zbus-reference``). And ESMM's point (Ma et al. 2018): a single-task purchase model trained
on the clicked rows only, evaluated over every impression, against ``esmm``'s purchase
(p(click)·p(purchase | click)). The table: per task, the AUC of each, the difference to the
same task trained alone, samples/s; medians of ``--repeats``.

``--weights``: the click alone with an integer weight column (1 to 3, at random) against the
same rows repeated that many times in the file, unweighted. ``--downsample``: the click alone
with ``negative_rate = 0.1`` against all of its negatives: AUC, calibration (after the
correction) and samples/s. (Both: ``mlp``, cluster and reference.)

    .venv/bin/python scripts/bench_tasks.py [--rows 400000] [--epochs 1] [--repeats 1]
        [--networks mlp,mmoe] [--weights] [--downsample] [--no-tasks]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as csv
from bench_serve import cpu_name  # (scripts/ is the script's own directory)

from roles.job.settings import load_job
from roles.testbed.local_cluster import LocalCluster
from roles.testbed.two_labels import columns, write_two_labels
from roles.tools.reference import train_reference

TASKS = ["click", "purchase"]


def job_file(where: Path, name: str, train: Path, eval_: Path, labels: list[str],
             network: str, epochs: int, data: str = "") -> Path:
    sparse, dense = columns()
    label = f"labels = {labels}" if len(labels) > 1 else f'label = "{labels[0]}"'
    path = where / f"{name}.toml"
    path.write_text((f'name = "{name}"\n[data]\npath = "{train}"\neval_path = "{eval_}"\n'
                     f"{label}\nsparse = {sparse}\ndense = {dense}\n{data}"
                     f'[model]\nnetwork = "{network}"\n'
                     f"[train]\nepochs = {epochs}\nbatch_size = 256\n"
                     f"[cluster]\nworkers = 2\nshards = 2\n"
                     f"[checkpoint]\nevery_s = 0\n").replace("'", '"'))
    return path


def cluster_run(where: Path, job: Path) -> dict:
    with LocalCluster(where, job, transport="tcp") as c:
        if c.run_job(timeout=3600) != 0:
            raise SystemExit(f"{job.name} failed:\n{c.logs()}")
        s = c.summary()
    return {"tasks": s["tasks"], "samples_per_s": s["samples_per_s"]}


def weighted(train: Path, eval_: Path, where: Path, seed: int) -> tuple[Path, Path, Path]:
    """The training rows with a weight column ``w`` (1 to 3 at random), the same rows
    repeated ``w`` times, in order, without it, and the eval rows with ``w`` (1: not used)."""
    table = csv.read_csv(train)
    w = np.random.default_rng(seed).integers(1, 4, table.num_rows)
    with_w, repeated, eval_w = where / "weighted.csv", where / "repeated.csv", \
        where / "eval-w.csv"
    csv.write_csv(table.append_column("w", pa.array(w.astype(np.int64))), with_w)
    csv.write_csv(table.take(pa.array(np.repeat(np.arange(table.num_rows), w))), repeated)
    evals = csv.read_csv(eval_)
    csv.write_csv(evals.append_column("w", pa.array(np.ones(evals.num_rows, np.int64))),
                  eval_w)
    return with_w, repeated, eval_w


def reference_run(job: Path) -> dict:
    r = train_reference(load_job(str(job)))
    return {"tasks": r["tasks"], "samples_per_s": r["samples_per_s"]}


def split(data: Path, where: Path, rows: int) -> tuple[Path, Path, Path]:
    """The training rows, the eval rows (the last fifth) and the clicked training rows."""
    table = csv.read_csv(data)
    cut = int(rows * 0.8)
    train, eval_, clicked = where / "train.csv", where / "eval.csv", where / "clicked.csv"
    csv.write_csv(table.slice(0, cut), train)
    csv.write_csv(table.slice(cut), eval_)
    head = table.slice(0, cut)
    csv.write_csv(head.filter(pc.equal(head["click"], 1)), clicked)
    return train, eval_, clicked


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=400_000)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--networks", default="mlp,shared_bottom,mmoe,ple,esmm")
    ap.add_argument("--weights", action="store_true")
    ap.add_argument("--downsample", action="store_true")
    ap.add_argument("--no-tasks", action="store_true", help="neither the alone nor the "
                    "multi-task jobs")
    args = ap.parse_args()
    print(f"CPU: {cpu_name()}; {args.rows:,} rows, {args.epochs} epoch(s), medians of "
          f"{args.repeats}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-tasks-") as tmp:
        where = Path(tmp)
        oracle = write_two_labels(where / "all.csv", args.rows, seed=5)
        train, eval_, clicked = split(where / "all.csv", where, args.rows)
        print(f"oracle AUC: click {oracle['click']:.4f}, purchase {oracle['purchase']:.4f}",
              flush=True)
        runs: dict[str, list[tuple[str, list[str], Path]]] = {}
        if not args.no_tasks:
            runs["alone"] = [(f"alone-{t}", [t], job_file(where, f"alone-{t}", train, eval_,
                                                          [t], "mlp", args.epochs))
                             for t in TASKS]
            runs["clicked"] = [("clicked-purchase", ["purchase"],
                                job_file(where, "clicked", clicked, eval_, ["purchase"], "mlp",
                                         args.epochs))]
            for net in args.networks.split(","):
                runs[net] = [(net, TASKS, job_file(where, net, train, eval_, TASKS, net,
                                                   args.epochs))]
        if args.weights:
            with_w, repeated, eval_w = weighted(train, eval_, where, 11)
            runs["weights"] = [
                ("weight-column", ["click"], job_file(where, "weight-column", with_w, eval_w,
                                                      ["click"], "mlp", args.epochs,
                                                      'weight = "w"\n')),
                ("rows-repeated", ["click"], job_file(where, "rows-repeated", repeated, eval_,
                                                      ["click"], "mlp", args.epochs))]
        if args.downsample:
            runs["downsample"] = [
                ("all-negatives", ["click"], job_file(where, "all-negatives", train, eval_,
                                                      ["click"], "mlp", args.epochs)),
                ("negative-rate-0.1", ["click"], job_file(where, "negative-rate", train, eval_,
                                                          ["click"], "mlp", args.epochs,
                                                          "negative_rate = 0.1\n"))]
        got: dict[tuple[str, str, str], list[float]] = {}
        calib: dict[tuple[str, str], list[float]] = {}
        speed: dict[tuple[str, str], list[float]] = {}
        for r in range(args.repeats):
            for jobs in runs.values():
                for name, labels, job in jobs:
                    for how in ("cluster", "reference"):
                        out = cluster_run(where / f"{name}-{r}", job) if how == "cluster" \
                            else reference_run(job)
                        speed.setdefault((name, how), []).append(out["samples_per_s"])
                        for t in labels:
                            got.setdefault((name, how, t), []).append(out["tasks"][t]["auc"])
                        calib.setdefault((name, how), []).append(
                            out["tasks"][labels[0]]["calibration"])
                        print(f"  {name} {how}: " + ", ".join(
                            f"{t} {out['tasks'][t]['auc']:.4f}" for t in labels)
                            + f"; {out['samples_per_s']:,.0f} samples/s", flush=True)

    def med(key):
        return statistics.median(got[key])

    def pair(title: str, base: str, other: str) -> None:
        print(f"\n{title}\n\n| job | cluster AUC | reference AUC | cluster calibration | "
              "reference calibration | cluster samples/s | reference samples/s |\n"
              "|---|---|---|---|---|---|---|")
        for name in (base, other):
            print(f"| {name} | " + " | ".join(
                [f"{med((name, h, 'click')):.4f}" for h in ("cluster", "reference")]
                + [f"{statistics.median(calib[(name, h)]):.4f}" for h in ("cluster", "reference")]
                + [f"{statistics.median(speed[(name, h)]):,.0f}" for h in ("cluster", "reference")])
                + " |")
        print("difference: " + ", ".join(
            f"{h} {med((other, h, 'click')) - med((base, h, 'click')):+.4f}"
            for h in ("cluster", "reference")))

    if args.weights:
        pair("Integer weights against the rows repeated:", "rows-repeated", "weight-column")
    if args.downsample:
        pair("Negative down-sampling at 0.1 against every negative:", "all-negatives",
             "negative-rate-0.1")
    if args.no_tasks:
        return
    print("\n| job | task | cluster AUC | vs alone | reference AUC | vs alone | cluster "
          "samples/s | reference samples/s |")
    print("|---|---|---|---|---|---|---|---|")
    for name in [n for group in ("alone", "clicked", *args.networks.split(","))
                 for n, _, _ in runs[group]]:
        for t in TASKS:
            if (name, "cluster", t) not in got:
                continue
            c, ref = med((name, "cluster", t)), med((name, "reference", t))
            ca, ra = med((f"alone-{t}", "cluster", t)), med((f"alone-{t}", "reference", t))
            print(f"| {name} | {t} | {c:.4f} | {c - ca:+.4f} | {ref:.4f} | {ref - ra:+.4f} | "
                  f"{statistics.median(speed[(name, 'cluster')]):,.0f} | "
                  f"{statistics.median(speed[(name, 'reference')]):,.0f} |")
    if "esmm" in runs:
        e = med(("esmm", "cluster", "purchase"))
        k = med(("clicked-purchase", "cluster", "purchase"))
        print(f"\nESMM's purchase over every impression: {e:.4f} against {k:.4f} for a purchase "
              f"model trained on clicked rows only: {e - k:+.4f} (cluster)")


if __name__ == "__main__":
    main()
