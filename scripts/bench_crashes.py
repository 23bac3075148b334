#!/usr/bin/env python
"""What a crash of each role costs, measured: Adult (jobs/adult.toml, 2 epochs, MLP 512-256,
workers slowed 3x so that an epoch lasts seconds) once without a crash and once per role with
that role SIGKILLed in the first epoch (at the first aggregation round 1 s into it), started
again at once where the role can be. One run each; the figures are the run's summary.

    .venv/bin/python scripts/bench_crashes.py
"""

from __future__ import annotations

import signal
import sys
import tempfile
from pathlib import Path

from roles.local import LocalCluster

REPO = Path(__file__).resolve().parent.parent
SETTINGS = {"train__epochs": 2, "model__hidden": [512, 256], "cluster__node_timeout_s": 3.0,
            "train__checkpoint_s": 1.0}
ROWS = 39074
# role killed, its process name, restarted (argv) or not, extra job settings
CASES = {
    "none": (None, None, {}),
    "worker": ("worker-1", None, {}),
    "aggregator": ("aggregator-0", ["roles.aggregator", "--index", "0"], {}),
    "ps": ("ps-1", ["roles.ps", "--index", "1"], {}),
    "feeder (1 of 2)": ("feeder-1", None, {"cluster__feeders": 2}),
    "feeder (the only one)": ("feeder-0", None, {}),
    "control": ("control-0", None, {"cluster__orphan_timeout_s": 5.0}),
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
            if restart is not None:
                c.start(f"{victim}-again", [sys.executable, "-m", *restart])
        if victim == "control-0":  # nobody writes a summary: how long until the nodes gave up
            codes = {n: c.wait(n, timeout=120) for n in c.procs if n != "control-0"}
            return {"status": "lost (no control)", "exits": codes}
        c.wait(timeout=600)
        s = c.summary()
    return {"status": s["status"], "reason": s["reason"], "wall_s": s["wall_s"],
            "auc": s["auc"], "samples": s["samples_trained"],
            "requeued": s["requeued_batches"],
            "refused_updates": s["duplicates_refused"]["embedding_updates"],
            "recovery": (s["recovery"] or s["shard_recoveries"]
                         or (s.get("slices") or {}).get("feeders_lost") or None)}


def main() -> None:
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, (victim, restart, extra)) in enumerate(CASES.items()):
            results[name] = run(Path(tmp) / f"case-{i}", victim, restart, extra)
            print(f"  {name}: {results[name]}", flush=True)
    base = results["none"]
    print("\n| crash of | outcome | wall s (× no crash) | AUC | samples trained | cost |")
    print("|---|---|---|---|---|---|")
    for name, r in results.items():
        if "wall_s" not in r:
            print(f"| {name} | {r['status']} | | | | every node exited: {r['exits']} |")
            continue
        ratio = r["wall_s"] / base["wall_s"]
        print(f"| {name} | {r['status']}{': ' + r['reason'] if r['reason'] else ''} | "
              f"{r['wall_s']:.1f} ({ratio:.2f}×) | {r['auc'] or 0:.4f} | "
              f"{r['samples']:,} of {2 * ROWS:,} | requeued {r['requeued']}, refused "
              f"updates {r['refused_updates']}, recovery {r['recovery']} |")


if __name__ == "__main__":
    main()
