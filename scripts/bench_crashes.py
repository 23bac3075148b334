#!/usr/bin/env python
"""What a crash of each role costs, measured: Adult (jobs/adult.toml, 2 epochs, MLP 512-256,
workers slowed 3x so that an epoch lasts seconds) once without a crash and once per role with
that role SIGKILLed in the first epoch (at the first aggregation round 1 s into it), started
again at once where the role can be (control with --resume). The figures are those of the run
with the median wall time of ``--repeats`` runs per case.

    .venv/bin/python scripts/bench_crashes.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import tempfile
from pathlib import Path

from roles.testbed.local_cluster import LocalCluster  # noqa: E402  (the test harness)

REPO = Path(__file__).resolve().parent.parent
SETTINGS = {"train__epochs": 2, "model__hidden": [512, 256], "cluster__node_timeout_s": 3.0,
            "checkpoint__every_s": 1.0}
ROWS = 39074
# role killed, its process name, restarted (argv) or not, extra job settings
CASES = {
    "none": (None, None, {}),
    "worker": ("worker-1", None, {}),
    "aggregator": ("aggregator-0", ["roles.aggregator", "--index", "0"], {}),
    "ps": ("ps-1", ["roles.ps", "--index", "1"], {}),
    "feeder (1 of 2)": ("feeder-1", None, {"cluster__feeders": 2}),
    "feeder (the only one)": ("feeder-0", ["roles.feeder", "--index", "0"], {}),
    "control": ("control-0", ["roles.control", "--resume"], {}),
}


def run(workdir: Path, victim: str | None, restart: list[str] | None, extra: dict) -> dict:
    with LocalCluster(workdir, REPO / "jobs" / "adult.toml", transport="tcp",
                      **SETTINGS, **extra) as c:
        c.start_all(slowdown={0: 3.0, 1: 3.0})
        if victim is not None:
            started = c.wait_for_event(lambda e: e["event"] == "epoch_start")["t"]
            c.wait_for_event(lambda e: e["event"] == "round_done" and e["t"] >= started + 1)
            c.procs[victim].send_signal(signal.SIGKILL)
            c.procs[victim].wait()
            if restart is not None:  # a resumed control keeps its name: the job's control
                name = victim if victim == "control-0" else f"{victim}-again"
                c.start(name, [sys.executable, "-m", *restart])
        c.wait(timeout=600)
        s = c.summary()
        rejoined = sum(e["event"] == "rejoin" for e in c.events())
    parts = s["parts"]   # None: the data was never indexed
    return {"status": s["status"], "reason": s["reason"], "wall_s": s["wall_s"],
            "auc": s["auc"], "samples": s["samples_trained"],
            "by_workers": s["samples_trained_by_workers"],
            "requeued": s["requeued_batches"],
            "refused_updates": s["duplicates_refused"]["embedding_updates"],
            "recovery": (s["recovery"] or s["shard_recoveries"]
                         or (parts and (parts["feeders_lost"] or parts["feeder_recoveries"]))
                         or (f"{rejoined} nodes joined the resumed control" if rejoined
                             else None))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1, help="runs per case (median)")
    parser.add_argument("--cases", default="", help="comma-separated case names to run (and "
                                                    "always none, the baseline)")
    args = parser.parse_args()
    wanted = {"none", *args.cases.split(",")} if args.cases else set(CASES)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, (victim, restart, extra)) in enumerate(CASES.items()):
            if name not in wanted:
                continue
            runs = [run(Path(tmp) / f"case-{i}-{k}", victim, restart, extra)
                    for k in range(args.repeats)]
            median = statistics.median_low(r["wall_s"] for r in runs)
            results[name] = next(r for r in runs if r["wall_s"] == median)
            print(f"  {name}: wall {[r['wall_s'] for r in runs]}; {results[name]}", flush=True)
    base = results["none"]
    print("\n| crash of | outcome | wall s (× no crash) | AUC | samples trained (by the "
          "workers) | cost |")
    print("|---|---|---|---|---|---|")
    for name, r in results.items():
        ratio = r["wall_s"] / base["wall_s"]
        print(f"| {name} | {r['status']}{': ' + r['reason'] if r['reason'] else ''} | "
              f"{r['wall_s']:.1f} ({ratio:.2f}×) | {r['auc'] or 0:.4f} | "
              f"{r['samples']:,} of {2 * ROWS:,} ({r['by_workers']:,}) | requeued "
              f"{r['requeued']}, refused updates {r['refused_updates']}, recovery "
              f"{r['recovery']} |")


if __name__ == "__main__":
    main()
