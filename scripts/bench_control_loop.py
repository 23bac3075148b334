#!/usr/bin/env python
"""Control's loop while skew-aware placement runs 2,000 allocation windows, in one run.

A real control process and stand-in nodes (``scripts/sim_nodes.py --windows``: 1 feeder,
1 aggregator, 4 shards, 4 workers, heartbeating every 0.25 s) on loopback. The stand-in feeder
closes ``--windows`` windows of Zipf-skewed keys at ``--rate`` a second (several per heartbeat),
answers every new key map; the stand-in shards report every window's work (shard i is i + 1
times slower per pair) until control has recorded it. Control merges the counts, predicts the
capacities (the predictor trained in a child process over the newest ``history_windows`` windows),
places and migrates, as in a job. Measured: control's longest loop turn (``longest_turn_s``:
the longest it went without polling its sockets), against a baseline measured in the same run:
the same stand-in cluster for as long with placement ``hash`` (no windows). Then, in this
process, what the code before would have stalled the loop for at the end of such a job: one
retraining (a fifth of ``predictor_steps``) on the whole history, against one on the bounded
history (the newest ``history_windows`` windows).

    .venv/bin/python scripts/bench_control_loop.py [--windows 2000] [--rate 20]
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

from roles.algorithms.control.capacity import CapacityPredictor, read_records  # noqa: E402
from roles.testbed.local_cluster import LocalCluster  # noqa: E402  (the test harness)

REPO = Path(__file__).resolve().parent.parent
SETTINGS = {"cluster__shards": 4, "cluster__workers": 4, "cluster__heartbeat_s": 0.25,
            "train__stall_timeout_s": 36_000,
            "checkpoint__every_s": 0}  # none (the built-in job's every 2 s): bench_checkpoint


def run(workdir: Path, mode: str, windows: int, rate: float, seconds: float | None) -> dict:
    """One control with stand-in nodes; returns control's summary figures."""
    c = LocalCluster(workdir, None, "ipc", placement__mode=mode, **SETTINGS)
    try:
        c.start_role("control")
        argv = [sys.executable, str(REPO / "scripts" / "sim_nodes.py")]
        if windows:
            argv += ["--windows", str(windows), "--window-rate", str(rate)]
        c.start("sim", argv)
        started = time.monotonic()
        deadline = started + (seconds or windows / rate * 4 + 120)
        while time.monotonic() < deadline:
            time.sleep(1.0)
            if c.procs["control-0"].poll() is not None:
                raise SystemExit("control ended early:\n" + c.log("control-0")[-3000:])
            if windows and sum(1 for e in c.events() if e["event"] == "placement_window") \
                    >= windows:
                break
        elapsed = time.monotonic() - started
        c.procs["control-0"].send_signal(signal.SIGTERM)
        c.wait("control-0", timeout=60)
        s = c.summary()
        placed = [e for e in c.events() if e["event"] == "placement_window"]
        return {"elapsed": elapsed, "turn": s["longest_turn_s"]["control-0"],
                "windows": len(placed), "placement": s["placement"],
                "records": c.run_dir / "placement"}
    finally:
        c.close()


def retrain_s(records: list, repeats: int = 3) -> float:
    """One retraining (a fifth of the default 300 steps, from trained weights), median s."""
    p = CapacityPredictor(4)
    p.fit(records[-512:], steps=20)
    times = []
    for _ in range(repeats):
        twin = p.copy()
        started = time.perf_counter()
        twin.fit(records, steps=60)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=2000)
    parser.add_argument("--rate", type=float, default=20.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        skew = run(Path(tmp) / "skew", "skew", args.windows, args.rate, None)
        base = run(Path(tmp) / "hash", "hash", 0, args.rate, skew["elapsed"])
        records = read_records(skew["records"])
        history = 256
        kept = [r for r in records if r.window > max(r.window for r in records) - history]
        whole_s, kept_s = retrain_s(records), retrain_s(kept)
    p = skew["placement"]
    print(f"{skew['windows']} windows closed in {skew['elapsed']:.0f} s "
          f"({skew['windows'] / skew['elapsed']:.1f}/s, heartbeats every 0.25 s); "
          f"{p['records']} records, {p['predictor_fits']} trainings in a child process "
          f"(the last {p['predictor_fit_s_last']:.3f} s), {p['migrations']} migrations")
    print()
    print("| control | longest loop turn (ms) | ÷ baseline |")
    print("|---|---|---|")
    print(f"| no placement, stand-in nodes only (baseline, {base['elapsed']:.0f} s) | "
          f"{base['turn'] * 1000:.1f} | 1.00 |")
    print(f"| skew placement, {skew['windows']} windows | {skew['turn'] * 1000:.1f} | "
          f"{skew['turn'] / base['turn']:.2f} |")
    print()
    print(f"one retraining in the loop (the code before) on the whole history of "
          f"{len(records)} records: {whole_s * 1000:.0f} ms; on the newest {history} "
          f"windows ({len(kept)} records): {kept_s * 1000:.0f} ms "
          f"(ratio {whole_s / kept_s:.1f})")
    target = 0.050
    print(f"target: longest turn <= {target * 1000:.0f} ms: "
          f"{'met' if skew['turn'] <= target else 'NOT met'}")


if __name__ == "__main__":
    main()
